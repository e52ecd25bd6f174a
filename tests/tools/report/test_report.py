"""``acp-proxy report``: summaries of real traces and of hand-written ones.

Real traces come from ``python -m proxy run --trace`` in front of the reference Agent, driven by
the test as a raw stdio Client: one proxy with four rules in front of the known-bad Agent (a lost
answer retried, an injected error, a duplicated request, a restart: two duplicate inserts found),
and two proxies on two "nodes" sharing the Agent's store (an answer lost on one node, the prompt
retried on the other: no finding). Hand-written JSONL files cover what a real run rarely shows:
a partial last line, clocks of two nodes interleaving, a proxy appending a second run to its
file, unknown events, empty and foreign files.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import ProxyProcess, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.records import event_of
from proxy.tools.report import (
    Summary,
    TraceReadError,
    TraceRecords,
    load_traces,
    render_text,
    report_main,
    summarize,
)
from proxy.tools.report.html import render_html
from proxy.tools.report.load import merge, read_trace

Predicate = Callable[[dict[str, Any]], bool]


def agent(*options: str) -> list[str]:
    """argv of the reference Agent with short turns."""
    return [sys.executable, "-m", "proxy", "agent", "--turn-ms", "1", *options]


class Client:
    """The test as a raw stdio Client of a proxy; every message it read is kept in ``seen``."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.seen: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.proxy.send_json({"jsonrpc": "2.0", **message})

    async def until(self, predicate: Predicate) -> dict[str, Any]:
        while True:
            message: dict[str, Any] = await self.proxy.recv_json()
            self.seen.append(message)
            if predicate(message):
                return message

    async def request(self, request_id: Any, method: str, params: Any) -> dict[str, Any]:
        await self.send({"id": request_id, "method": method, "params": params})
        return await self.until(lambda m: m.get("id") == request_id and "method" not in m)

    async def initialize(self) -> None:
        init = await self.request("init", "initialize", {"protocolVersion": 2, "capabilities": {}})
        assert init["result"]["protocolVersion"] == 2

    async def open(self) -> str:
        await self.initialize()
        new = await self.request("new", "session/new", {"cwd": "/p", "mcpServers": []})
        return str(new["result"]["sessionId"])

    async def idles(self, session: str, count: int, since: int) -> None:
        """Wait until ``count`` idle states of ``session`` were read from ``seen[since:]`` on."""

        def enough(_: dict[str, Any]) -> bool:
            return sum(is_idle(m, session) for m in self.seen[since:]) >= count

        if not enough({}):
            await self.until(enough)


def is_idle(message: dict[str, Any], session: str) -> bool:
    params = message.get("params")
    return (
        message.get("method") == "session/update"
        and isinstance(params, dict)
        and params.get("sessionId") == session
        and params["update"].get("sessionUpdate") == "state_update"
        and params["update"].get("state") == "idle"
    )


def prompt(session: str, text: str, key: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return params


def write_rules(path: Path, *rules: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"version": 1, "rules": list(rules)}))
    return path


def header(at: float) -> dict[str, Any]:
    return {"time": at, "event": "trace", "version": 1}


def prompt_request(
    at: float, link: int, request_id: Any, forwarded: int | None, session: str
) -> dict[str, Any]:
    return {
        "time": at,
        "link": link,
        "event": "message",
        "disposition": "relayed",
        "direction": "to_agent",
        "kind": "request",
        "method": "session/prompt",
        "session": session,
        "id": request_id,
        "forwarded_id": forwarded,
        "size": 120,
    }


def prompt_answer(
    at: float, link: int, request_id: Any, forwarded: int, session: str
) -> dict[str, Any]:
    return {
        **prompt_request(at, link, request_id, forwarded, session),
        "direction": "to_client",
        "kind": "response",
        "size": 60,
        "duration_ms": 1.5,
    }


def finding(at: float, check: str, key: str | None) -> dict[str, Any]:
    return {
        "time": at,
        "link": 1,
        "event": "finding",
        "check": check,
        "session": "S",
        "key": key,
        "detail": f"{check} seen",
    }


def relayed_row(summary: Summary, direction: str, kind: str, method: str) -> int:
    rows = [
        m["count"]
        for m in summary["messages"]["relayed"]
        if (m["direction"], m["kind"], m["method"]) == (direction, kind, method)
    ]
    return rows[0] if rows else 0


# -- real runs ------------------------------------------------------------------------------------


async def test_a_run_with_four_faults_and_a_known_bad_agent(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    """Faults by rule, a lost answer and its retry, an injected error, a copy, a restart, findings."""
    faults = write_rules(
        tmp_path / "faults.json",
        {
            "name": "lose-first-answer",
            "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "drop"},
        },
        {
            "name": "refuse-unkeyed",
            "when": {
                "direction": "to_agent",
                "kind": "request",
                "method": "session/prompt",
                "idempotency_key": "absent",
            },
            "do": {"action": "error", "code": -32603, "message": "injected"},
        },
        {
            "name": "copy-c",
            "when": {
                "direction": "to_agent",
                "kind": "request",
                "method": "session/prompt",
                "params": {"prompt": [{"text": "C"}]},
            },
            "do": {"action": "duplicate", "copies": 1},
        },
        {
            "name": "restart-now",
            "when": {"method": "_x/restart"},
            "do": {"action": "restart_proxy"},
        },
    )
    trace = tmp_path / "node-a.jsonl"
    proxy = await ProxyProcess.start(
        agent("--no-dedupe"), "--faults", str(faults), "--trace", str(trace)
    )
    proxies.append(proxy)
    client = Client(proxy)
    session = await client.open()

    mark = len(client.seen)
    await client.send(
        {"id": "p1", "method": "session/prompt", "params": prompt(session, "A", "K1")}
    )
    await client.idles(session, 1, mark)  # the turn ran; its answer was dropped
    retry = await client.request("p2", "session/prompt", prompt(session, "A", "K1"))
    assert "messageId" in retry["result"]  # the known-bad Agent inserted it again
    mark = len(client.seen)
    await client.idles(session, 1, mark)
    refused = await client.request("p3", "session/prompt", prompt(session, "B"))
    assert refused["error"]["code"] == -32603
    mark = len(client.seen)
    copied = await client.request("p4", "session/prompt", prompt(session, "C", "K3"))
    assert "messageId" in copied["result"]
    await client.idles(session, 2, mark)  # the copy's turn too: its answer was swallowed before
    await client.send({"method": "_x/restart"})
    barrier = await client.request("bar", "_x/barrier", {})
    assert barrier["error"]["code"] == -32600  # a fresh, uninitialised Agent answered
    await proxy.close_stdin()
    await proxy.wait()

    records = load_traces([trace])
    summary = summarize(records)
    assert json.loads(json.dumps(summary)) == summary  # JSON-ready
    totals = summary["totals"]
    assert (totals["files"], totals["skipped_lines"], totals["ignored_records"]) == (1, 0, 0)
    assert totals["records"] == len(records) == len(trace.read_text().splitlines())
    assert (totals["faults"], totals["restarts"], totals["prompts"], totals["retries"]) == (
        4,
        1,
        4,
        1,
    )
    assert (totals["findings"], totals["failing_findings"]) == (2, 2)
    assert summary["verdict"] == "failing"
    assert summary["faults"]["by_rule"] == [
        {"rule": "copy-c", "action": "duplicate", "count": 1, "nodes": [str(trace)]},
        {"rule": "lose-first-answer", "action": "drop", "count": 1, "nodes": [str(trace)]},
        {"rule": "refuse-unkeyed", "action": "error", "count": 1, "nodes": [str(trace)]},
        {"rule": "restart-now", "action": "restart_proxy", "count": 1, "nodes": [str(trace)]},
    ]
    # Messages: p1, p2, p4 and p4's copy went to the Agent; p2 and p4 were answered. Not
    # relayed: p3 (the proxy answered it), p1's answer (dropped), the copy's answer (swallowed).
    assert relayed_row(summary, "to_agent", "request", "session/prompt") == 4
    assert relayed_row(summary, "to_client", "response", "session/prompt") == 2
    assert relayed_row(summary, "to_client", "error", "_x/barrier") == 1
    assert summary["messages"]["not_relayed"] == [
        {
            "disposition": disposition,
            "direction": direction,
            "kind": kind,
            "method": "session/prompt",
            "reason": None,
            "count": 1,
        }
        for disposition, direction, kind in [
            ("answered_by_proxy", "to_agent", "request"),
            ("dropped", "to_client", "response"),
            ("swallowed", "to_client", "response"),
        ]
    ]
    assert totals["messages_not_relayed"] == 3
    assert ", 3 not relayed" in render_text(summary)
    assert summary["connections"] == [
        {"side": "agent", "transport": "stdio", "opened": 2, "closed": 2},
        {"side": "client", "transport": "stdio", "opened": 1, "closed": 1},
    ]
    assert summary["restarts"] == {
        "by_what": {"proxy": 1},
        "abandoned_requests": 0,
        "proxy_runs": 1,
    }
    # Prompts, reconstructed: one per request the Client sent, with its faults and outcome.
    prompts = summary["prompts"]
    assert (prompts["attempts"], prompts["copies"], prompts["swallowed_answers"]) == (4, 1, 1)
    assert prompts["by_outcome"] == {"answered": 2, "injected_error": 1, "lost": 1}
    by_id = {p["id"]: p for p in prompts["list"]}
    assert [by_id[i]["outcome"] for i in ("p1", "p2", "p3", "p4")] == [
        "lost",
        "answered",
        "injected_error",
        "answered",
    ]
    assert by_id["p1"]["lost_by"] == "drop (rule lose-first-answer)"
    assert [(f["rule"], f["on"]) for f in by_id["p1"]["faults"]] == [
        ("lose-first-answer", "answer")
    ]
    assert by_id["p3"]["relayed"] is False
    assert (by_id["p4"]["copies"], by_id["p4"]["swallowed_answers"]) == (1, 1)
    assert [p["retry"] for p in prompts["list"]] == [False, True, False, False]
    assert prompts["sessions"] == [
        {
            "session": session,
            "attempts": 4,
            "answered": 2,
            "errors": 1,
            "lost": 1,
            "unanswered": 0,
            "retries": 1,
            "nodes": [str(trace)],
            "keys_in_findings": ["K1", "K3"],
        }
    ]
    (retried,) = summary["retries"]["list"]
    assert (retried["id"], retried["lost_id"], retried["session"]) == ("p2", "p1", session)
    assert (retried["after"], retried["across_nodes"], retried["same_size"]) == (
        "drop (rule lose-first-answer)",
        False,
        True,
    )
    assert retried["delay_ms"] > 0
    assert retried["outcome"] == "answered"
    # The ledger's findings, as the proxy wrote them.
    findings = summary["findings"]
    assert findings["by_check"] == {"duplicate_insert": 2}
    assert sorted((f["session"], f["key"]) for f in findings["list"]) == [
        (session, "K1"),
        (session, "K3"),
    ]

    text, status = report_main([trace], as_json=False)
    assert status == 1
    assert text == render_text(summary)
    assert text.startswith("acp-proxy report: 1 trace file, ")
    assert text.index("Totals") < text.index("Faults injected") < text.index("Findings:")
    assert "findings     2 findings, 2 failing (duplicate_insert x2)" in text
    assert "faults       4 injected" in text
    assert "1 retry" in text
    assert "lose-first-answer  drop" in text
    assert "1 injected copy, 1 answer to copies swallowed" in text
    assert "proxy x1; 0 requests abandoned" in text
    as_json, status = report_main([trace], as_json=True)
    assert status == 1
    assert json.loads(as_json) == summary


async def retried_on_another_node(
    proxies: list[ProxyProcess], tmp_path: Path, *agent_b: str
) -> tuple[Path, Path, str]:
    """Node A loses the answer to a keyed prompt, the Client retries it on node B, whose Agent
    (given ``agent_b`` options) shares A's store; the two traces and the session."""
    store = str(tmp_path / "store")
    faults = write_rules(
        tmp_path / "faults.json",
        {
            "name": "lose-answer",
            "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
            "do": {"action": "drop"},
        },
    )
    trace_a, trace_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    node_a = await ProxyProcess.start(
        agent("--store", store), "--faults", str(faults), "--trace", str(trace_a)
    )
    proxies.append(node_a)
    node_b = await ProxyProcess.start(agent("--store", store, *agent_b), "--trace", str(trace_b))
    proxies.append(node_b)

    on_a = Client(node_a)
    session = await on_a.open()
    mark = len(on_a.seen)
    await on_a.send({"id": "p1", "method": "session/prompt", "params": prompt(session, "A", "K1")})
    await on_a.idles(session, 1, mark)  # inserted and stored; the answer never came
    await node_a.close_stdin()
    await node_a.wait()

    on_b = Client(node_b)
    await on_b.initialize()
    assert (await on_b.request("resume", "session/resume", {"sessionId": session, "cwd": "/p"}))[
        "result"
    ] == {}
    retry = await on_b.request("p1", "session/prompt", prompt(session, "A", "K1"))
    assert "messageId" in retry["result"]
    await node_b.close_stdin()
    await node_b.wait()
    return trace_a, trace_b, session


async def test_a_retry_on_another_node_is_seen_across_the_two_traces(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    """Node A loses the answer, the Client retries on node B (shared store): clean, one retry."""
    trace_a, trace_b, session = await retried_on_another_node(proxies, tmp_path)
    records = load_traces([trace_a, trace_b])
    times = [r.time for r in records]
    assert times == sorted(times)
    nodes = [r.node for r in records]
    assert nodes.index(str(trace_b)) < len(nodes) - 1 - nodes[::-1].index(
        str(trace_a)
    )  # interleaved
    assert all(isinstance(r.line, int) for r in records)
    summary = summarize(records)
    assert summary["verdict"] == "clean"
    totals = summary["totals"]
    assert (totals["files"], totals["faults"], totals["prompts"], totals["retries"]) == (2, 1, 2, 1)
    assert (totals["findings"], totals["prompts_lost"]) == (0, 1)
    assert [f["records"] for f in summary["files"]] == [
        len(trace_a.read_text().splitlines()),
        len(trace_b.read_text().splitlines()),
    ]
    # Both nodes numbered the link 1 and the prompt's forwarded id alike: still two requests.
    first, second = summary["prompts"]["list"]
    assert (first["node"], first["outcome"], second["node"], second["outcome"]) == (
        str(trace_a),
        "lost",
        str(trace_b),
        "answered",
    )
    assert (first["link"], first["forwarded_id"]) == (second["link"], second["forwarded_id"])
    assert second["faults"] == []
    (retried,) = summary["retries"]["list"]
    assert (retried["node"], retried["lost_node"], retried["across_nodes"]) == (
        str(trace_b),
        str(trace_a),
        True,
    )
    assert (retried["after"], retried["same_size"]) == ("drop (rule lose-answer)", True)
    assert summary["retries"]["across_nodes"] == 1
    assert summary["prompts"]["sessions"][0]["nodes"] == sorted([str(trace_a), str(trace_b)])

    text, status = report_main([trace_a, trace_b], as_json=False)
    assert status == 0
    assert text.startswith("acp-proxy report: 2 trace files, ")
    assert "findings     0 findings" in text
    assert text.rstrip().endswith("Findings: 0 findings")
    assert "1 retry (1 across nodes)" in text
    assert "a.jsonl (other node)" in text

    # The key, over both nodes: two attempts, one message, named on both sides.
    (key,) = summary["keys"]["list"]
    assert (key["session"], key["key"], key["attempts"], key["retries"]) == (session, "K1", 2, 1)
    assert key["nodes"] == sorted([str(trace_a), str(trace_b)])
    assert (key["prompts"], key["verdict"], len(key["message_ids"])) == (1, "one message", 1)
    assert key["message_nodes"] == {key["message_ids"][0]: sorted([str(trace_a), str(trace_b)])}
    assert retried["key"] == "K1"
    assert "Idempotency keys (over every node): 1 key: 1 retried, 1 seen by several nodes" in text


async def test_a_retry_run_again_on_another_node_is_a_duplicate_only_the_report_sees(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    """Node B's Agent ignores keys: each proxy saw one messageId, the merged traces see two."""
    trace_a, trace_b, session = await retried_on_another_node(proxies, tmp_path, "--no-dedupe")
    for trace in (trace_a, trace_b):  # neither ledger could tell
        events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
        assert "finding" not in events
        assert "keyed_message" in events
    # Alone, node A's trace shows a prompt lost and never sent again; B's, one answered.
    alone_a = summarize(load_traces([trace_a]))["findings"]["by_check"]
    assert alone_a == {"prompt_not_resent": 1}
    assert summarize(load_traces([trace_b]))["verdict"] == "clean"

    summary = summarize(load_traces([trace_a, trace_b]))
    assert summary["verdict"] == "failing"
    (finding,) = summary["findings"]["list"]
    assert (finding["check"], finding["session"], finding["key"]) == (
        "duplicate_insert",
        session,
        "K1",
    )
    assert (finding["by"], finding["node"], finding["warning"]) == ("report", None, False)
    assert finding["nodes"] == sorted([str(trace_a), str(trace_b)])
    assert finding["detail"].startswith("across nodes, one key, several messages: ['msg_")
    (key,) = summary["keys"]["list"]
    assert (key["verdict"], key["attempts"], len(key["message_ids"])) == ("duplicate", 2, 2)
    assert [key["message_nodes"][m] for m in key["message_ids"]] == [[str(trace_a)], [str(trace_b)]]
    assert summary["prompts"]["sessions"][0]["keys_in_findings"] == ["K1"]

    text, status = report_main([trace_a, trace_b], as_json=False)
    assert status == 1
    assert "Findings: 1 finding, 1 failing (duplicate_insert x1)" in text
    finding_line = text.splitlines()[-1]
    assert "duplicate_insert" in finding_line
    assert "a.jsonl, b.jsonl  across nodes" in finding_line

    # The page: the key's row, the finding on the timeline (both nodes), the retry linked across.
    records = load_traces([trace_a, trace_b])
    page = render_html(records, summarize(records))
    keys = page[page.index('<h2 id="keys">') : page.index('<h2 id="retries">')]
    assert '<tr class="failing">' in keys
    assert ">duplicate<" in keys
    assert "[a.jsonl, b.jsonl] \u2691 finding duplicate_insert" in page
    (link,) = re.findall(r'<path class="retry-link" data-from="(\d+)" data-to="(\d+)"', page)
    labels = dict(re.findall(r'id="row-(\d+)">.*?<text class="label"[^>]*>([^<]*)<', page))
    assert all(" key K1" in labels[row] for row in link)
    assert labels[link[1]].startswith("\u21ba retry of #" + link[0])


# -- hand-written traces ----------------------------------------------------------------------------


def test_a_partial_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    """A crash mid-write: the partial line and a garbled one are counted; the rest is read."""
    trace = tmp_path / "crashed.jsonl"
    write_jsonl(
        trace,
        header(1.0),
        {
            "time": 1.1,
            "link": 1,
            "event": "connection",
            "state": "open",
            "side": "client",
            "transport": "stdio",
        },
        "{this is not json",
        {
            "time": 1.2,
            "link": 1,
            "event": "fault",
            "rule": "r",
            "action": "drop",
            "direction": "to_agent",
            "kind": "notification",
            "method": "_x/a",
            "session": None,
            "id": None,
        },
    )
    with trace.open("a") as file:
        file.write('{"time": 1.3, "link": 1, "event": "mess')
    records = load_traces([trace])
    assert isinstance(records, TraceRecords)
    assert [(event_of(r.record), r.line) for r in records] == [
        ("trace", 1),
        ("connection", 2),
        ("fault", 4),
    ]
    summary = summarize(records)
    (info,) = summary["files"]
    assert (info["skipped_lines"], info["unreadable_lines"], info["partial_last_line"]) == (
        2,
        [3, 5],
        True,
    )
    assert (summary["totals"]["records"], summary["totals"]["skipped_lines"]) == (3, 2)
    assert summary["totals"]["faults"] == 1
    assert summary["notes"] == [
        f"{trace}: the last line is incomplete (the proxy stopped mid-write?)"
    ]
    text, status = report_main([trace], as_json=False)
    assert status == 0
    assert f"skipped 2 unreadable lines ({trace}:3, {trace}:5)" in text


def test_two_nodes_are_merged_by_time_each_file_in_its_own_order(tmp_path: Path) -> None:
    """Equal times keep the order of the files given; a clock that steps back reorders nothing."""

    def event(at: float) -> dict[str, Any]:
        return {
            "time": at,
            "link": 1,
            "event": "connection",
            "state": "open",
            "side": "agent",
            "transport": "ws",
        }

    a = write_jsonl(tmp_path / "a.jsonl", header(10), event(11), event(13), event(15), event(12.5))
    b = write_jsonl(tmp_path / "b.jsonl", header(10), event(12), event(13), event(14))
    records = load_traces([a, b])
    assert [(Path(r.node).stem, r.time, r.line) for r in records] == [
        ("a", 10, 1),
        ("b", 10, 1),
        ("a", 11, 2),
        ("b", 12, 2),
        ("a", 13, 3),
        ("b", 13, 3),
        ("b", 14, 4),
        ("a", 15, 4),
        ("a", 12.5, 5),
    ]
    assert [r.node for r in load_traces([b, a])][:2] == [str(b), str(a)]
    assert len(load_traces([a, a])) == 5  # a file given twice is read once
    summary = summarize(records)
    assert summary["span"] == {"start": 10, "end": 15, "seconds": 5}
    assert [(f["node"], f["records"], f["runs"]) for f in summary["files"]] == [
        (str(a), 5, 1),
        (str(b), 4, 1),
    ]
    assert summary["connections"] == [
        {"side": "agent", "transport": "ws", "opened": 7, "closed": 0}
    ]


def test_a_prompt_lost_to_a_restart_is_retried_on_another_node(tmp_path: Path) -> None:
    """Loss by restart on node a, retry on node b; the same link and ids on b are not a's."""
    a = write_jsonl(
        tmp_path / "a.jsonl",
        header(1.0),
        prompt_request(1.5, 1, 5, 3, "S"),
        prompt_request(1.6, 1, 6, 4, "T"),
        {
            "time": 1.9,
            "link": 1,
            "event": "connection",
            "state": "closed",
            "side": "agent",
            "transport": "stdio",
        },
        {"time": 2.0, "link": 1, "event": "restart", "what": "proxy", "abandoned": 2},
    )
    b = write_jsonl(
        tmp_path / "b.jsonl",
        header(0.5),
        prompt_request(3.0, 1, 7, 3, "S"),
        prompt_answer(3.1, 1, 7, 3, "S"),
        prompt_request(3.2, 1, 8, 4, "U"),
        prompt_answer(3.3, 1, 8, 4, "U"),
    )
    summary = summarize(load_traces([a, b]))
    outcomes = [
        (Path(p["node"]).stem, p["id"], p["outcome"], p["lost_by"])
        for p in summary["prompts"]["list"]
    ]
    assert outcomes == [
        ("a", 5, "lost", "restart (proxy)"),
        ("a", 6, "lost", "restart (proxy)"),
        ("b", 7, "answered", None),
        ("b", 8, "answered", None),
    ]
    (retried,) = summary["retries"]["list"]
    assert (retried["session"], retried["id"], retried["lost_id"]) == ("S", 7, 5)
    assert (retried["across_nodes"], retried["delay_ms"], retried["same_size"]) == (
        True,
        1100.0,
        True,
    )
    assert retried["after"] == "restart (proxy)"
    assert summary["restarts"]["abandoned_requests"] == 2
    assert [(s["session"], s["lost"], s["retries"]) for s in summary["prompts"]["sessions"]] == [
        ("S", 1, 1),
        ("T", 1, 0),
        ("U", 0, 0),
    ]


def keyed(at: float, key: str, prompt: str = "P", *, retry: bool = False) -> dict[str, Any]:
    """The ledger's record of a keyed prompt on link 1 of session S (it precedes the request)."""
    return {
        "time": at,
        "link": 1,
        "event": "keyed",
        "session": "S",
        "key": key,
        "prompt": prompt,
        "retry": retry,
    }


def answer_dropped(at: float, request_id: int) -> dict[str, Any]:
    """The trace record of a ``drop`` of the answer to prompt ``request_id`` (link 1, S)."""
    return {
        "time": at,
        "link": 1,
        "event": "fault",
        "rule": "lose",
        "action": "drop",
        "direction": "to_client",
        "kind": "response",
        "method": "session/prompt",
        "session": "S",
        "id": request_id,
    }


def keyed_message(at: float, key: str, message_id: str) -> dict[str, Any]:
    return {
        "time": at,
        "link": 1,
        "event": "keyed_message",
        "session": "S",
        "key": key,
        "message_id": message_id,
        "via": "answer",
    }


def test_keys_are_judged_over_the_runs_of_one_proxy(tmp_path: Path) -> None:
    """A proxy restarted without --state forgot the key: its second run's messageId is another."""
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(1.0),
        keyed(1.1, "K"),
        prompt_request(1.1, 1, 1, 1, "S"),
        keyed_message(1.2, "K", "m1"),
        header(2.0),  # the process started again
        keyed(2.1, "K"),  # a fresh ledger: not a retry to it
        prompt_request(2.1, 1, 1, 1, "S"),
        keyed_message(2.2, "K", "m2"),
        prompt_answer(2.2, 1, 1, 1, "S"),
    )
    summary = summarize(load_traces([trace]))
    (found,) = summary["findings"]["list"]
    assert (found["check"], found["key"], found["by"], found["time"]) == (
        "duplicate_insert",
        "K",
        "report",
        2.2,
    )
    assert found["detail"] == "across proxy runs, one key, several messages: ['m1', 'm2']"
    assert found["nodes"] == [str(trace)]
    (key,) = summary["keys"]["list"]
    assert (key["attempts"], key["proxy_runs"], key["message_ids"]) == (2, 2, ["m1", "m2"])
    # The first attempt was cut by the restart; the second retries it, though no fault is seen.
    (retried,) = summary["retries"]["list"]
    assert (retried["key"], retried["after"]) == ("K", "the proxy process started again")
    assert report_main([trace], as_json=False)[1] == 1


def test_a_key_with_another_prompt_on_another_node_and_no_repeats(tmp_path: Path) -> None:
    """Key K changes prompt between nodes (found by the report); key L's duplicate was already
    found by node b's ledger (not repeated); key M is answered alike on both nodes (clean)."""
    a = write_jsonl(
        tmp_path / "a.jsonl",
        header(1.0),
        keyed(1.1, "K", "P1"),
        keyed(1.2, "L"),
        keyed_message(1.3, "L", "l1"),
        keyed(1.4, "M"),
        keyed_message(1.5, "M", "m1"),
    )
    b = write_jsonl(
        tmp_path / "b.jsonl",
        header(1.0),
        keyed(2.1, "K", "P2"),
        keyed(2.2, "L"),
        keyed_message(2.3, "L", "l1"),
        keyed_message(2.3, "L", "l2"),
        finding(2.3, "duplicate_insert", "L"),
        keyed(2.4, "M"),
        keyed_message(2.5, "M", "m1"),
    )
    summary = summarize(load_traces([a, b]))
    found = [(f["check"], f["key"], f["by"]) for f in summary["findings"]["list"]]
    assert found == [
        ("key_reused_other_prompt", "K", "report"),
        ("duplicate_insert", "L", "proxy"),
    ]
    reused = summary["findings"]["list"][0]
    assert reused["detail"] == "across nodes, one key came with 2 different prompts"
    assert (reused["time"], reused["node"], reused["nodes"]) == (2.1, None, [str(a), str(b)])
    verdicts = {
        k["key"]: (k["verdict"], k["prompts"], k["attempts"]) for k in summary["keys"]["list"]
    }
    assert verdicts == {
        "K": ("no messageId seen", 2, 2),
        "L": ("duplicate", 1, 2),
        "M": ("one message", 1, 2),
    }
    assert (summary["keys"]["duplicates"], summary["keys"]["across_nodes"]) == (1, 3)
    assert summary["totals"]["keys"] == 3


def test_a_new_key_after_a_loss_is_a_new_prompt_and_an_old_key_a_retry(tmp_path: Path) -> None:
    """Keyed attempts are joined by key: a fresh key is no retry even right after a loss, and a
    known key is a retry even with no loss in the trace (the Client's own timeout)."""
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(1.0),
        keyed(1.1, "K1"),
        prompt_request(1.1, 1, 1, 1, "S"),
        answer_dropped(1.3, 1),
        keyed(1.5, "K2"),  # a new prompt after the loss: not a retry
        prompt_request(1.5, 1, 2, 2, "S"),
        prompt_answer(1.6, 1, 2, 2, "S"),
        keyed(2.0, "K2", retry=True),  # K2 again, though its answer came: a retry all the same
        prompt_request(2.0, 1, 3, 3, "S"),
        prompt_answer(2.1, 1, 3, 3, "S"),
    )
    summary = summarize(load_traces([trace]))
    assert [(p["id"], p["key"], p["retry"]) for p in summary["prompts"]["list"]] == [
        (1, "K1", False),
        (2, "K2", False),
        (3, "K2", True),
    ]
    (retried,) = summary["retries"]["list"]
    assert (retried["id"], retried["lost_id"], retried["after"]) == (
        3,
        2,
        "no loss the trace shows",
    )
    assert retried["delay_ms"] == 500.0


def test_a_lost_prompt_never_sent_again_is_a_finding(tmp_path: Path) -> None:
    """The input a Client dropped silently (the RFD: Clients SHOULD resend a pending prompt): a
    lost prompt that no later attempt retried is a failing finding of the report, with or
    without keys; a lossy trace with no key at all says that retries were only guessed."""
    keyed_trace = write_jsonl(
        tmp_path / "keyed.jsonl",
        header(1.0),
        keyed(1.1, "K1"),
        prompt_request(1.1, 1, 1, 1, "S"),
        answer_dropped(1.3, 1),
        keyed(1.5, "K2"),  # a new prompt, not K1 again: K1's input is gone
        prompt_request(1.5, 1, 2, 2, "S"),
        prompt_answer(1.6, 1, 2, 2, "S"),
    )
    summary = summarize(load_traces([keyed_trace]))
    (found,) = summary["findings"]["list"]
    assert (found["check"], found["key"], found["by"], found["warning"]) == (
        "prompt_not_resent",
        "K1",
        "report",
        False,
    )
    assert found["detail"].startswith(
        "the answer to the prompt of id 1 was lost, by drop (rule lose); the"
    )
    assert (summary["verdict"], summary["notes"]) == ("failing", [])
    text, status = report_main([keyed_trace], as_json=False)
    assert status == 1
    assert "prompt_not_resent" in text

    retried = write_jsonl(
        tmp_path / "retried.jsonl",
        header(1.0),
        keyed(1.1, "K1"),
        prompt_request(1.1, 1, 1, 1, "S"),
        answer_dropped(1.3, 1),
        keyed(1.5, "K1", retry=True),
        prompt_request(1.5, 1, 2, 2, "S"),
        prompt_answer(1.6, 1, 2, 2, "S"),
    )
    summary = summarize(load_traces([retried]))
    assert (summary["findings"]["count"], summary["notes"]) == (0, [])

    unkeyed = write_jsonl(
        tmp_path / "unkeyed.jsonl",
        header(1.0),
        prompt_request(1.1, 1, 1, 1, "S"),
        answer_dropped(1.3, 1),
    )
    summary = summarize(load_traces([unkeyed]))
    assert summary["findings"]["by_check"] == {"prompt_not_resent": 1}
    assert summary["notes"] == [
        "no prompt carried an idempotencyKey: a resend cannot be told from a new prompt, so "
        "retries are judged by session and time only"
    ]


def test_a_keyed_resend_before_its_original_was_lost_is_timed_from_the_original(
    tmp_path: Path,
) -> None:
    """The Client resent (its own timeout) before the original's answer was dropped: the retry
    is timed from the original request, never from the later loss (no negative delay)."""
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(1.0),
        keyed(1.1, "K1"),
        prompt_request(1.1, 1, 1, 1, "S"),
        keyed(2.0, "K1", retry=True),
        prompt_request(2.0, 1, 2, 2, "S"),
        answer_dropped(2.5, 1),
        prompt_answer(2.6, 1, 2, 2, "S"),
    )
    summary = summarize(load_traces([trace]))
    (retried,) = summary["retries"]["list"]
    assert (retried["id"], retried["lost_id"], retried["after"]) == (
        2,
        1,
        "no loss the trace shows",
    )
    assert retried["delay_ms"] == 900.0


def test_a_second_run_appended_to_a_file_starts_afresh(tmp_path: Path) -> None:
    """A proxy restarted for real appends a header: its links and ids are new ones."""
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(1.0),
        prompt_request(1.1, 1, 1, 0, "S"),
        header(2.0),
        prompt_request(2.1, 1, 1, 0, "S"),
        prompt_answer(2.2, 1, 1, 0, "S"),
    )
    summary = summarize(load_traces([trace]))
    assert summary["restarts"]["proxy_runs"] == 2
    assert f"{trace}: 2 proxy runs appended to one file" in summary["notes"][0]
    first, second = summary["prompts"]["list"]
    assert (first["outcome"], first["lost_by"]) == ("lost", "the proxy process started again")
    assert (second["outcome"], second["retry"]) == ("answered", True)


def test_a_resend_under_the_same_id_after_a_dropped_request_is_a_retry(tmp_path: Path) -> None:
    """drop and error never forward: the relayed request that follows is the Client's resend."""
    dropped = {
        "time": 1.0,
        "link": 1,
        "event": "fault",
        "rule": "lose-request",
        "action": "drop",
        "direction": "to_agent",
        "kind": "request",
        "method": "session/prompt",
        "session": "S",
        "id": 9,
    }
    delayed = {**dropped, "time": 2.0, "rule": "slow", "action": "delay"}
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(0.5),
        dropped,
        prompt_request(1.5, 1, 9, 0, "S"),
        prompt_answer(1.6, 1, 9, 0, "S"),
        {**delayed, "id": 10},
        prompt_request(2.0, 1, 12, 1, "S"),  # not the delayed request: its id differs
        {**delayed, "id": 11},
        {**delayed, "id": 11, "rule": "slower"},  # continue: true, a second rule on it
        prompt_request(2.0, 1, 11, 2, "S"),
        prompt_answer(2.5, 1, 11, 2, "S"),
    )
    summary = summarize(load_traces([trace]))
    assert [
        (p["id"], p["relayed"], [f["rule"] for f in p["faults"]], p["outcome"], p["retry"])
        for p in summary["prompts"]["list"]
    ] == [
        (9, False, ["lose-request"], "lost", False),
        (9, True, [], "answered", True),
        (10, False, ["slow"], "unanswered", False),
        (12, True, [], "unanswered", False),
        (11, True, ["slow", "slower"], "answered", False),
    ]
    (retried,) = summary["retries"]["list"]
    assert (retried["after"], retried["delay_ms"], retried["same_size"]) == (
        "drop (rule lose-request)",
        500.0,
        None,
    )


def note(at: float, link: int, method: str, **fields: Any) -> dict[str, Any]:
    """A ``message`` record of a notification to the Client (relayed unless told)."""
    return {
        "time": at,
        "link": link,
        "event": "message",
        "disposition": "relayed",
        "direction": "to_client",
        "kind": "notification",
        "method": method,
        "session": "S",
        "id": None,
        "forwarded_id": None,
        "size": 40,
        **fields,
    }


def held(at: float, link: int, hold: int, rules: list[str], base: dict[str, Any]) -> dict[str, Any]:
    """The ``held`` record of the message ``base`` names, held 500 ms by ``rules``."""
    fields = {k: v for k, v in base.items() if k not in ("event", "disposition", "duration_ms")}
    return {
        **fields,
        "time": at,
        "link": link,
        "event": "held",
        "hold": hold,
        "rules": rules,
        "delay_ms": 500.0,
    }


def fault_on(at: float, rule: str, action: str, base: dict[str, Any]) -> dict[str, Any]:
    """The ``fault`` record of ``rule`` on the message ``base`` names."""
    return {
        "time": at,
        "link": base["link"],
        "event": "fault",
        "rule": rule,
        "action": action,
        "direction": base["direction"],
        "kind": base["kind"],
        "method": base["method"],
        "session": base["session"],
        "id": base["id"],
    }


def test_a_reordered_message_counts_the_time_it_was_really_held(tmp_path: Path) -> None:
    """A reorder's ``delay_ms`` is its cap (``max_ms``): overtaken after 2 ms, the message was
    held 2 ms, and the held table says so (a delay's hold is its planned length)."""
    late = note(1.002, 1, "_x/chunk")
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(0.5),
        fault_on(1.0, "shuffle", "reorder", late),
        {**held(1.0, 1, 3, ["shuffle"], late), "delay_ms": 700.0},
        note(1.001, 1, "_x/chunk"),
        {**late, "hold": 3},
    )
    [row] = summarize(load_traces([trace]))["messages"]["held"]
    assert row["delay_ms"] == pytest.approx({"min": 2.0, "median": 2.0, "max": 2.0})
    assert (row["count"], row["sent"]) == (1, 1)


def test_held_messages_count_when_they_left_and_those_never_sent_are_not_relayed(
    tmp_path: Path,
) -> None:
    """A held notification is relayed once, at its delivery; every message that did not go on is
    counted as not relayed: a drop, an error answered by the proxy, a held message whose peer had
    gone, one a restart discarded, one still held when the trace ended."""
    late = note(1.5, 1, "_x/late")
    fast = {**prompt_answer(1.1, 1, "f", 1, "S"), "method": "_x/fast"}
    dropped = note(1.6, 1, "_x/b", disposition="dropped", rule="lose")
    refused = {
        **prompt_request(1.7, 1, 5, None, "S"),
        "method": "_x/r",
        "disposition": "answered_by_proxy",
        "rule": "refuse",
    }
    question = {**prompt_request(2.0, 1, 6, 3, "S"), "method": "_x/q"}
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(0.5),
        fault_on(1.0, "late", "delay", late),
        held(1.0, 1, 3, ["late"], late),
        fast,  # the answer that overtook it
        {**late, "hold": 3},  # sent when its timer fired
        fault_on(1.6, "lose", "drop", dropped),
        dropped,
        fault_on(1.7, "refuse", "error", refused),
        refused,
        held(2.0, 1, 4, ["slow-q"], question),
        {**question, "time": 2.5, "disposition": "undeliverable", "hold": 4},
        held(2.6, 2, 0, ["late"], {**late, "link": 2}),
        {"time": 2.7, "link": 2, "event": "restart", "what": "agent", "abandoned": 0},
        held(2.8, 1, 5, ["late"], late),
    )
    summary = summarize(load_traces([trace]))
    totals = summary["totals"]
    assert (totals["messages_relayed"], totals["bytes_relayed"]) == (2, 100)
    assert totals["messages_not_relayed"] == 5
    assert (totals["messages_held"], totals["messages_held_sent"]) == (4, 1)
    assert totals["ignored_records"] == 0
    assert relayed_row(summary, "to_client", "notification", "_x/late") == 1
    assert [
        (m["disposition"], m["direction"], m["method"], m["reason"], m["count"])
        for m in summary["messages"]["not_relayed"]
    ] == [
        ("answered_by_proxy", "to_agent", "_x/r", None, 1),
        ("dropped", "to_client", "_x/b", None, 1),
        ("never_sent", "to_client", "_x/late", "a restart discarded it", 1),
        ("never_sent", "to_client", "_x/late", "still held when the trace ended", 1),
        ("undeliverable", "to_agent", "_x/q", None, 1),
    ]
    assert summary["messages"]["held"] == [
        {
            "direction": "to_agent",
            "kind": "request",
            "method": "_x/q",
            "rules": "slow-q",
            "count": 1,
            "sent": 0,
            "not_sent": 1,
            "delay_ms": {"min": 500.0, "median": 500.0, "max": 500.0},
        },
        {
            "direction": "to_client",
            "kind": "notification",
            "method": "_x/late",
            "rules": "late",
            "count": 3,
            "sent": 1,
            "not_sent": 2,
            "delay_ms": {"min": 100.0, "median": 500.0, "max": 500.0},  # the restart's at 2.7
        },
    ]
    text = render_text(summary)
    assert (
        "  messages     2 relayed (100 bytes), 5 not relayed, 4 held by rules "
        "(1 sent when released)"
    ) in text
    held_section = text.split(
        "Messages held by rules (delay, reorder, bandwidth, stall, hold, spaced copies)\n"
    )[1]
    assert held_section.splitlines()[2].split() == [
        "to_client",
        "notification",
        "_x/late",
        "late",
        "3",
        "1",
        "2",
        "500.0",
        "500.0",
    ]
    output, status = report_main([trace], as_json=True)
    assert (status, json.loads(output)["totals"]["messages_not_relayed"]) == (0, 5)


def test_the_drops_and_link_ends_of_a_hold_rule_close_its_holds(tmp_path: Path) -> None:
    """A ``hold`` rule's message dropped over the control API is not relayed once (its
    ``dropped`` message record), not also never sent; one its link's end discarded is never
    sent, for that reason, and was held until then (not its planned 500 ms); one edited is
    sent."""
    dropped, lost, edited = note(1.0, 1, "_x/d"), note(1.0, 1, "_x/l"), note(1.0, 1, "_x/e")

    def ended(at: float, hold: int, outcome: str, base: dict[str, Any]) -> dict[str, Any]:
        return {"time": at, "link": base["link"], "event": "held_ended", "held_id": hold,
                "hold": hold, "outcome": outcome, "rule": "bp"}  # fmt: skip

    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(0.5),
        {**held(1.0, 1, 1, ["bp"], dropped), "held_id": 1, "then": "release"},
        {**held(1.0, 1, 2, ["bp"], lost), "held_id": 2, "then": "release"},
        {**held(1.0, 1, 3, ["bp"], edited), "held_id": 3, "then": "release"},
        ended(1.1, 1, "drop", dropped),
        {**dropped, "time": 1.1, "disposition": "dropped", "rule": "bp"},
        ended(1.2, 3, "edit", edited),
        {**edited, "time": 1.2, "hold": 3},
        ended(1.3, 2, "link_end", lost),
    )
    summary = summarize(load_traces([trace]))
    assert summary["totals"]["messages_not_relayed"] == 2
    assert [
        (m["disposition"], m["method"], m["reason"]) for m in summary["messages"]["not_relayed"]
    ] == [
        ("dropped", "_x/d", None),
        ("never_sent", "_x/l", "its link ended while it was held"),
    ]
    sent = {row["method"]: (row["count"], row["sent"]) for row in summary["messages"]["held"]}
    assert sent == {"_x/d": (1, 0), "_x/e": (1, 1), "_x/l": (1, 0)}
    lasted = {row["method"]: row["delay_ms"] for row in summary["messages"]["held"]}
    assert lasted["_x/l"] == {"min": 300.0, "median": 300.0, "max": 300.0}  # to its link's end


def test_a_held_prompt_and_its_spaced_copy_join_their_attempt_by_the_hold(tmp_path: Path) -> None:
    """A delayed prompt is relayed after another prompt overtook it: one attempt, joined to its
    fault by the ``held`` record, whose key is the one named just before its delivery; a copy
    spaced by ``gap_ms`` is a copy of its attempt, not another attempt. A held prompt whose Agent
    was gone when its timer fired is lost."""
    slow = prompt_request(1.5, 1, "p1", 0, "S")
    late = prompt_request(3.0, 1, "p5", 5, "S")
    copied = prompt_request(2.0, 1, "p3", 2, "S")
    copy = {**copied, "time": 2.05, "forwarded_id": 3, "copy": True, "hold": 7}
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(0.5),
        {**fault_on(1.0, "slow", "delay", slow), "id": "p1"},
        held(1.0, 1, 2, ["slow"], slow),
        prompt_request(1.1, 1, "p2", 1, "S"),  # sent later, relayed first
        {
            "time": 1.5,
            "link": 1,
            "event": "keyed",
            "session": "S",
            "key": "K1",
            "prompt": "d",
            "retry": False,
        },
        {**slow, "hold": 2},
        prompt_answer(1.6, 1, "p1", 0, "S"),
        fault_on(2.0, "twice", "duplicate", copied),
        copied,
        held(2.0, 1, 7, ["twice"], {**copy, "time": 2.0}),
        prompt_request(2.01, 1, "p4", 4, "S"),
        copy,
        prompt_answer(2.1, 1, "p3", 3, "S"),
        {**fault_on(3.0, "slow", "delay", late), "id": "p5"},
        held(3.0, 1, 8, ["slow"], late),
        {**late, "time": 3.5, "disposition": "undeliverable", "hold": 8},
    )
    summary = summarize(load_traces([trace]))
    assert [
        (p["id"], p["relayed"], [f["rule"] for f in p["faults"]], p["copies"], p["key"])
        for p in summary["prompts"]["list"]
    ] == [
        ("p1", True, ["slow"], 0, "K1"),
        ("p2", True, [], 0, None),
        ("p3", True, ["twice"], 1, None),
        ("p4", True, [], 0, None),
        ("p5", False, ["slow"], 0, None),
    ]
    by_id = {p["id"]: p for p in summary["prompts"]["list"]}
    assert (by_id["p1"]["outcome"], by_id["p1"]["time"], by_id["p3"]["outcome"]) == (
        "answered",
        1.0,
        "answered",
    )
    assert (by_id["p5"]["outcome"], by_id["p5"]["lost_by"]) == (
        "lost",
        "undeliverable (the agent's connection had closed)",
    )
    assert summary["totals"]["prompts"] == 5


def test_nodes_are_named_by_their_shortest_distinct_path(tmp_path: Path) -> None:
    """Two files of the same name: the text names them by directory too; JSON keeps the paths."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    fault = {
        "link": 1,
        "event": "fault",
        "rule": "r",
        "action": "drop",
        "direction": "to_client",
        "kind": "notification",
        "method": "_x/a",
        "session": None,
        "id": None,
    }
    x = write_jsonl(tmp_path / "x" / "t.jsonl", header(1.0), {"time": 1.5, **fault})
    y = write_jsonl(tmp_path / "y" / "t.jsonl", header(1.2), {"time": 1.7, **fault})
    text, status = report_main([x, y], as_json=False)
    assert status == 0
    assert "  r     drop        2  x/t.jsonl, y/t.jsonl" in text
    assert f"  x/t.jsonl        2              0     1  {x}" in text
    assert json.loads(report_main([x, y], as_json=True)[0])["faults"]["by_rule"][0]["nodes"] == [
        str(x),
        str(y),
    ]


def test_unknown_events_and_odd_records_are_ignored_not_fatal(tmp_path: Path) -> None:
    """Unknown events are counted apart, and the values a newer writer may add (a disposition,
    an invalid message's reason, an action, a check) are read as they are; a line that is no
    record of its event (no usable time or event, a field missing or of another type) is skipped
    and counted with its line number."""
    teleported = {
        **prompt_request(1.25, 1, "t", 9, "S"),
        "disposition": "teleported",
        "reason": "warped",
    }
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        {**header(1.0), "version": 2},
        {"time": 1.1, "event": "telemetry", "cpu": 3},
        {"time": 1.2, "event": "telemetry"},
        teleported,
        {**fault_on(1.26, "r", "throttle", teleported), "id": "t"},
        {**finding(1.27, "new_check", "K"), "by": "a newer ledger"},
        {"time": 1.3, "event": "message", "disposition": "teleported"},
        {"time": 1.4, "event": "message"},
        {"time": 1.5, "event": "fault"},
        {"time": "soon", "event": "message"},
        {"time": True, "event": "message"},
        {"time": 1.6},
        "[1, 2]",
        "",
    )
    summary = summarize(load_traces([trace]))
    totals = summary["totals"]
    assert (totals["records"], totals["skipped_lines"], totals["ignored_records"]) == (6, 7, 2)
    assert summary["files"][0]["unreadable_lines"] == [7, 8, 9, 10, 11, 12, 13]
    assert summary["ignored"] == {"telemetry": 2}
    assert summary["messages"]["by_disposition"] == {"teleported": 1}
    assert [(m["disposition"], m["reason"]) for m in summary["messages"]["not_relayed"]] == [
        ("teleported", "warped")
    ]
    assert summary["faults"]["by_rule"] == [
        {"rule": "r", "action": "throttle", "count": 1, "nodes": [str(trace)]}
    ]
    assert (summary["findings"]["by_check"], summary["findings"]["failing"]) == (
        {"new_check": 1},
        1,
    )
    assert summary["notes"] == [
        f"{trace}: trace version 2, this report reads version 1; read as far as it goes"
    ]
    text, status = report_main([trace], as_json=False)
    assert status == 1  # a check this version does not know still fails the run
    assert "ignored 2 records of unknown events (telemetry x2)" in text
    assert f"skipped 7 unreadable lines ({trace}:7, {trace}:8, {trace}:9, ...)" in text
    assert "note: " in text


def test_an_empty_file_and_a_bare_header(tmp_path: Path) -> None:
    """A bare header: nothing happened, zero everywhere, exit 0. Empty files alone: no proxy
    wrote to them, an error (exit 2), never a clean run; an empty file beside a trace is a
    note."""
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    bare = write_jsonl(tmp_path / "bare.jsonl", header(5.0))
    for paths in ([bare], [empty, bare]):
        text, status = report_main(paths, as_json=False)
        assert status == 0
        assert ", 1 record" in text.splitlines()[0]
        assert "findings     0 findings" in text
        assert "Findings: 0 findings" in text
    summary = summarize(load_traces([empty, bare]))
    assert summary["notes"] == [
        f"{empty}: the file is empty (no proxy wrote to it: was --trace given this path, and "
        "did the proxy start?)"
    ]
    assert summary["verdict"] == "clean"
    assert summarize(load_traces([bare]))["notes"] == []
    again = tmp_path / "again.jsonl"
    again.write_bytes(b"")
    for paths in ([empty], [empty, again]):
        text, status = report_main(paths, as_json=False)
        assert status == 2
        assert text.startswith(f"error: {empty}")
        assert "empty: no proxy wrote to" in text


def test_missing_unreadable_and_foreign_files_exit_2(tmp_path: Path) -> None:
    """A file that is not there, a directory, a file that is no trace: exit 2, named."""
    good = write_jsonl(tmp_path / "good.jsonl", header(1.0))
    missing = tmp_path / "missing.jsonl"
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello\nworld\n")
    assert report_main([good, missing], as_json=False) == (f"error: {missing}: no such file", 2)
    assert report_main([tmp_path], as_json=True) == (
        f"error: {tmp_path}: is a directory, not a trace file",
        2,
    )
    text, status = report_main([foreign], as_json=False)
    assert status == 2
    assert text.startswith(f"error: {foreign}: no trace records (line 1 ")
    assert report_main([], as_json=False)[1] == 2
    # A crash while the header itself was being written: only a partial line, not an error.
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"time": 1.0, "ev')
    text, status = report_main([partial], as_json=False)
    assert status == 0
    assert "skipped 1 unreadable line" in text


@pytest.mark.parametrize(
    ("checks", "status", "verdict", "phrase"),
    [
        ([], 0, "clean", "0 findings"),
        (["unkeyed_resend"], 0, "warnings", "1 finding, warnings only (unkeyed_resend x1)"),
        (
            ["unkeyed_resend", "duplicate_insert"],
            1,
            "failing",
            "2 findings, 1 failing (duplicate_insert x1, unkeyed_resend x1)",
        ),
    ],
)
def test_findings_decide_the_exit_status(
    tmp_path: Path, checks: list[str], status: int, verdict: str, phrase: str
) -> None:
    """Exit 1 on any finding but unkeyed_resend (a warning); each finding listed with its key."""
    lines = [
        finding(2.0 + i, check, None if check == "unkeyed_resend" else "K9")
        for i, check in enumerate(checks)
    ]
    trace = write_jsonl(tmp_path / "t.jsonl", header(1.0), *lines)
    text, code = report_main([trace], as_json=False)
    assert code == status
    assert f"Findings: {phrase}" in text
    summary = json.loads(report_main([trace], as_json=True)[0])
    assert summary["verdict"] == verdict
    assert [(f["check"], f["key"], f["warning"]) for f in summary["findings"]["list"]] == [
        (check, None if check == "unkeyed_resend" else "K9", check == "unkeyed_resend")
        for check in checks
    ]
    if "duplicate_insert" in checks:
        rows = [line.split()[1:4] for line in text.splitlines() if line.startswith("  +")]
        assert ["duplicate_insert", "S", "K9"] in rows
        assert "unkeyed_resend (warning)" in text


# -- any records --------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(), inner)),
    max_leaves=5,
)
REQUIRED: dict[str, list[str]] = {
    "message": ["direction", "kind"],
    "held": [
        "hold",
        "rules",
        "delay_ms",
        "direction",
        "kind",
        "method",
        "session",
        "id",
        "forwarded_id",
        "size",
    ],
    "fault": ["rule", "action", "direction", "kind", "method", "session", "id"],
    "keyed": ["session", "key", "prompt", "retry"],
    "keyed_message": ["session", "key", "message_id", "via"],
    "finding": ["check", "session", "key", "detail"],
    "trace": ["version"],
    "connection": ["state", "side", "transport"],
    "restart": ["what", "abandoned"],
    "reload": ["result", "rules"],
    "other": [],
}
"""The fields each event's record must have (a record without them is an unreadable line)."""
PLAUSIBLE: dict[str, list[Any]] = {
    "link": [1, 2],
    "session": ["S", "T"],
    "key": ["K", "L"],
    "prompt": ["P1", "P2"],
    "message_id": ["m1", "m2"],
    "direction": ["to_agent", "to_client"],
    "kind": ["request", "response", "error", "notification"],
    "method": ["session/prompt", "initialize"],
    "id": [1, 2, "p"],
    "forwarded_id": [1, 2],
    "action": ["drop", "duplicate", "error", "sever", "delay", "corrupt"],
    "disposition": ["relayed", "swallowed", "undeliverable", "dropped"],
    "hold": [0, 1],
    "rules": [["slow"], ["slow", "twice"], 3],
    "delay_ms": [500.0, 20],
    "check": ["duplicate_insert", "unkeyed_resend"],
    "state": ["open", "closed"],
    "side": ["client", "agent"],
    "retry": [True, False],
    "via": ["answer", "copy", "insert"],
    "size": [60, 120],
    "rule": ["r"],
    "detail": ["d"],
    "what": ["proxy", "agent"],
    "abandoned": [0, 2],
    "version": [1, 2],
    "transport": ["stdio", "ws"],
    "result": ["success", "error"],
    "duration_ms": [1.5],
    "copy": [True],
    "reason": ["invalid_json"],
}
FIELDS = [*PLAUSIBLE, "nodes", "by"]


@st.composite
def records(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Trace records with a numeric time and a string event, in time order, each of a node: the
    fields of their event most of the time (and others), mostly plausible, any JSON value now
    and then."""
    out, at = [], 0.0
    for _ in range(draw(st.integers(0, 25))):
        at += draw(st.sampled_from([0.0, 0.001, 0.5]))
        event = draw(st.sampled_from(list(REQUIRED)))
        record: dict[str, Any] = {"time": at, "event": event}
        names = draw(st.lists(st.sampled_from(FIELDS), max_size=12, unique=True))
        if draw(st.integers(0, 4)):
            names = [*REQUIRED[event], *names]
        for name in names:
            plausible = PLAUSIBLE.get(name)
            if plausible and draw(st.integers(0, 4)):
                record[name] = draw(st.sampled_from(plausible))
            else:
                record[name] = draw(json_values)
        record["node"] = draw(st.sampled_from(["a.jsonl", "b.jsonl"]))
        out.append(record)
    return out


def read_as_files(trace: list[dict[str, Any]]) -> TraceRecords:
    """The records as trace files, one per node, each line read and the files merged as
    :func:`load_traces` does (a file of unreadable lines only is left out, as report refuses it)."""
    lines: dict[str, list[bytes]] = {}
    for record in trace:
        fields = {name: value for name, value in record.items() if name != "node"}
        lines.setdefault(record["node"], []).append(json.dumps(fields).encode())
    streams, files = [], []
    for node, found in lines.items():
        try:
            entries, info = read_trace(node, b"\n".join(found) + b"\n")
        except TraceReadError:
            continue
        streams.append(entries)
        files.append(info)
    merged = TraceRecords(merge(streams))
    merged.files = files
    return merged


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_any_records_are_summarised_and_rendered(trace: list[dict[str, Any]]) -> None:
    """Whatever a trace holds, each line is read or counted unreadable, the summary is JSON and
    both renderings are made, never a crash."""
    entries = read_as_files(trace)
    summary = summarize(entries)
    json.dumps(summary)
    assert summary["totals"]["records"] + summary["totals"]["skipped_lines"] == sum(
        1 for record in trace if record["node"] in {info.node for info in entries.files}
    )
    assert render_text(summary).startswith("acp-proxy report: ")
    assert render_html(entries, summary).startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(("outcome", "lost"), [("drop", True), ("release", False)])
def test_a_prompts_answer_a_hold_rule_drops_is_lost(
    tmp_path: Path, outcome: str, lost: bool
) -> None:
    """A prompt's answer a ``hold`` rule held and then dropped (over the control API, or at its
    timeout) is lost, as a ``drop`` rule's is, naming the rule; one released is answered."""
    answer = prompt_answer(1.2, 1, "p1", 0, "S")
    held_answer = {**held(1.2, 1, 4, ["bp"], answer), "held_id": 1, "then": "release"}
    ended = {"time": 1.3, "link": 1, "event": "held_ended", "held_id": 1, "hold": 4,
             "outcome": outcome, "rule": "bp"}  # fmt: skip
    delivered = (
        {**answer, "time": 1.3, "disposition": "dropped", "rule": "bp"}
        if outcome == "drop"
        else {**answer, "time": 1.3, "hold": 4}
    )
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        header(1.0),
        prompt_request(1.1, 1, "p1", 0, "S"),
        held_answer,
        ended,
        delivered,
    )
    [attempt] = summarize(load_traces([trace]))["prompts"]["list"]
    if lost:
        assert (attempt["outcome"], attempt["lost_by"]) == (
            "lost",
            "answer dropped while held (bp)",
        )
    else:
        assert attempt["outcome"] == "answered"
