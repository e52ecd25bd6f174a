"""Every stdio fault action end to end: a real proxy process between real Client and Agent peers.

Each test writes a fault file into ``tmp_path``, starts ``python -m proxy run --faults FILE`` and
checks what *each* side saw: the Client through the proxy's stdout (the test itself as a raw
Client, or the official ACP SDK's Client in-process), the Agent through its own record (the
scripted raw Agent's capture file, or the SDK Agent's ``_sdk_agent/state``). The proxy's log
(``--log-format json`` on stderr) is read for the ``fault injected`` lines.

Nothing waits by sleeping: a "never arrives" is shown by a later message that does arrive first
(per direction the proxy keeps order), a log line is awaited on the proxy's stderr as it comes,
within ``TIMEOUT``. Only timer-based faults (``delay``, ``after_ms``) depend on the clock, and
only as lower bounds or with a wide margin.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from acp import RequestError
from acp.schema import TextContentBlock
from harness import (
    TIMEOUT,
    Controlled,
    ProxyProcess,
    Start,
    captured,
    fault_file,
    log_events,
    notification,
    raw_agent,
    replace_file,
    request,
    say,
)
from peers.sdk_remote_client import open_session, sdk_prompt, sdk_state
from stdio_scenario import (
    SWALLOWED,
    SdkClient,
    barrier,
    check_corrupted,
    exits_with,
    faults_of,
    raw_agent_per_process,
    rule,
    sdk_client_session,
    until_logged,
    with_id,
)

from proxy.tools.report import report_main

# -- the proxy as a subprocess, with the test as raw Client ---------------------------------------


# == drop ==========================================================================================


async def test_dropped_response_reaches_the_agent_but_never_the_client(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """drop on a response: the Agent answered the prompt, the Client gets only the next answer."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-prompt-answer",
            {"action": "drop"},
            None,
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    first = request(
        1, "session/prompt", {"sessionId": "S", "prompt": [{"type": "text", "text": "one"}]}
    )
    second = request(2, "_x/next", {"n": 2})
    await proxy.send(first, second)

    answer = await proxy.recv_json()
    assert answer["id"] == 2  # the next response the Client reads is the later request's
    assert await barrier(proxy, "b") == []
    # The Agent got the prompt (under the proxy's id 0) and the later request, and answered both.
    assert captured(capture)[:2] == [with_id(first, 1, 0), with_id(second, 2, 1)]
    (fault,) = faults_of(proxy.stderr, "lose-prompt-answer")
    assert (fault["action"], fault["direction"], fault["kind"]) == ("drop", "to_client", "response")
    assert fault["method"] == "session/prompt"
    # The Client's own id (1), which its log shows, and the one the Agent answered (0).
    assert (fault["id"], fault["wire_id"]) == ("1", "0")


async def test_dropped_request_never_reaches_the_agent(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """drop on a request: the Agent never sees it (no id is minted for it), the Client no answer."""
    faults = fault_file(
        tmp_path,
        rule("lose-request", {"action": "drop"}, None, direction="to_agent", method="_x/lost"),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(request("lost", "_x/lost", {"a": 1}))
    assert await barrier(proxy, "b") == []  # no answer for "lost" came first
    assert captured(capture) == [request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "lose-request")) == 1


async def test_sdk_dropped_prompt_response_leaves_the_sdk_client_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the 1st prompt's answer is lost, though the Agent ran it; the 2nd's comes."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-first-prompt-answer",
            {"action": "drop"},
            {"nth": [1]},
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        first = asyncio.create_task(  # noqa: TID251 - the test cancels and awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="echo one")])
        )
        await client.until(lambda: "one" in client.texts())  # the Agent acted on the prompt
        assert await sdk_prompt(conn, session, "echo two") == "end_turn"
        state = await sdk_state(conn)
        assert not first.done()  # its answer would have come before the 2nd one's

        first_id, second_id = client.sent_ids("session/prompt")
        assert client.answers_to(first_id) == []
        assert len(client.answers_to(second_id)) == 1
        assert [(p["text"]) for p in state["prompts"]] == ["echo one", "echo two"]
        assert client.texts() == ["one", "two"]
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(faults_of(stderr.stderr, "lose-first-prompt-answer")) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == delay =========================================================================================


async def test_delayed_messages_are_overtaken_and_still_arrive(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """delay: both ways, a held message arrives after a later undelayed one, byte for byte."""
    faults = fault_file(
        tmp_path,
        rule(
            "slow-request",
            {"action": "delay", "ms": 300},
            None,
            direction="to_agent",
            method="_x/slow",
        ),
        rule(
            "slow-update",
            {"action": "delay", "ms": 300},
            None,
            direction="to_client",
            method="_x/late",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))

    slow, fast = request("slow", "_x/slow", {"n": 1}), request("fast", "_x/fast", {"n": 2})
    await proxy.send(slow, fast)
    assert (await proxy.recv_json())["id"] == "fast"
    assert (await proxy.recv_json())["id"] == "slow"
    # The Agent read the later request first: it got id 1, the held one id 0.
    assert captured(capture) == [with_id(fast, "fast", 1), with_id(slow, "slow", 0)]

    late, early = notification("_x/late", {"n": 1}), notification("_x/early", {"n": 2})
    await proxy.send(say(late, early))
    assert await proxy.recv() == early
    assert await proxy.recv() == late
    assert await barrier(proxy, "b") == []
    assert len(faults_of(proxy.stderr, "slow-request")) == 1
    assert len(faults_of(proxy.stderr, "slow-update")) == 1


async def test_a_delayed_request_is_logged_traced_and_reported_when_it_left(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """delay, as a user sees it afterwards: the debug log and the trace say the request was held
    when it arrived and relayed when its timer fired, after the request that overtook it. The
    rule holds its answer too (an answer takes its request's method): the answer's duration
    counts both holds. ``report`` counts each message once, and both as held by the rule."""
    faults = fault_file(
        tmp_path,
        rule("slow-request", {"action": "delay", "ms": 300}, None, method="_x/slow"),
    )
    trace = tmp_path / "trace.jsonl"
    proxy = await start(
        raw_agent(capture), "--faults", str(faults), "--trace", str(trace), "--log-level", "debug"
    )
    await proxy.send(request("slow", "_x/slow"), request("fast", "_x/fast"))
    assert (await proxy.recv_json())["id"] == "fast"
    assert (await proxy.recv_json())["id"] == "slow"
    await proxy.close_stdin()
    assert await proxy.wait() == 0

    lines = [json.loads(text) for text in proxy.stderr.splitlines() if text.startswith("{")]
    logged = [
        (line["event"], line.get("method"), line.get("hold"))
        for line in lines
        if line.get("event") in ("held", "relayed") and line.get("direction") == "to_agent"
    ]
    hold = logged[0][2]
    assert logged == [
        ("held", "_x/slow", hold),
        ("relayed", "_x/fast", None),
        ("relayed", "_x/slow", hold),
    ]

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    to_agent = [
        (r["event"], r["method"], r.get("hold"))
        for r in records
        if r.get("direction") == "to_agent"
    ]
    assert to_agent == [
        ("fault", "_x/slow", None),
        ("held", "_x/slow", hold),
        ("message", "_x/fast", None),
        ("message", "_x/slow", hold),
    ]
    [answer] = [r for r in records if r["event"] == "message" and r.get("id") == "slow"][1:]
    assert (answer["kind"], answer["disposition"]) == ("response", "relayed")
    assert answer["duration_ms"] >= 600.0  # the request's hold and its own
    assert "hold" in answer

    output, status = report_main([trace], as_json=True)
    assert status == 0
    summary = json.loads(output)
    assert summary["totals"]["messages_held"] == summary["totals"]["messages_held_sent"] == 2
    assert summary["totals"]["messages_not_relayed"] == 0
    assert [
        (m["direction"], m["kind"], m["method"], m["rules"], m["sent"])
        for m in summary["messages"]["held"]
    ] == [
        ("to_agent", "request", "_x/slow", "slow-request", 1),
        ("to_client", "response", "_x/slow", "slow-request", 1),
    ]
    slow = [
        m
        for m in summary["messages"]["relayed"]
        if (m["direction"], m["method"]) == ("to_agent", "_x/slow")
    ]
    assert [m["count"] for m in slow] == [1]


# == error =========================================================================================


async def test_error_answers_under_the_clients_id_and_nothing_reaches_the_agent(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """error: the Client gets code, message and data under its exact id, the data saying which
    rule injected it (``acpFault``); the Agent sees nothing."""
    data = {"retryAfterMs": 5, "reasons": ["test", None]}
    faults = fault_file(
        tmp_path,
        rule(
            "refuse",
            {"action": "error", "code": -32042, "message": "refused by the test", "data": data},
            None,
            direction="to_agent",
            method="_x/refused",
        ),
        name="faults.json",
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(request("7", "_x/refused", {"a": 1}), request(7, "_x/refused"))
    said = {**data, "acpFault": {"rule": "refuse", "action": "error"}}
    error = {"code": -32042, "message": "refused by the test", "data": said}
    string_answer = await proxy.recv_json()
    assert string_answer == {"jsonrpc": "2.0", "id": "7", "error": error}
    int_answer = await proxy.recv_json()
    assert int_answer == {"jsonrpc": "2.0", "id": 7, "error": error}
    assert type(int_answer["id"]) is int

    # A notification of that method cannot be answered: the rule lets it through.
    note = notification("_x/refused", {"b": 2})
    await proxy.send(note)
    assert await barrier(proxy, "b") == []
    assert captured(capture) == [note, request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "refuse")) == 2


async def test_sdk_client_gets_the_injected_error_and_the_sdk_agent_no_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the SDK Client's prompt raises the configured error; the Agent got none."""
    faults = fault_file(
        tmp_path,
        rule(
            "refuse-prompts",
            {"action": "error", "code": -32099, "message": "try later", "data": {"retry": True}},
            None,
            direction="to_agent",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        with pytest.raises(RequestError) as raised:
            await sdk_prompt(conn, session, "echo never")
        assert (raised.value.code, str(raised.value)) == (-32099, "try later")
        assert raised.value.data == {
            "retry": True,
            "acpFault": {"rule": "refuse-prompts", "action": "error"},
        }
        state = await sdk_state(conn)
    assert state["prompts"] == []
    assert [method for _, method in state["requests"]] == [
        "initialize",
        "session/new",
        "_sdk_agent/state",
    ]
    assert client.texts() == []
    assert len(faults_of(stderr.stderr, "refuse-prompts")) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == duplicate =====================================================================================


async def test_duplicated_request_reaches_the_agent_twice_and_is_answered_once(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """duplicate on a request: two copies under two ids, one answer relayed, the other swallowed."""
    faults = fault_file(
        tmp_path,
        rule(
            "replay",
            {"action": "duplicate", "copies": 1},
            None,
            direction="to_agent",
            method="_x/twice",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    sent = request("d", "_x/twice", {"key": "k-1", "text": "once please"})
    await proxy.send(sent)
    answer = await proxy.recv_json()
    assert answer == {
        "jsonrpc": "2.0",
        "id": "d",
        "result": {"method": "_x/twice", "size": len(with_id(sent, "d", 0))},
    }
    assert await barrier(proxy, "b") == []  # exactly one answer for "d"
    first, second, _ = captured(capture)
    assert first == with_id(sent, "d", 0)
    assert second == with_id(sent, "d", 1)
    await until_logged(proxy, SWALLOWED)
    (swallowed,) = log_events(proxy.stderr, SWALLOWED)
    assert (swallowed["id"], swallowed["copy_id"]) == ('"d"', "1")
    assert len(faults_of(proxy.stderr, "replay")) == 1


async def test_duplicated_notification_arrives_several_times_byte_for_byte(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """duplicate on a notification: the Client gets it 1 + copies times, identical, gap_ms apart."""
    faults = fault_file(
        tmp_path,
        rule(
            "echo-update",
            {"action": "duplicate", "copies": 2, "gap_ms": 20},
            None,
            direction="to_client",
            kind="notification",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","n":"\\u00e9"}}'
    await proxy.send(say(update))
    assert [await proxy.recv() for _ in range(3)] == [update] * 3
    assert await barrier(proxy, "b") == []
    assert len(faults_of(proxy.stderr, "echo-update")) == 1


async def test_sdk_agent_runs_a_duplicated_prompt_twice_and_the_sdk_client_gets_one_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the Agent runs each prompt twice (2 ids); the Client sees one answer each."""
    faults = fault_file(
        tmp_path,
        rule(
            "replay-prompts",
            {"action": "duplicate", "copies": 1, "gap_ms": 10},
            None,
            direction="to_agent",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, "echo twice") == "end_turn"
        await client.until(lambda: client.texts().count("twice") == 2)  # both copies ran
        await until_logged(stderr, SWALLOWED)
        assert await sdk_prompt(conn, session, "echo again") == "end_turn"
        await client.until(lambda: client.texts().count("again") == 2)
        await until_logged(stderr, SWALLOWED, 2)
        state = await sdk_state(conn)

    prompts = state["prompts"]
    assert [p["text"] for p in prompts] == ["echo twice"] * 2 + ["echo again"] * 2
    assert len({p["id"] for p in prompts}) == 4  # every copy under its own id
    for prompt_id in client.sent_ids("session/prompt"):
        assert len(client.answers_to(prompt_id)) == 1
    assert len(faults_of(stderr.stderr, "replay-prompts")) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == sever =========================================================================================


@pytest.mark.parametrize(
    ("side", "when"),
    [
        ("agent", "before"),
        ("agent", "after"),
        ("client", "before"),
        ("client", "after"),
        ("both", "before"),
        ("both", "after"),
    ],
)
async def test_sever_cuts_the_side_before_or_after_forwarding(
    start: Start, capture: Path, tmp_path: Path, side: str, when: str
) -> None:
    """sever: the Agent gets it only when after; the Client's stdout ends; the Agent's status."""
    faults = fault_file(
        tmp_path,
        rule(
            "cut",
            {"action": "sever", "side": side, "when": when},
            None,
            direction="to_agent",
            method="_x/cut",
        ),
    )
    proxy = await start(exits_with(5, raw_agent(capture)), "--faults", str(faults))
    assert await barrier(proxy, "before") == []
    cut = request("cut", "_x/cut", {"n": 1})
    await proxy.send(cut)
    assert await proxy.at_eof()  # no answer to "cut", nothing at all
    assert await proxy.wait() == 5
    expected = [request(0, "_test/barrier")]
    if when == "after":
        expected.append(with_id(cut, "cut", 1))
    assert captured(capture) == expected
    if (side, when) == ("client", "after"):
        # The Agent answered "cut"; the answer met a closed Client and was dropped.
        (undelivered,) = log_events(proxy.stderr, "message for a closed peer dropped")
        assert (undelivered["direction"], undelivered["kind"]) == ("to_client", "response")
    assert len(faults_of(proxy.stderr, "cut")) == 1


# == kill_agent ====================================================================================


async def test_sdk_kill_agent_ends_the_proxy_with_137_and_the_prompt_unanswered(
    tmp_path: Path,
) -> None:
    """kill_agent: SIGKILL to the SDK Agent mid-prompt; exit 137, the prompt never answered."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill",
            {"action": "kill_agent"},
            None,
            direction="to_agent",
            kind="notification",
            method="_x/kill",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, process, stderr):
        session = await open_session(conn)
        state = await sdk_state(conn)
        pending = asyncio.create_task(  # noqa: TID251 - the test awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.texts())  # the Agent is working on it
        await conn.ext_notification("x/kill", {})
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 128 + signal.SIGKILL
        with pytest.raises(ConnectionError):  # the SDK's word for "the agent went away"
            await asyncio.wait_for(pending, TIMEOUT)
        (prompt_id,) = client.sent_ids("session/prompt")
        assert client.answers_to(prompt_id) == []
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)
    (fault,) = faults_of(stderr.stderr, "kill")
    assert fault["action"] == "kill_agent"


async def test_sdk_kill_agent_with_respawn_keeps_the_client_and_starts_a_fresh_agent(
    tmp_path: Path,
) -> None:
    """kill_agent respawn: the pipe stays open, a new Agent answers, the old prompt never."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill-and-respawn",
            {"action": "kill_agent", "respawn": True},
            None,
            direction="to_agent",
            kind="notification",
            method="_x/kill",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, process, stderr):
        session = await open_session(conn)
        old = await sdk_state(conn)
        pending = asyncio.create_task(  # noqa: TID251 - the test cancels and awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.texts())
        await conn.ext_notification("x/kill", {})

        new = await sdk_state(conn)  # waits while the Agent is down, then meets the new one
        assert new["pid"] != old["pid"]
        assert [method for _, method in new["requests"]] == ["_sdk_agent/state"]  # uninitialised
        with pytest.raises(ProcessLookupError):
            os.kill(old["pid"], 0)
        # The new Agent serves a whole new conversation; the old prompt stays unanswered.
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, "echo reborn") == "end_turn"
        assert not pending.done()
        (old_prompt, new_prompt) = client.sent_ids("session/prompt")
        assert client.answers_to(old_prompt) == []
        assert len(client.answers_to(new_prompt)) == 1
        assert process.returncode is None
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
    assert process.returncode == 0
    assert client.texts() == ["waiting", "reborn"]
    assert len(faults_of(stderr.stderr, "kill-and-respawn")) == 1


async def test_kill_agent_waits_after_ms_and_sends_the_configured_signal(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """kill_agent after_ms: the Agent answers for after_ms, then gets the signal (TERM: 143)."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill-later",
            {"action": "kill_agent", "signal": "TERM", "after_ms": 300},
            None,
            direction="to_agent",
            method="_x/kill",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    started = time.monotonic()
    await proxy.send(notification("_x/kill"))
    assert await barrier(proxy, "still-alive") == []
    assert await proxy.at_eof()
    assert await proxy.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - started >= 0.3  # never before after_ms
    assert captured(capture) == [notification("_x/kill"), request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "kill-later")) == 1


# == restart_proxy =================================================================================


async def test_restart_proxy_forgets_the_pending_request_and_meets_a_fresh_agent(
    start: Start, tmp_path: Path
) -> None:
    """restart_proxy: the request is never answered, the next ones reach a new Agent, ids go on."""
    faults = fault_file(
        tmp_path,
        rule(
            "restart",
            {"action": "restart_proxy", "downtime_ms": 50},
            {"nth": [1]},
            direction="to_agent",
            method="session/prompt",
        ),
    )
    agents = tmp_path / "agents"
    proxy = await start(raw_agent_per_process(agents), "--faults", str(faults))
    first = request("a", "_x/first")
    await proxy.send(first)
    assert (await proxy.recv_json())["id"] == "a"

    lost = request("p", "session/prompt", {"sessionId": "S", "prompt": []})
    after = request("c", "_x/after")
    await proxy.send(lost, after)
    assert (await proxy.recv_json())["id"] == "c"  # never "p"
    assert await barrier(proxy, "d") == []
    await proxy.close_stdin()
    assert await proxy.wait() == 0

    started = [record["pid"] for record in log_events(proxy.stderr, "agent started")]
    assert len(started) == 2
    assert sorted(p.name for p in agents.iterdir()) == sorted(f"{pid}.jsonl" for pid in started)
    old, new = (captured(agents / f"{pid}.jsonl") for pid in started)
    assert old[0] == with_id(first, "a", 0)
    assert old[1:] in ([], [with_id(lost, "p", 1)])  # stopped at once: it may not have read it
    # The fresh Agent's first message: the proxy kept counting (1 went to the prompt).
    assert new == [with_id(after, "c", 2), request(3, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "restart")) == 1
    assert [r["what"] for r in log_events(proxy.stderr, "restarting")] == ["proxy"]


# == corrupt =======================================================================================


@pytest.mark.parametrize("mode", ["truncate", "garbage", "invalid_utf8"])
async def test_corrupt_sends_malformed_bytes_in_place_of_the_message(
    start: Start, capture: Path, tmp_path: Path, mode: str
) -> None:
    """corrupt: both ways the peer gets one malformed line instead of the message; framing holds."""
    faults = fault_file(
        tmp_path,
        rule(
            "to-client",
            {"action": "corrupt", "mode": mode},
            None,
            direction="to_client",
            method="_x/bad",
        ),
        rule(
            "to-agent",
            {"action": "corrupt", "mode": mode},
            None,
            direction="to_agent",
            method="_x/bad",
        ),
        seed=5,
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    bad = notification("_x/bad", {"text": "caf\u00e9 " + "x" * 300, "n": [1, 2, 3]})
    good = notification("_x/good", {"n": 1})

    await proxy.send(say(bad, good))
    check_corrupted(mode, bad, await proxy.recv())
    assert await proxy.recv() == good  # the next message is whole: no newline was injected

    await proxy.send(bad, good)
    assert await barrier(proxy, "b") == []
    saw = captured(capture)
    check_corrupted(mode, bad, saw[-3])
    assert saw[-2:] == [good, request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "to-client")) == 1
    assert len(faults_of(proxy.stderr, "to-agent")) == 1


# == schedules through a real process ==============================================================


async def test_only_the_second_prompt_response_is_dropped(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """schedule nth [2]: of three prompts the Agent answers all, the Client gets the 1st and 3rd."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-second",
            {"action": "drop"},
            {"nth": [2]},
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    for n in (1, 2, 3):
        await proxy.send(request(n, "session/prompt", {"sessionId": "S", "n": n}))
    assert [(await proxy.recv_json())["id"] for _ in range(2)] == [1, 3]
    assert await barrier(proxy, "b") == []
    assert [json.loads(line)["params"]["n"] for line in captured(capture)[:3]] == [1, 2, 3]
    assert len(faults_of(proxy.stderr, "lose-second")) == 1


@pytest.mark.parametrize(
    ("schedule", "dropped"),
    [
        ({"nth": [2, 5]}, {2, 5}),
        ({"every": 3}, {3, 6, 9}),
        ({"after": 2, "times": 3}, {3, 4, 5}),
        ({"after": 1, "every": 4}, {5, 9}),
        ({"nth": [1, 2, 3, 4], "times": 2}, {1, 2}),
    ],
)
async def test_schedules_pick_the_occurrences(
    start: Start, capture: Path, tmp_path: Path, schedule: dict[str, Any], dropped: set[int]
) -> None:
    """schedule nth/after/times/every: exactly those of 10 notifications are dropped."""
    faults = fault_file(
        tmp_path, rule("pick", {"action": "drop"}, schedule, direction="to_client", method="_x/n")
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(say(*(notification("_x/n", {"i": i}) for i in range(1, 11))))
    received = {json.loads(line)["params"]["i"] for line in await barrier(proxy, "b")}
    assert set(range(1, 11)) - received == dropped
    assert len(faults_of(proxy.stderr, "pick")) == len(dropped)


# == --seed ========================================================================================


COIN_FLIPS = 20


def coin_file(directory: Path, seed: int | None) -> Path:
    """A fault file dropping each ``_x/coin`` notification to the Client with probability 0.5."""
    coin = rule(
        "coin",
        {"action": "drop"},
        {"probability": 0.5},
        direction="to_client",
        method="_x/coin",
    )
    return fault_file(directory, coin, seed=seed)


async def coin_drops(proxy: ProxyProcess) -> set[int]:
    """Make the raw Agent send ``COIN_FLIPS`` coins; the ones that never reached the Client."""
    await proxy.send(say(*(notification("_x/coin", {"i": i}) for i in range(COIN_FLIPS))))
    received = {json.loads(line)["params"]["i"] for line in await barrier(proxy, "b")}
    assert len(faults_of(proxy.stderr, "coin")) == COIN_FLIPS - len(received)
    return set(range(COIN_FLIPS)) - received


async def test_same_seed_same_faults_other_seed_other_faults(start: Start, tmp_path: Path) -> None:
    """--seed: probability 0.5 over 20 messages drops the same ones for the same seed only."""
    faults = coin_file(tmp_path, seed=99)

    async def dropped(index: int, *seed: str) -> set[int]:
        capture = tmp_path / f"agent-{index}.jsonl"
        return await coin_drops(await start(raw_agent(capture), "--faults", str(faults), *seed))

    first, again, other, from_file, explicit = await asyncio.gather(
        dropped(0, "--seed", "11"),
        dropped(1, "--seed", "11"),
        dropped(2, "--seed", "12"),
        dropped(3),
        dropped(4, "--seed", "99"),
    )
    assert first == again
    assert 0 < len(first) < COIN_FLIPS
    assert other != first
    assert from_file == explicit  # the file's seed is used when --seed is not given
    assert from_file != first  # ...and --seed overrides it


async def test_the_logged_random_seed_reproduces_a_run_without_a_seed(
    start: Start, tmp_path: Path
) -> None:
    """No seed given: the seed drawn is logged once, and --seed with it gives the same faults."""
    faults = coin_file(tmp_path, seed=None)
    proxy = await start(raw_agent(tmp_path / "run-1.jsonl"), "--faults", str(faults))
    dropped = await coin_drops(proxy)
    seeds = [
        record["seed"]
        for record in log_events(proxy.stderr, "no seed given; pass --seed to reproduce this run")
    ]
    assert len(seeds) == 1, f"several seeds logged, only one was used: {seeds}"
    again = await start(
        raw_agent(tmp_path / "run-2.jsonl"), "--faults", str(faults), "--seed", str(seeds[0])
    )
    assert await coin_drops(again) == dropped


# == --state =======================================================================================


async def test_state_file_keeps_counters_across_proxy_restarts(
    start: Start, tmp_path: Path
) -> None:
    """--state: "drop the 1st keyed prompt response" fires once across two runs of the proxy."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-first-keyed",
            {"action": "drop"},
            {"nth": [1]},
            direction="to_client",
            kind="response",
            method="session/prompt",
            idempotency_key="present",
        ),
    )
    keyed = request(1, "session/prompt", {"sessionId": "S", "idempotencyKey": "k-1", "prompt": []})

    async def first_answer_lost(state: Path, capture: Path) -> bool:
        proxy = await start(raw_agent(capture), "--faults", str(faults), "--state", str(state))
        await proxy.send(keyed)
        lost = await barrier(proxy, "b") == []
        assert captured(capture)[0] == with_id(keyed, 1, 0)  # the Agent got it either way
        await proxy.close_stdin()
        assert await proxy.wait() == 0
        return lost

    state = tmp_path / "state.json"
    assert await first_answer_lost(state, tmp_path / "run-1.jsonl")
    assert state.exists()
    assert not await first_answer_lost(state, tmp_path / "run-2.jsonl")
    # Without the state file, a new run would have dropped it again.
    assert await first_answer_lost(tmp_path / "fresh-state.json", tmp_path / "run-3.jsonl")


# == --watch =======================================================================================


async def test_watch_reloads_rules_and_keeps_the_last_good_ones(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """--watch: an edited file's rules apply once reloaded; a broken edit is refused, rules kept."""
    faults = fault_file(
        tmp_path, rule("drop-a", {"action": "drop"}, None, direction="to_client", method="_x/a")
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults), "--watch")
    a, b = notification("_x/a"), notification("_x/b")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "1") == [b]

    dropping_b = rule(
        "drop-b-instead", {"action": "drop"}, None, direction="to_client", method="_x/b"
    )
    replace_file(faults, yaml.safe_dump({"version": 1, "rules": [dropping_b]}))
    await until_logged(proxy, "fault files reloaded")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "2") == [a]

    replace_file(faults, "version: 1\nrules:\n  - name: broken\n    do:\n      action: explode\n")
    refused = "fault file reload refused; keeping the last good rules"
    await until_logged(proxy, refused)
    await proxy.send(say(a, b))
    assert await barrier(proxy, "3") == [a]  # still dropping _x/b
    (error,) = log_events(proxy.stderr, refused)
    assert "rule 'broken'" in error["error"]
    assert "explode" in error["error"]
    assert len(log_events(proxy.stderr, "fault files reloaded")) == 1
    assert len(faults_of(proxy.stderr, "drop-a")) == 1
    assert len(faults_of(proxy.stderr, "drop-b-instead")) == 2


@pytest.mark.parametrize("in_place", [False, True], ids=["replaced", "written-in-place"])
async def test_watch_sees_an_edit_that_keeps_the_size_and_the_mtime(
    start: Start, capture: Path, tmp_path: Path, in_place: bool
) -> None:
    """An edit of the same size whose mtime is set back (a coarse clock, ``touch -r``) is seen:
    by the file's identity when it is replaced, by its ctime when it is written in place; a
    touch or a chmod alone reloads nothing."""
    a, b = notification("_x/a"), notification("_x/b")

    def dropping(method: str) -> str:
        return yaml.safe_dump(
            {
                "version": 1,
                "rules": [rule("drop-it", {"action": "drop"}, None, method=method)],
            }
        )

    faults = tmp_path / "faults.yaml"
    faults.write_text(dropping("_x/a"))
    proxy = await start(raw_agent(capture), "--faults", str(faults), "--watch")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "1") == [b]
    touched = os.stat(faults).st_mtime_ns + 5_000_000_000
    os.utime(faults, ns=(touched, touched))  # a touch and a chmod change no rule
    faults.chmod(0o600)
    await until_logged(proxy, "fault files touched, their contents unchanged: nothing reloaded")
    before = os.stat(faults)
    text = dropping("_x/b")
    assert len(text) == before.st_size
    if in_place:
        faults.write_text(text)
    else:
        replace_file(faults, text)
    os.utime(faults, ns=(before.st_atime_ns, before.st_mtime_ns))
    await until_logged(proxy, "fault files reloaded")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "2") == [a]
    assert len(log_events(proxy.stderr, "fault files reloaded")) == 1


class ConfigMapVolume:
    """A folder laid out and updated as the kubelet lays out a ConfigMap volume (its atomic
    writer): each key is a symbolic link ``NAME -> ..data/NAME``; ``..data`` is a link to a
    timestamped folder that holds the files. An update writes a new timestamped folder, points a
    new link ``..data_tmp`` at it, renames that over ``..data`` in one step, then removes the old
    folder: the path a program was given (``DIR/NAME``) never changes, what it leads to does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir()

    def data(self) -> Path:
        return self.path / os.readlink(self.path / "..data")

    def update(self, files: dict[str, str]) -> None:
        old = self.data() if (self.path / "..data").is_symlink() else None
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
        folder = Path(tempfile.mkdtemp(prefix=stamp, dir=self.path))
        for name, text in files.items():
            (folder / name).write_text(text)
        (self.path / "..data_tmp").symlink_to(folder.name)
        os.rename(self.path / "..data_tmp", self.path / "..data")
        for name in files:
            if not (self.path / name).is_symlink():
                (self.path / name).symlink_to(f"..data/{name}")
        if old is not None:
            shutil.rmtree(old)


async def test_watch_follows_a_configmap_volume_through_the_kubelets_data_link_swaps(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """``--watch --faults DIR/NAME`` on a ConfigMap volume: each update of the ConfigMap (the
    ``..data`` link swapped, the old folder removed) is reloaded, as a file replaced is."""
    a, b = notification("_x/a"), notification("_x/b")

    def dropping(method: str) -> dict[str, str]:
        rules = [rule("drop-it", {"action": "drop"}, None, method=method)]
        return {"faults.yaml": yaml.safe_dump({"version": 1, "rules": rules})}

    volume = ConfigMapVolume(tmp_path / "faults")
    volume.update(dropping("_x/a"))
    faults = volume.path / "faults.yaml"
    proxy = await start(raw_agent(capture), "--faults", str(faults), "--watch")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "1") == [b]

    first = volume.data()
    volume.update(dropping("_x/b"))
    assert not first.exists()
    assert os.readlink(faults) == "..data/faults.yaml"  # the path given is the same link
    await until_logged(proxy, "fault files reloaded")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "2") == [a]

    volume.update(dropping("_x/a"))  # and again: the watcher follows every swap
    await until_logged(proxy, "fault files reloaded", count=2)
    await proxy.send(say(a, b))
    assert await barrier(proxy, "3") == [b]


# == a bad fault file ==============================================================================


async def test_run_refuses_a_bad_fault_file_before_starting_the_agent(
    start: Start, tmp_path: Path
) -> None:
    """run with a bad fault file: exit 2, every error located on stderr, no Agent ever started."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\n"
        "rules:\n"
        "  - name: slow\n"
        "    do:\n"
        "      action: delay\n"
        "      ms: -5\n"
        "  - name: typo\n"
        "    when:\n"
        "      kind: reqest\n"
        "    do:\n"
        "      action: drop\n"
    )
    marker = tmp_path / "agent-ran"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proxy = await start(agent, "--faults", str(bad))
    assert await proxy.at_eof()
    assert await proxy.wait() == 2
    assert f"{bad}:6: rule 'slow': do.ms:" in proxy.stderr
    assert f"{bad}:9: rule 'typo': when.kind:" in proxy.stderr
    assert not marker.exists()


# == faults the Client asks for ====================================================================


async def test_a_client_asks_for_its_own_faults_with_allow_client_faults(
    start: Start, capture: Path
) -> None:
    """--allow-client-faults: a request's ``_meta.acpFault`` gets that fault (an error answered
    at once; a delay, after which the Agent reads the request without the hint); a bad hint is
    answered -32602; no fault file at all."""
    proxy = await start(raw_agent(capture), "--allow-client-faults")
    meta_error = {"_meta": {"acpFault": {"action": "error", "code": -32001, "attribute": False}}}
    await proxy.send(request("e", "_x/refused", meta_error))
    assert await proxy.recv_json() == {
        "jsonrpc": "2.0",
        "id": "e",
        "error": {"code": -32001, "message": "Error injected by acp-fault-proxy"},
    }
    await proxy.send(request("b", "_x/bad", {"_meta": {"acpFault": {"action": "dorp"}}}))
    bad = await proxy.recv_json()
    assert (bad["id"], bad["error"]["code"]) == ("b", -32602)
    meta_delay = {"k": 1, "_meta": {"acpFault": {"action": "delay", "ms": 20}, "trace": "t"}}
    await proxy.send(request("d", "_x/late", meta_delay))
    assert (await proxy.recv_json())["id"] == "d"
    assert await barrier(proxy, "z") == []
    assert captured(capture) == [
        request(0, "_x/late", {"k": 1, "_meta": {"trace": "t"}}),
        request(1, "_test/barrier"),
    ]
    assert [f["rule"] for f in log_events(proxy.stderr, "fault injected")] == [
        "_meta.acpFault",
        "_meta.acpFault",
    ]


# == reorder =======================================================================================


async def test_reorder_sends_a_chunk_behind_the_ones_that_followed_it(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """reorder after 2: of the Agent's chunks 1 to 4, the Client reads 2, 3, 1, 4, each whole;
    the trace has the hold and its delivery; released early, the hold is no fault in progress
    any more (not for the rest of its ``max_ms``)."""
    faults = fault_file(
        tmp_path,
        rule(
            "shuffle",
            {"action": "reorder", "after": 2, "max_ms": 600_000},
            {"nth": [1]},
            method="_x/chunk",
        ),
        name="faults.json",
    )
    trace = tmp_path / "trace.jsonl"
    proxy, control = await controlled(
        raw_agent(capture), "--faults", str(faults), "--trace", str(trace)
    )
    chunks = [notification("_x/chunk", {"n": n}) for n in (1, 2, 3, 4)]
    await proxy.send(say(*chunks))
    assert [await proxy.recv() for _ in chunks] == [chunks[1], chunks[2], chunks[0], chunks[3]]
    assert await barrier(proxy, "b") == []
    assert await asyncio.to_thread(control.metric, "acp_proxy_active_faults") == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["event"] for r in records if r.get("hold") is not None][:2] == ["held", "message"]


# == truncate ======================================================================================


async def test_truncate_leaves_the_client_a_line_without_its_end(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """truncate 30 on a notification toward a stdio Client: it reads those 30 bytes and no line
    end, then the end of its stdout (the cut connection), as when a writer dies mid-line."""
    faults = fault_file(
        tmp_path,
        rule("cut", {"action": "truncate", "bytes": 30}, None, method="_x/cut"),
        name="faults.json",
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    before, cut = notification("_x/before", {"n": 1}), notification("_x/cut", {"n": 2})
    await proxy.send(say(before, cut))
    assert await proxy.recv() == before
    assert proxy.process.stdout is not None
    rest = await asyncio.wait_for(proxy.process.stdout.read(), TIMEOUT)
    assert rest == cut[:30]
    assert len(faults_of(proxy.stderr, "cut")) == 1


async def test_slice_leaves_the_client_a_partial_line_then_the_rest(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """slice toward a stdio Client, two pieces a second apart: the Client reads the first piece,
    a line without its end, and then the rest of it; the message behind it follows it."""
    cut = notification("_x/sliced", {"pad": "x" * 40})
    faults = fault_file(
        tmp_path,
        rule(
            "halves",
            {"action": "slice", "average_size": len(cut) // 2 + 1, "gap_us": 1_000_000},
            None,
            method="_x/sliced",
        ),
        name="faults.json",
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    after = notification("_x/after")
    await proxy.send(say(cut, after))
    assert proxy.process.stdout is not None
    first = await asyncio.wait_for(proxy.process.stdout.read(1000), TIMEOUT)
    assert first == cut[: len(cut) // 2 + 1]  # the second piece is a second away
    assert await proxy.recv() == cut[len(first) :]
    assert await proxy.recv() == after
    assert len(faults_of(proxy.stderr, "halves")) == 1


async def test_sdk_peers_take_a_reordered_chunk_and_a_burst_of_delays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides, through reorder and bursty delays: the first prompt's chunk is held until
    its answer has passed it (the Client reads the answer first), later chunks are delayed in
    bursts by a pareto law (the next prompt's chunk may overtake one); the SDK Client gets every
    chunk whole, and logs no warning."""
    faults = fault_file(
        tmp_path,
        rule(
            "chunk-after-answer",
            {"action": "reorder", "after": 1, "max_ms": 5000},
            {"nth": [1]},
            direction="to_client",
            method="session/update",
        ),
        rule(
            "bursty-delays",
            {"action": "delay", "ms": 5, "jitter_ms": 2, "distribution": "pareto"},
            {"bursts": {"p": 0.5, "r": 0.5}},
            direction="to_client",
            method="session/update",
        ),
        seed=3,
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        words = ["one", "two", "three", "four", "five", "six"]
        for word in words:
            assert await sdk_prompt(conn, session, f"echo {word}") == "end_turn"
        await client.until(lambda: len(client.texts()) == len(words))
    assert sorted(client.texts()) == sorted(words)  # delayed chunks may be overtaken
    assert len(faults_of(stderr.stderr, "chunk-after-answer")) == 1
    assert faults_of(stderr.stderr, "bursty-delays")
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


async def test_the_sdk_client_sees_its_connection_end_on_a_truncated_chunk(
    tmp_path: Path,
) -> None:
    """truncate on the chunk toward the SDK Client: it reads a line without its end, then the
    end of its connection; the pending prompt fails, and nothing hangs."""
    faults = fault_file(
        tmp_path,
        rule("cut-chunk", {"action": "truncate", "bytes": 40}, None, method="session/update"),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        with pytest.raises(ConnectionError, match="Connection closed"):
            await asyncio.wait_for(sdk_prompt(conn, session, "echo cut"), TIMEOUT)
    assert client.texts() == []
    assert len(faults_of(stderr.stderr, "cut-chunk")) == 1


# == stall and timeout =============================================================================


async def test_a_stall_holds_a_direction_until_the_control_api_releases_it(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """stall on the Agent's ``_x/stop``: it and the Agent's messages after it are held (the
    Client reads nothing more), the Client's requests still reach the Agent; once released over
    the control API the Client reads them all, in order, the next passes at once, and no fault
    is left in progress."""
    faults = fault_file(
        tmp_path,
        rule("quiet", {"action": "stall", "ms": 600_000}, None, method="_x/stop"),
        name="faults.json",
    )
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    before, stop = notification("_x/before"), notification("_x/stop")
    after = [notification("_x/after", {"n": n}) for n in (1, 2)]
    await proxy.send(say(before, stop, *after))
    assert await proxy.recv() == before
    await proxy.send(request("q", "_x/question"))  # the other direction flows
    await until_logged(proxy, "fault injected")
    active = await asyncio.to_thread(control.metric, "acp_proxy_active_faults")
    assert active >= 2  # the stall itself, and the message that started it, held
    assert await asyncio.to_thread(control.release) == 1
    assert [await proxy.recv() for _ in range(3)] == [stop, *after]
    answer = await proxy.recv_json()  # behind the stall: the Agent answered it meanwhile
    assert (answer["id"], answer["result"]["method"]) == ("q", "_x/question")
    assert [json.loads(line)["method"] for line in captured(capture)][-1] == "_x/question"
    assert await barrier(proxy, "b") == []
    # Released: its timers are forgotten, not left to run out their 600 s.
    assert await asyncio.to_thread(control.metric, "acp_proxy_active_faults") == 0
    assert await asyncio.to_thread(control.release) == 0  # nothing stalled any more
    [ended] = log_events(proxy.stderr, "stall ended; what it held goes on")
    assert (ended["rule"], ended["held"], ended["released"]) == ("quiet", 4, True)  # and q's answer


async def test_slow_close_passes_the_agents_end_on_late_and_what_was_held_first(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """slow_close on a message toward the Client: when the Agent exits, the Client's stdout
    ends 400 ms later (not at once), and a message held toward it meanwhile reaches it first."""
    faults = fault_file(
        tmp_path,
        rule("linger", {"action": "slow_close", "ms": 400}, None, method="_x/linger"),
        rule("late", {"action": "delay", "ms": 100}, None, method="_x/late"),
        name="faults.json",
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    linger, late = notification("_x/linger"), notification("_x/late")
    await proxy.send(say(linger))
    assert await proxy.recv() == linger
    await proxy.send(say(late))
    await proxy.send(notification("_test/exit", {"code": 0}))
    exited = time.monotonic()
    assert await proxy.recv() == late
    assert proxy.process.stdout is not None
    assert await asyncio.wait_for(proxy.process.stdout.read(), TIMEOUT) == b""
    assert time.monotonic() - exited >= 0.4
    assert len(faults_of(proxy.stderr, "linger")) == 1


async def test_the_sdk_client_sees_its_connection_end_after_a_timeout(tmp_path: Path) -> None:
    """timeout on the prompt toward the Agent: the Agent never sees it; 50 ms later both
    connections are cut, the SDK Client's pending prompt fails, nothing hangs."""
    faults = fault_file(
        tmp_path,
        rule("hang-up", {"action": "timeout", "ms": 50}, None, method="session/prompt"),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        with pytest.raises(ConnectionError, match="Connection closed"):
            await asyncio.wait_for(sdk_prompt(conn, session, "echo never"), TIMEOUT)
    assert client.texts() == []
    assert len(faults_of(stderr.stderr, "hang-up")) == 1


async def test_sdk_peers_wait_through_a_stalled_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stall of 100 ms on the first chunk toward the SDK Client: the chunk and the prompt's
    answer behind it arrive late and whole; the next prompt goes through as usual."""
    faults = fault_file(
        tmp_path,
        rule(
            "slow-path",
            {"action": "stall", "ms": 100},
            {"nth": [1]},
            direction="to_client",
            method="session/update",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        for word in ("one", "two"):
            assert await sdk_prompt(conn, session, f"echo {word}") == "end_turn"
        await client.until(lambda: len(client.texts()) == 2)
    # Whole, both: the order the Client's handlers ran in is the SDK's (it may run a late
    # chunk's handler after the next prompt's); the relay's order is the core's test.
    assert sorted(client.texts()) == ["one", "two"]
    assert len(faults_of(stderr.stderr, "slow-path")) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []
