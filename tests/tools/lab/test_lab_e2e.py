"""The retry lab end to end: findings provoked by bad peers, and the reference Client recovering.

Findings: a real proxy process judges a scripted bad Agent (tests/support/peers/raw_agent.py) and a bad
raw Client (the test), and reports over its control API. Recovery: the reference Client, through
the proxy with each fault action, ends with every submission confirmed and inserted once.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT, ProxyProcess, fault_file, raw_agent, request, say

from proxy.control import ControlClient
from proxy.tools.lab.client import ClientOptions, run_client

pytestmark = pytest.mark.slow

AGENT = (sys.executable, "-m", "proxy", "agent", "--turn-ms", "20")
PROXY = (sys.executable, "-m", "proxy", "run")


def prompt(request_id: object, text: str, key: Any = None, session: str = "S") -> bytes:
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return request(request_id, "session/prompt", params)


async def findings_of(proxy: ProxyProcess) -> list[str]:
    url = (await proxy.logged("control API listening"))["url"]
    control = ControlClient(url)
    found = await asyncio.to_thread(control.findings)
    return sorted(finding["check"] for finding in found)


async def judged(
    tmp_path: Path, *rules: dict[str, Any], agent_flags: tuple[str, ...] = ()
) -> ProxyProcess:
    return await ProxyProcess.start(
        raw_agent(tmp_path / "agent-saw.jsonl", *agent_flags),
        "--log-format",
        "json",
        "--admin",
        "127.0.0.1:0",
        "--faults",
        str(fault_file(tmp_path, *rules, seed=3)),
    )


async def test_an_agent_that_accepts_invalid_keys_and_echoes_keys_is_found_out(
    tmp_path: Path,
) -> None:
    """invalid_key_accepted and key_echoed, from a bad Agent's real answers and updates."""
    proxy = await judged(tmp_path)
    try:
        await proxy.send(prompt(1, "A", ""), prompt(2, "B", "secret-key-1"))
        await proxy.recv_json()
        await proxy.recv_json()
        update = json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "S",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": "secret-key-1"},
                    },
                },
            }
        ).encode()
        await proxy.send(say(update))
        await proxy.recv()
        assert await findings_of(proxy) == ["invalid_key_accepted", "key_echoed"]
    finally:
        await proxy.stop()


async def test_a_client_that_reuses_a_key_or_resends_without_one_is_found_out(
    tmp_path: Path,
) -> None:
    """key_reused_other_prompt, and unkeyed_resend after a lost answer."""
    lose = {
        "name": "lose",
        "when": {"kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [2]},
        "do": {"action": "drop"},
    }
    proxy = await judged(tmp_path, lose)
    try:
        await proxy.send(prompt(1, "A", "K1"))
        await proxy.recv_json()
        await proxy.send(prompt(2, "unkeyed"))  # its answer is lost
        await proxy.logged("fault injected")
        await proxy.send(prompt(3, "B", "K1"), prompt(4, "unkeyed"))
        assert (await proxy.recv_json())["id"] == 3
        assert (await proxy.recv_json())["id"] == 4
        assert await findings_of(proxy) == ["key_reused_other_prompt", "unkeyed_resend"]
    finally:
        await proxy.stop()


async def test_an_agent_that_ignores_keys_is_a_duplicate_insert(tmp_path: Path) -> None:
    """duplicate_insert: a lost answer, the same key resent, a second message inserted."""
    lose = {
        "name": "lose",
        "when": {"kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "drop"},
    }
    proxy = await ProxyProcess.start(
        [*AGENT, "--no-dedupe"],
        "--log-format",
        "json",
        "--admin",
        "127.0.0.1:0",
        "--faults",
        str(fault_file(tmp_path, lose, seed=3)),
    )
    try:
        await proxy.send(
            request(0, "initialize", {"protocolVersion": 2}),
            request(1, "session/new", {"cwd": "/"}),
        )
        session = ""
        while not session:
            message = await proxy.recv_json()
            if message.get("id") == 1:
                session = message["result"]["sessionId"]
        await proxy.send(prompt(2, "A", "K1", session))
        await proxy.logged("fault injected")
        await proxy.send(prompt(3, "A", "K1", session))
        while (await proxy.recv_json()).get("id") != 3:
            pass
        assert await findings_of(proxy) == ["duplicate_insert"]
    finally:
        await proxy.stop()


def followed(argv: tuple[str, ...], trace: Path, prompts: tuple[str, ...]) -> ClientOptions:
    """The reference Client spawning ``argv`` (a proxy writing ``trace``) and following the
    trace: it resends what the proxy lost at once and waits for every other answer, and for
    what it spawns to start and stop (the harness's bound), so a busy machine changes nothing
    it does."""
    return ClientOptions(
        agent_argv=argv,
        prompts=prompts,
        follow_trace=trace,
        answer_timeout=TIMEOUT,
        setup_timeout=TIMEOUT,
        grace=TIMEOUT,
    )


async def test_a_clean_run_has_no_finding(tmp_path: Path) -> None:
    """The reference Client and Agent through the proxy: zero findings."""
    proxy_state = tmp_path / "findings.json"
    trace = tmp_path / "trace.jsonl"
    argv = (*PROXY, "--trace", str(trace), "--state", str(proxy_state), "--", *AGENT)
    report = await run_client(followed(argv, trace, prompts=("a", "b")))
    assert report.ok
    state = json.loads(proxy_state.read_text())
    assert state["ledger"]["findings"] == []
    assert [entry["message_ids"] for entry in state["ledger"]["entries"]] == [
        [submission.message_id] for submission in report.submissions
    ]


ACTIONS: dict[str, dict[str, Any]] = {
    "drop": {
        "when": {"kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "drop"},
    },
    "delay": {
        "when": {"direction": "to_client"},
        "do": {"action": "delay", "ms": 30},  # no jitter: equal delays keep the order
    },
    "error": {
        "when": {"method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "error", "code": -32603},
    },
    "duplicate": {
        "when": {"kind": "request", "method": "session/prompt"},
        "do": {"action": "duplicate", "gap_ms": 5},
    },
    "sever": {
        "when": {"kind": "request", "method": "session/prompt"},
        "schedule": {"nth": [2]},
        "do": {"action": "sever", "side": "client", "moment": "after"},
    },
    "kill_agent": {
        "when": {"kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "kill_agent", "respawn": True},
    },
    "restart_proxy": {
        "when": {"kind": "request", "method": "session/prompt"},
        "schedule": {"nth": [2]},
        "do": {"action": "restart_proxy", "downtime_ms": 100},
    },
    "corrupt": {
        "when": {"direction": "to_client", "kind": "notification"},
        "schedule": {"every": 4},
        "do": {"action": "corrupt", "mode": "garbage"},
    },
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_the_reference_client_recovers_from_every_fault_action(
    tmp_path: Path, action: str
) -> None:
    """Through each action, every submission is confirmed and in the session exactly once."""
    rule = {"name": action, **ACTIONS[action]}
    faults = fault_file(tmp_path, rule, seed=3)
    trace = tmp_path / "trace.jsonl"
    argv = (
        *PROXY,
        "--trace",
        str(trace),
        "--faults",
        str(faults),
        "--state",
        str(tmp_path / "proxy-state.json"),
        "--",
        *AGENT,
        "--store",
        str(tmp_path / "store"),
    )
    async with asyncio.timeout(TIMEOUT * 2):
        report = await run_client(followed(argv, trace, prompts=("one", "two", "three")))
    assert report.ok, report.to_json()
    assert report.duplicates == 0
    assert report.history is not None
    assert len(report.history) == 3


KEY_IGNORED: dict[str, dict[str, Any]] = {
    "drop": {
        "when": {"kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "drop"},
    },
    "duplicate": {
        "when": {"kind": "request", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "duplicate", "gap_ms": 5},
    },
}


@pytest.mark.parametrize("action", sorted(KEY_IGNORED))
async def test_the_reference_clients_verdict_agrees_with_the_ledger(
    tmp_path: Path, action: str
) -> None:
    """An Agent that ignores keys inserts the first prompt twice (a retry after a lost answer, or
    a replayed copy): the Client and the ledger name the same key, the Client exits 1."""
    state = tmp_path / "proxy-state.json"
    faults = fault_file(tmp_path, {"name": action, **KEY_IGNORED[action]}, seed=3)
    trace = tmp_path / "trace.jsonl"
    argv = (*PROXY, "--trace", str(trace), "--faults", str(faults), "--state", str(state))
    async with asyncio.timeout(TIMEOUT * 2):
        report = await run_client(
            followed((*argv, "--", *AGENT, "--no-dedupe"), trace, prompts=("one", "two"))
        )
    first, second = report.submissions
    assert (report.duplicates, report.exit_status) == (1, 1)
    assert len(first.message_ids) == 2
    assert second.message_ids == [second.message_id]
    findings = json.loads(state.read_text())["ledger"]["findings"]
    assert [(f["check"], f["key"]) for f in findings] == [("duplicate_insert", first.key)]


async def test_a_cancel_answered_unevenly_is_found_out(tmp_path: Path) -> None:
    """cancel_incomplete: after $/cancel_request, one request of the key got -32800, one a success."""
    proxy = await judged(tmp_path, agent_flags=("--no-answer", "session/prompt"))
    try:
        await proxy.send(prompt(10, "D", "K4"), prompt(11, "D", "K4"))
        await proxy.send(request(99, "_test/barrier"))
        assert (await proxy.recv_json())["id"] == 99  # the Agent holds both prompts, unanswered
        await proxy.send(notification_cancel(10))
        cancelled = (
            b'{"jsonrpc":"2.0","id":0,"error":{"code":-32800,"message":"Request cancelled"}}'
        )
        answered = b'{"jsonrpc":"2.0","id":1,"result":{"messageId":"M4"}}'
        await proxy.send(say(cancelled, answered))  # the bad Agent answers the two unalike
        assert (await proxy.recv_json())["id"] in (10, 11)
        assert (await proxy.recv_json())["id"] in (10, 11)
        assert await findings_of(proxy) == ["cancel_incomplete"]
    finally:
        await proxy.stop()


def notification_cancel(request_id: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request_id}}
    ).encode()
