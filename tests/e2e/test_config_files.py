"""The ready fault files in ``config/``: each validates, and each does what its comment says.

Every file in ``config/`` must have an exercise in :data:`EXERCISES`, keyed by its file name: a
real proxy run with ``--faults config/FILE`` between real peers (the SDK Agent or the scripted raw
Agent; the test as raw Client, or the SDK Client), showing the effect the file's comment
describes. A new file without an exercise fails :func:`test_config_file_does_what_its_comment_says`
(the parameters are the directory listing), and an exercise whose file is gone fails
:func:`test_every_exercise_has_its_file`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from harness import (
    TIMEOUT,
    ProxyProcess,
    Start,
    captured,
    log_events,
    notification,
    raw_agent,
    request,
    say,
)
from peers.sdk_remote_client import open_session, sdk_prompt, sdk_state
from stdio_scenario import (
    SWALLOWED,
    SdkClient,
    agent_state,
    answer_to,
    barrier,
    check_corrupted,
    chunk_texts,
    faults_of,
    initialize,
    is_answer,
    new_session,
    prompt_request,
    sdk_agent_session,
    sdk_client_session,
    until_logged,
    with_id,
)

CONFIG = Path(__file__).parents[2] / "config"
CONFIG_FILES = sorted(path.name for path in CONFIG.iterdir() if path.is_file())

Exercise = Callable[[Path, Start, Path], Awaitable[None]]
"""Shows one config file's effect: (the file, a proxy starter, a scratch directory)."""


async def rest_of_stdout(proxy: ProxyProcess) -> list[Any]:
    """Every message the proxy still writes until its stdout ends, parsed."""
    assert proxy.process.stdout is not None
    data = await asyncio.wait_for(proxy.process.stdout.read(), TIMEOUT)
    return [json.loads(line) for line in data.splitlines()]


# -- the exercises -------------------------------------------------------------------------------


async def agent_dies_with_prompt_pending(config: Path, start: Start, tmp_path: Path) -> None:
    """The 1st keyed prompt kills the SDK Agent: exit 137, no answer; with --state, only once."""
    state = tmp_path / "state.json"
    proxy, session = await sdk_agent_session(start, config, "--state", str(state))
    await proxy.send(prompt_request("plain", session, "echo unkeyed"))  # not keyed: no fault
    _, before = await answer_to(proxy, "plain")
    assert chunk_texts(before) == ["unkeyed"]

    await proxy.send(prompt_request("keyed", session, "wait", key="k-1"))
    rest = await rest_of_stdout(proxy)
    assert all(message.get("method") == "session/update" for message in rest)  # no answer
    assert set(chunk_texts(rest)) <= {"waiting"}  # at most the Agent's first word
    assert await proxy.wait() == 128 + signal.SIGKILL
    assert len(faults_of(proxy.stderr, "kill-agent-after-first-keyed-prompt")) == 1

    # The Client starts its agent again (with the same state file) and resends with the key.
    again, session = await sdk_agent_session(start, config, "--state", str(state))
    await again.send(prompt_request("retry", session, "echo retried", key="k-1"))
    answer, before = await answer_to(again, "retry")
    assert answer["result"]["stopReason"] == "end_turn"
    assert chunk_texts(before) == ["retried"]
    await again.close_stdin()
    assert await again.wait() == 0
    assert faults_of(again.stderr, "kill-agent-after-first-keyed-prompt") == []


async def agent_restarts_with_prompt_pending(config: Path, start: Start, tmp_path: Path) -> None:
    """The 1st keyed prompt kills the Agent, a fresh one is started; the pipe stays open."""
    proxy, session = await sdk_agent_session(start, config)
    old = await agent_state(proxy, "state-1")
    await proxy.send(prompt_request("p1", session, "wait", key="k-1"))
    await until_logged(proxy, "restarting")

    seen: list[Any] = []
    await proxy.send(request("state-2", "_sdk_agent/state", {}))
    answer, before = await answer_to(proxy, "state-2")
    seen += before
    new = answer["result"]
    assert new["pid"] != old["pid"]
    assert [method for _, method in new["requests"]] == ["_sdk_agent/state"]  # uninitialised

    # What a conforming Client does: initialize, open the session again, resend with the key.
    await initialize(proxy, "init-2")
    session = await new_session(proxy, "new-2")
    await proxy.send(prompt_request("p2", session, "echo retried", key="k-1"))
    answer, before = await answer_to(proxy, "p2")
    seen += before
    assert chunk_texts(before) == ["retried"]
    assert not any(is_answer(message, "p1") for message in seen)
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert len(faults_of(proxy.stderr, "kill-and-respawn-agent-after-first-keyed-prompt")) == 1
    assert [r["what"] for r in log_events(proxy.stderr, "restarting")] == ["agent"]


async def duplicate_every_keyed_prompt(config: Path, start: Start, tmp_path: Path) -> None:
    """Each keyed prompt reaches the SDK Agent twice under two ids; the Client gets one answer."""
    proxy, session = await sdk_agent_session(start, config)
    seen: list[Any] = []
    for n, key in enumerate(("key-1", "key-2"), start=1):
        await proxy.send(prompt_request(f"k{n}", session, f"echo dup {n}", key=key))
        answer, before = await answer_to(proxy, f"k{n}")
        assert answer["result"]["stopReason"] == "end_turn"
        seen += before
        await until_logged(proxy, SWALLOWED, n)
    await proxy.send(prompt_request("u", session, "echo single"))  # not keyed: sent once
    _, before = await answer_to(proxy, "u")
    seen += before
    state = await agent_state(proxy, "state")

    prompts = state["prompts"]
    assert [(p["text"], p["idempotencyKey"]) for p in prompts] == [
        ("echo dup 1", "key-1"),
        ("echo dup 1", "key-1"),
        ("echo dup 2", "key-2"),
        ("echo dup 2", "key-2"),
        ("echo single", None),
    ]
    assert len({p["id"] for p in prompts}) == 5
    assert sorted(chunk_texts(seen)) == ["dup 1", "dup 1", "dup 2", "dup 2", "single"]
    assert not any(is_answer(m, "k1") or is_answer(m, "k2") for m in seen)  # no second answer
    assert len(faults_of(proxy.stderr, "duplicate-keyed-prompts")) == 2


async def garbage_from_agent(config: Path, start: Start, tmp_path: Path) -> None:
    """The 3rd session/update becomes invalid UTF-8, every 5th message garbage."""
    capture = tmp_path / "agent-saw.jsonl"
    proxy = await start(raw_agent(capture), "--faults", str(config))
    updates = [
        notification(
            "session/update",
            {
                "sessionId": "S",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"chunk {n}"},
                },
            },
        )
        for n in range(1, 13)
    ]
    await proxy.send(say(*updates))
    got = [await proxy.recv() for _ in updates]
    # Rule 1 takes the 3rd update; rule 2 counts every message to the Client, that one too:
    # its 5th and 10th matches are the 5th and 10th updates.
    for n, (sent, received) in enumerate(zip(updates, got, strict=True), start=1):
        if n == 3:
            check_corrupted("invalid_utf8", sent, received)
        elif n in (5, 10):
            check_corrupted("garbage", sent, received)
        else:
            assert received == sent, n
    assert await barrier(proxy, "b") == []
    assert len(faults_of(proxy.stderr, "invalid-utf8-third-update")) == 1
    assert len(faults_of(proxy.stderr, "garbage-every-fifth")) == 2


async def lose_first_prompt_response(config: Path, start: Start, tmp_path: Path) -> None:
    """The 1st keyed prompt's answer is lost though the Agent ran it; the keyed retry's arrives."""
    proxy, session = await sdk_agent_session(start, config)
    await proxy.send(prompt_request("plain", session, "echo unkeyed"))  # not keyed: answered
    _, before = await answer_to(proxy, "plain")
    assert chunk_texts(before) == ["unkeyed"]

    await proxy.send(prompt_request("k1", session, "echo first", key="key-1"))
    chunk = await proxy.recv_json()
    assert chunk_texts([chunk]) == ["first"]  # the Agent acted on it
    await proxy.send(prompt_request("k2", session, "echo retry", key="key-1"))
    answer, before = await answer_to(proxy, "k2")
    assert answer["result"]["stopReason"] == "end_turn"
    assert chunk_texts(before) == ["retry"]  # and no answer to k1 before k2's
    state = await agent_state(proxy, "state")
    assert [(p["text"], p["idempotencyKey"]) for p in state["prompts"]] == [
        ("echo unkeyed", None),
        ("echo first", "key-1"),
        ("echo retry", "key-1"),
    ]
    assert len(faults_of(proxy.stderr, "lose-first-keyed-prompt-response")) == 1


async def proxy_restart_between_request_and_response(
    config: Path, start: Start, tmp_path: Path
) -> None:
    """A restart after the 1st keyed prompt: no answer, a fresh Agent next, ids keep counting."""
    proxy, session = await sdk_agent_session(start, config)
    old = await agent_state(proxy, "state-1")
    await proxy.send(prompt_request("p", session, "wait", key="key-1"))
    await proxy.send(request("state-2", "_sdk_agent/state", {}))  # waits out the downtime
    answer, seen = await answer_to(proxy, "state-2")
    new = answer["result"]
    assert new["pid"] != old["pid"]
    last_old_id = old["requests"][-1][0]
    # The prompt took the next id on the old Agent; the fresh one gets the one after.
    assert new["requests"] == [[last_old_id + 2, "_sdk_agent/state"]]

    await initialize(proxy, "init-2")
    session = await new_session(proxy, "new-2")
    await proxy.send(prompt_request("p2", session, "echo resent", key="key-1"))
    answer, before = await answer_to(proxy, "p2")
    assert chunk_texts(before) == ["resent"]
    assert not any(is_answer(message, "p") for message in seen + before)
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert len(faults_of(proxy.stderr, "restart-after-first-keyed-prompt")) == 1
    assert [r["what"] for r in log_events(proxy.stderr, "restarting")] == ["proxy"]


async def sever_client_after_keyed_prompt(config: Path, start: Start, tmp_path: Path) -> None:
    """The 1st keyed prompt reaches the Agent, then the Client's stdout ends and the proxy exits."""
    capture = tmp_path / "agent-saw.jsonl"
    proxy = await start(raw_agent(capture), "--faults", str(config))
    plain = prompt_request(1, "S", "unkeyed")
    keyed = prompt_request(2, "S", "keyed", key="key-1")
    await proxy.send(plain)
    assert (await proxy.recv_json())["id"] == 1
    await proxy.send(keyed)
    assert await proxy.at_eof()
    assert await proxy.wait() == 0
    assert captured(capture) == [with_id(plain, 1, 0), with_id(keyed, 2, 1)]
    assert len(faults_of(proxy.stderr, "sever-client-after-first-keyed-prompt")) == 1
    assert len(log_events(proxy.stderr, "message for a closed peer dropped")) == 1


async def slow_network(config: Path, start: Start, tmp_path: Path) -> None:
    """Every message both ways is delayed, and everything still arrives (SDK on both sides)."""
    client = SdkClient()
    texts = ["one", "two", "three"]
    async with sdk_client_session(client, "--faults", str(config)) as (conn, _, stderr):
        session = await open_session(conn)
        for text in texts:
            assert await sdk_prompt(conn, session, f"echo {text}") == "end_turn"
        # A chunk may be overtaken by its prompt's answer; it still arrives.
        await client.until(lambda: sorted(client.texts()) == sorted(texts))
        state = await sdk_state(conn)
    assert [p["text"] for p in state["prompts"]] == [f"echo {text}" for text in texts]
    # Every message the SDK Client sent or received went through the rule.
    assert len(faults_of(stderr.stderr, "slow-everything")) == len(client.wire)


EXERCISES: dict[str, Exercise] = {
    "agent-dies-with-prompt-pending.yaml": agent_dies_with_prompt_pending,
    "agent-restarts-with-prompt-pending.yaml": agent_restarts_with_prompt_pending,
    "duplicate-every-keyed-prompt.yaml": duplicate_every_keyed_prompt,
    "garbage-from-agent.yaml": garbage_from_agent,
    "lose-first-prompt-response.yaml": lose_first_prompt_response,
    "proxy-restart-between-request-and-response.yaml": proxy_restart_between_request_and_response,
    "sever-client-after-keyed-prompt.yaml": sever_client_after_keyed_prompt,
    "slow-network.yaml": slow_network,
}


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_file_validates(name: str) -> None:
    """`acp-proxy validate config/FILE` accepts the file without a note (no old name), and the
    file opens with its comment."""
    path = CONFIG / name
    assert path.read_text(encoding="utf-8").startswith("# ")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: "), result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("name", CONFIG_FILES)
async def test_config_file_does_what_its_comment_says(
    name: str, start: Start, tmp_path: Path
) -> None:
    """Each config file, run end to end, shows the effect its comment describes."""
    exercise = EXERCISES.get(name)
    assert exercise is not None, f"config/{name} has no exercise: add one to EXERCISES"
    await exercise(CONFIG / name, start, tmp_path)


def test_every_exercise_has_its_file() -> None:
    """The exercises and the files of config/ are the same set."""
    assert set(EXERCISES) == set(CONFIG_FILES)
