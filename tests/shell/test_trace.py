"""The JSONL trace (``--trace FILE``) of a scripted run, read back and checked record by record.

A real proxy process relays a conversation between the test (a raw stdio Client, whose ids are
strings so that they differ from the ones the proxy mints) and the scripted raw Agent, with a rule
that drops a message and one that restarts the data plane. The trace is read while the proxy still
runs (each line is written and flushed as it happens) and again after it exited.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
from harness import ProxyProcess, encode, notification, raw_agent, request, say

from proxy.core.events import Direction
from proxy.core.jsonrpc import Kind
from proxy.core.observations import (
    Held,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Relayed,
    RelayedRun,
    Stopped,
    Undeliverable,
)
from proxy.core.records import as_json, record_of
from proxy.shell.observers import Tally
from proxy.shell.trace import TraceWriter

SESSION = "sess-trace"


def agent_answer(agent_id: int, method: str, size: int) -> bytes:
    """The raw Agent's answer line to a request it read under ``agent_id`` (its own format)."""
    reply = {"jsonrpc": "2.0", "id": agent_id, "result": {"method": method, "size": size}}
    return json.dumps(reply).encode()


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Every line of the trace, each parsed (each must be one complete JSON object)."""
    text = path.read_bytes()
    assert text.endswith(b"\n")
    records = [json.loads(line) for line in text.split(b"\n")[:-1]]
    assert all(isinstance(record, dict) for record in records)
    return records


def brief(record: dict[str, Any]) -> tuple[Any, ...]:
    """The fields that identify a record, in a fixed order."""
    if record["event"] == "message":
        return (
            "message",
            record["kind"],
            record["method"],
            record["id"],
            record["forwarded_id"],
            record["session"],
            record["size"],
        )
    if record["event"] == "fault":
        return ("fault", record["rule"], record["action"], record["kind"], record["method"])
    if record["event"] == "connection":
        return ("connection", record["state"], record["side"], record["transport"])
    if record["event"] == "restart":
        return ("restart", record["what"], record["abandoned"])
    return (record["event"],)


async def test_trace_of_a_run_record_by_record(proxies: list[ProxyProcess], tmp_path: Path) -> None:
    """Header, connections, each message with both ids, faults (and the message a drop
    stopped), a restart, closes; flushed live."""
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            {
                "version": 1,
                "rules": [
                    {"name": "lose-b", "when": {"method": "_x/b"}, "do": {"action": "drop"}},
                    {
                        "name": "restart-now",
                        "when": {"method": "_x/restart"},
                        "do": {"action": "restart_proxy"},
                    },
                ],
            }
        )
    )
    trace = tmp_path / "trace.jsonl"
    agent = raw_agent(tmp_path / "agent.jsonl")
    proxy = await ProxyProcess.start(agent, "--faults", str(faults), "--trace", str(trace))
    proxies.append(proxy)

    init = request("init", "initialize", {"protocolVersion": 1})
    await proxy.send(init)
    init_answer = await proxy.recv()
    assert json.loads(init_answer)["id"] == "init"
    question = request("agent-q", "session/request_permission", {"sessionId": SESSION})
    asking = say(question)
    await proxy.send(asking)
    forwarded = json.loads(await proxy.recv())  # the Agent's request, under the proxy's id
    reply = encode({"jsonrpc": "2.0", "id": forwarded["id"], "result": {"outcome": "ok"}})
    a, b = notification("_x/a", {"sessionId": SESSION}), notification("_x/b")
    dropping = say(b, a)
    restart = notification("_x/restart")
    barrier = request("barrier", "_test/barrier")
    await proxy.send(reply, dropping)
    assert await proxy.recv() == a
    await proxy.send(restart, barrier)
    assert json.loads(await proxy.recv())["id"] == "barrier"

    # The proxy still runs: everything up to the barrier's answer is in the file already.
    live = read_trace(trace)
    assert live[0]["event"] == "trace"
    assert live[0]["version"] == 1
    assert all(isinstance(record["time"], float) for record in live)
    assert [record["time"] for record in live] == sorted(record["time"] for record in live)
    assert {record["link"] for record in live[1:]} == {live[1]["link"]}
    assert [brief(r) for r in live[1:3]] == [
        ("connection", "open", "client", "stdio"),
        ("connection", "open", "agent", "stdio"),
    ]
    to_agent = [brief(r) for r in live if r.get("direction") == "to_agent"]
    assert to_agent == [
        ("message", "request", "initialize", "init", 0, None, len(init)),
        ("message", "notification", "_test/say", None, None, None, len(asking)),
        # The Client's answer: the Agent's id, and the id the Client answered under.
        (
            "message",
            "response",
            "session/request_permission",
            "agent-q",
            forwarded["id"],
            SESSION,
            len(reply),
        ),
        ("message", "notification", "_test/say", None, None, None, len(dropping)),
        ("fault", "restart-now", "restart_proxy", "notification", "_x/restart"),
        ("message", "notification", "_x/restart", None, None, None, len(restart)),
        ("message", "request", "_test/barrier", "barrier", 1, None, len(barrier)),
    ]
    init_size = len(agent_answer(0, "initialize", len(init)))
    barrier_size = len(agent_answer(1, "_test/barrier", len(barrier) - len('"barrier"') + 1))
    to_client = [brief(r) for r in live if r.get("direction") == "to_client"]
    assert to_client == [
        ("message", "response", "initialize", "init", 0, None, init_size),
        (
            "message",
            "request",
            "session/request_permission",
            "agent-q",
            forwarded["id"],
            SESSION,
            len(question),
        ),
        ("fault", "lose-b", "drop", "notification", "_x/b"),
        ("message", "notification", "_x/b", None, None, None, len(b)),  # dropped, not relayed
        ("message", "notification", "_x/a", None, None, SESSION, len(a)),
        ("message", "response", "_test/barrier", "barrier", 1, None, barrier_size),
    ]
    dropped = [r for r in live if r.get("method") == "_x/b" and r["event"] == "message"]
    assert [(r["disposition"], r["rule"]) for r in dropped] == [("dropped", "lose-b")]
    durations = [r for r in live if r.get("kind") == "response"]
    assert all(r["duration_ms"] >= 0 for r in durations)
    # The restart: the old Agent's connection closed, the restart, the new one opened, in order.
    events = [brief(r) for r in live if r["event"] in ("restart", "connection")][2:]
    assert events == [
        ("connection", "closed", "agent", "stdio"),
        ("restart", "proxy", 0),
        ("connection", "open", "agent", "stdio"),
    ]

    await proxy.close_stdin()
    assert await proxy.wait() == 0
    final = read_trace(trace)
    assert final[: len(live)] == live
    assert sorted(brief(r) for r in final[len(live) :]) == [
        ("connection", "closed", "agent", "stdio"),
        ("connection", "closed", "client", "stdio"),
    ]


async def test_a_held_message_is_traced_when_held_and_when_sent(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    """delay: a ``held`` record when the Agent's notification arrives, then the answer that
    overtook it, then the notification's ``message`` record, with the same ``hold``, when it was
    sent: the order of the trace is the order in which the Client read them."""
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            {
                "version": 1,
                "rules": [
                    {
                        "name": "late-update",
                        "when": {"direction": "to_client", "method": "_x/late"},
                        "do": {"action": "delay", "ms": 500},
                    }
                ],
            }
        )
    )
    trace = tmp_path / "trace.jsonl"
    agent = raw_agent(tmp_path / "agent.jsonl")
    proxy = await ProxyProcess.start(agent, "--faults", str(faults), "--trace", str(trace))
    proxies.append(proxy)
    late = notification("_x/late", {"sessionId": SESSION})
    await proxy.send(say(late), request("fast", "_x/fast"))
    assert json.loads(await proxy.recv())["id"] == "fast"
    assert await proxy.recv() == late
    await proxy.close_stdin()
    assert await proxy.wait() == 0

    to_client = [r for r in read_trace(trace) if r.get("direction") == "to_client"]
    assert [(r["event"], r["method"], r.get("disposition")) for r in to_client] == [
        ("fault", "_x/late", None),
        ("held", "_x/late", None),
        ("message", "_x/fast", "relayed"),
        ("message", "_x/late", "relayed"),
    ]
    _, held, answer, sent = to_client
    assert {k: v for k, v in held.items() if k not in ("time", "link", "hold")} == {
        "event": "held",
        "rules": ["late-update"],
        "delay_ms": 500.0,
        "direction": "to_client",
        "kind": "notification",
        "method": "_x/late",
        "session": SESSION,
        "id": None,
        "forwarded_id": None,
        "size": len(late),
    }
    assert sent["hold"] == held["hold"]
    assert "hold" not in answer
    assert held["time"] <= answer["time"] <= sent["time"]
    # The hold counts from the message's arrival, a moment before its held record is written.
    assert sent["time"] - held["time"] >= 0.4


def test_held_stopped_and_undeliverable_records() -> None:
    """What each record carries: the hold with its rules and delay; a copy marked; a message a
    fault stopped with its disposition and rule; a held message that found its peer gone."""
    prompt = Relayed(
        direction=Direction.TO_AGENT,
        kind=Kind.REQUEST,
        method="session/prompt",
        session="S",
        size=90,
        original_id=b'"p1"',
        forwarded_id=b"4",
        copy=True,
    )
    held = trace_record(Held(hold=7, rules=("slow", "twice"), delay=0.25, relayed=prompt), 3, 5.0)
    assert held == {
        "time": 5.0,
        "link": 3,
        "event": "held",
        "hold": 7,
        "rules": ["slow", "twice"],
        "delay_ms": 250.0,
        "direction": "to_agent",
        "kind": "request",
        "method": "session/prompt",
        "session": "S",
        "id": "p1",
        "forwarded_id": 4,
        "size": 90,
        "copy": True,
    }
    sent = trace_record(Relayed(**{**_fields(prompt), "hold": 7}), 3, 5.25)
    assert sent is not None
    assert (sent["event"], sent["disposition"], sent["hold"], sent["copy"]) == (
        "message",
        "relayed",
        7,
        True,
    )
    stopped = Stopped(
        direction=Direction.TO_CLIENT,
        kind=Kind.RESPONSE,
        method="session/prompt",
        session="S",
        size=40,
        original_id=b'"p1"',
        forwarded_id=b"4",
        rule="lose",
        disposition="dropped",
    )
    assert trace_record(stopped, 3, 6.0) == {
        "time": 6.0,
        "link": 3,
        "event": "message",
        "disposition": "dropped",
        "direction": "to_client",
        "kind": "response",
        "method": "session/prompt",
        "session": "S",
        "id": "p1",
        "forwarded_id": 4,
        "size": 40,
        "rule": "lose",
    }
    lost = Undeliverable(
        direction=Direction.TO_AGENT,
        kind=Kind.REQUEST,
        size=90,
        method="session/prompt",
        session="S",
        original_id=b'"p1"',
        forwarded_id=b"4",
        hold=7,
    )
    record = trace_record(lost, 3, 7.0)
    assert record is not None
    assert (record["disposition"], record["method"], record["id"], record["hold"]) == (
        "undeliverable",
        "session/prompt",
        "p1",
        7,
    )


def _fields(relayed: Relayed) -> dict[str, Any]:
    return {name: getattr(relayed, name) for name in Relayed.__dataclass_fields__}


def trace_record(observation: Observation, link: int, at: float) -> dict[str, Any] | None:
    """The JSON object of the observation's trace line."""
    record = record_of(observation, link, at)
    return None if record is None else as_json(record)


async def test_trace_to_stdout_is_refused_in_stdio_mode(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    """--trace - with a stdio Client: exit 2 (stdout is the protocol), the Agent never started."""
    marker = tmp_path / "agent-ran"
    proxy = await ProxyProcess.start(
        [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], "--trace", "-"
    )
    proxies.append(proxy)
    assert await proxy.at_eof()
    assert await proxy.wait() == 2
    assert "stdout is the protocol channel" in " ".join(proxy.stderr.split())
    assert not marker.exists()


async def test_trace_to_stdout_with_a_network_listener(proxies: list[ProxyProcess]) -> None:
    """--trace - with a listener: the records go to stdout, the header first."""
    proxy = await ProxyProcess.start(
        ["true"], "--log-format", "json", "--listen", "ws://127.0.0.1:0/acp", "--trace", "-"
    )
    proxies.append(proxy)
    header = await proxy.recv_json()
    assert (header["event"], header["version"]) == ("trace", 1)


def test_lone_surrogates_from_a_peer_are_written_readably(tmp_path: Path) -> None:
    """A method or session holding a lone surrogate (valid JSON) is a trace line every JSON
    reader takes, with the surrogate spelled out, not an exception in the middle of relaying."""
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, clock=lambda: 5.0)
    writer.observe(
        Relayed(
            direction=Direction.TO_AGENT,
            kind=Kind.REQUEST,
            method="x/\ud800",
            session="\udc00",
            size=9,
            original_id=b"1",
            forwarded_id=b"0",
        )
    )
    writer.close()
    record = orjson.loads(path.read_bytes().splitlines()[-1])
    assert (record["method"], record["session"], record["id"]) == ("x/\\ud800", "\\udc00", 1)


def test_keyed_attempts_and_messages_are_recorded(tmp_path: Path) -> None:
    """The ledger's keyed attempts and the messages named for their keys: what ``report`` needs
    to judge a key across proxies."""
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, clock=lambda: 5.0)
    writer.observe(KeyedAttempt(session="S", retry=True, key="K1", prompt="0123abcd"), 3)
    writer.observe(KeyedMessage(session="S", key="K1", message_id="M1", via="insert"), 3)
    writer.close()
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()[1:]]
    assert records == [
        {
            "time": 5.0,
            "link": 3,
            "event": "keyed",
            "session": "S",
            "key": "K1",
            "prompt": "0123abcd",
            "retry": True,
        },
        {
            "time": 5.0,
            "link": 3,
            "event": "keyed_message",
            "session": "S",
            "key": "K1",
            "message_id": "M1",
            "via": "insert",
        },
    ]


def test_notifications_relayed_together_are_a_record_each(tmp_path: Path) -> None:
    """A run of notifications the relay forwarded at once is traced as each alone would be; the
    tally counts them the same way too."""
    raws = [
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S%d"}}' % n
        for n in range(3)
    ]
    run = RelayedRun(
        direction=Direction.TO_CLIENT,
        method="session/update",
        size=sum(map(len, raws)),
        raws=raws,
        bodies=[orjson.loads(raw) for raw in raws],
    )
    paths = tmp_path / "together.jsonl", tmp_path / "alone.jsonl"
    together, alone = (TraceWriter(path, clock=lambda: 5.0) for path in paths)
    together.observe(run, 2)
    for relayed in run.each():
        alone.observe(relayed, 2)
    together.close()
    alone.close()
    lines = paths[0].read_bytes().splitlines()
    assert lines == paths[1].read_bytes().splitlines()
    assert [orjson.loads(line)["session"] for line in lines[1:]] == ["S0", "S1", "S2"]
    tallies = Tally(), Tally()
    tallies[0].observe(run)
    for relayed in run.each():
        tallies[1].observe(relayed)
    assert tallies[0].counts == tallies[1].counts
    assert tallies[0].relayed_bytes == tallies[1].relayed_bytes
