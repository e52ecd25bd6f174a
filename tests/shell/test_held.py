"""The messages ``hold`` rules hold, through a real proxy between the test (a stdio Client) and a
real Agent process: ``/api/held`` and its errors, release, drop and edit, the bound on holds, a
link that ends with one held, and the control client's ``wait_held``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import websockets
from control_calls import assert_error, call, off, raw
from harness import (
    INFLIGHT_BOUND_REACHED,
    TIMEOUT,
    Controlled,
    captured,
    encode,
    fault_file,
    log_events,
    raw_agent,
    request,
)
from stdio_scenario import barrier, lines_until_answer

from proxy.control import ControlClient, ControlError

HOLD_REFUSED = "hold refused: as many messages held as --max-held allows; the message goes on"


def hold(name: str = "bp", **do: Any) -> dict[str, Any]:
    """A rule holding the Client's ``_x/hold`` requests."""
    return {
        "name": name,
        "when": {"direction": "to_agent", "method": "_x/hold"},
        "do": {"action": "hold", "timeout_ms": 600_000, **do},
    }


async def held_proxy(
    controlled: Controlled, capture: Path, tmp_path: Path, *options: str, **do: Any
) -> tuple[Any, ControlClient]:
    faults = fault_file(tmp_path, hold(**do))
    return await controlled(raw_agent(capture), "--faults", str(faults), *options)


def agent_saw(capture: Path, method: str) -> list[dict[str, Any]]:
    """The messages of ``method`` the Agent read."""
    return [m for m in map(json.loads, captured(capture)) if m.get("method") == method]


async def test_a_held_request_is_listed_whole_and_released(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """/api/held lists the held request with its link, ids, times and body; the Agent does not
    see it (other requests pass); release sends it on under the proxy's id and the Client gets
    the answer under its own; then the id is held no more (409)."""
    proxy, control = await held_proxy(controlled, capture, tmp_path)
    sent = {"jsonrpc": "2.0", "id": 1, "method": "_x/hold", "params": {"text": "hi"}}
    before = time.time()
    await proxy.send(encode(sent))
    entry = await off(control.wait_held, method="_x/hold")
    [link] = await off(control.links)
    assert entry == {
        "id": entry["id"],
        "link": link["id"],
        "rule": "bp",
        "direction": "to_agent",
        "kind": "request",
        "method": "_x/hold",
        "session": None,
        "jsonrpc_id": 1,
        "forwarded_id": entry["forwarded_id"],
        "size": len(encode(sent)),
        "held_since": entry["held_since"],
        "deadline": entry["deadline"],
        "timeout_ms": 600_000.0,
        "then": "release",
        "body": sent,
        "truncated": False,
    }
    assert before - 1 < entry["held_since"] <= time.time()
    assert entry["deadline"] == pytest.approx(entry["held_since"] + 600)
    assert await off(control.held) == [entry]
    assert link["held"] == {"to_agent": 1, "to_client": 0}
    assert link["pending"] == {"to_agent": 1, "to_client": 0}
    assert await barrier(proxy, "flows") == []  # the barrier passed the held request
    assert agent_saw(capture, "_x/hold") == []
    assert await off(control.metric, "acp_proxy_held_messages") == 1
    assert await off(control.release_held, entry["id"]) == {
        "id": entry["id"],
        "link": link["id"],
        "outcome": "release",
    }
    answer, _ = await lines_until_answer(proxy, 1)
    assert answer["result"]["method"] == "_x/hold"
    assert agent_saw(capture, "_x/hold") == [{**sent, "id": entry["forwarded_id"]}]
    assert await off(control.held) == []
    assert await off(control.metric, "acp_proxy_held_messages") == 0
    assert await off(control.metric, "acp_proxy_held_outcomes_total", outcome="release") == 1
    with pytest.raises(ControlError) as again:
        await off(control.release_held, entry["id"])
    assert (again.value.status, again.value.message) == (
        409,
        f"message {entry['id']} is held no more: released, dropped, edited, timed out, or its "
        "link ended",
    )


async def test_an_edit_reaches_the_agent_and_the_trace_names_it_by_digests(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """The Agent reads the edited request under the proxy's id, answers it (its size is the
    edit's), and the Client gets that answer under its own id; the events say it was edited,
    by digests, without its text."""
    proxy, control = await held_proxy(controlled, capture, tmp_path)
    with await off(control.events) as events:
        await proxy.send(request("p", "_x/hold", {"text": "original"}))
        entry = await off(control.wait_held, method="_x/hold")
        edit = {"jsonrpc": "2.0", "id": "p", "method": "_x/hold", "params": {"text": "s3cr3t"}}
        assert (await off(control.edit_held, entry["id"], edit))["outcome"] == "edit"
        answer, _ = await lines_until_answer(proxy, "p")
        ended = await off(events.until, "held_ended", held_id=entry["id"])
        relayed = await off(events.until, "message", method="_x/hold", direction="to_agent")
    [seen] = agent_saw(capture, "_x/hold")
    assert seen == {**edit, "id": entry["forwarded_id"]}
    [line] = [line for line in captured(capture) if b"s3cr3t" in line]
    assert answer["result"]["size"] == len(line)
    assert answer["id"] == "p"
    assert ended["outcome"] == "edit"
    assert ended["digest"] != ended["edited_digest"]
    assert "s3cr3t" not in json.dumps(ended)
    assert relayed["size"] == len(json.dumps(edit))  # as the control client wrote it
    assert await off(control.metric, "acp_proxy_held_outcomes_total", outcome="edit") == 1


async def test_every_held_route_error_is_json_with_its_status(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """Unknown ids and acts are 404; an edit that cannot replace the message is 400 naming what
    is wrong; a release with a body is 400, a body that is not JSON 400, a text body 415; the
    message stays held through all of it, then is dropped: the Agent never sees it."""
    proxy, control = await held_proxy(controlled, capture, tmp_path, "--max-message-bytes", "200")
    base = control.base_url
    await proxy.send(request(5, "_x/hold"))
    held_id = (await off(control.wait_held))["id"]
    path = f"/api/held/{held_id}"

    def edit(message: Any) -> bytes:
        return json.dumps({"body": message}).encode()

    good = {"jsonrpc": "2.0", "id": 5, "method": "_x/hold"}
    refusals = [
        ("GET", "/api/held/999", None, 404, "no held message 999"),
        ("GET", "/api/held/abc", None, 404, "no held message 'abc': ids are whole numbers"),
        ("POST", "/api/held/999/release", b"", 404, "no held message 999"),
        ("POST", path + "/explode", b"", 404, "unknown act 'explode': release, drop, edit"),
        ("POST", path + "/release", b"{}", 400, f"POST {path}/release takes no body"),
        ("POST", path + "/edit", b"", 400, 'a JSON body is required ({"body": MESSAGE})'),
        ("POST", path + "/edit", b"{not json", 400, "the body is not JSON"),
        ("POST", path + "/edit", b'{"message": {}}', 400, 'an edit\'s body is {"body": MESSAGE}'),
        ("POST", path + "/edit", edit([good]), 400, "a batch"),
        ("POST", path + "/edit", edit({"id": 5}), 400, "not valid JSON-RPC"),
        ("POST", path + "/edit", edit({**good, "id": "5"}), 400, "keep the held message's id (5)"),
        ("POST", path + "/edit", edit({"jsonrpc": "2.0", "id": 5, "result": {}}), 400, "response"),
        ("POST", path + "/edit", edit({**good, "method": "_x/other"}), 400, "keep the method"),
        ("POST", path + "/edit", edit({**good, "params": "x" * 200}), 400, "over --max-message"),
    ]
    for method, route, body, status, message in refusals:
        assert_error(await off(call, base, method, route, body), status, message)
    text = await off(raw, base, "POST", path + "/edit", b"{}", {"Content-Type": "text/plain"})
    assert_error(text, 415, "Content-Type must be application/json")
    assert [entry["id"] for entry in await off(control.held)] == [held_id]
    assert (await off(control.drop_held, held_id))["outcome"] == "drop"
    assert await barrier(proxy, "after") == []
    assert agent_saw(capture, "_x/hold") == []
    assert await off(control.metric, "acp_proxy_held_outcomes_total", outcome="drop") == 1


async def test_the_timeout_releases_or_drops_as_then_says(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """Nobody acts: after ``timeout_ms`` a ``then: drop`` request is dropped (the Agent never
    reads it) and a ``then: release`` one goes on; each end is an event."""
    faults = fault_file(
        tmp_path,
        {**hold("lost", timeout_ms=50, then="drop"), "when": {"method": "_x/lost"}},
        {**hold("late", timeout_ms=50), "when": {"method": "_x/late"}},
    )
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    with await off(control.events) as events:
        await proxy.send(request("l", "_x/lost"), request("t", "_x/late"))
        dropped = await off(events.until, "held_ended", rule="lost")
        released = await off(events.until, "held_ended", rule="late")
    answer, _ = await lines_until_answer(proxy, "t")
    assert answer["result"]["method"] == "_x/late"
    assert (dropped["outcome"], released["outcome"]) == ("timeout_drop", "timeout_release")
    assert agent_saw(capture, "_x/lost") == []
    assert await off(control.metric, "acp_proxy_held_outcomes_total", outcome="timeout_drop") == 1


async def test_holds_past_the_bound_are_not_held_and_say_so(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """With ``--max-active-faults 3``, five requests to hold: three are held, two reach the Agent
    at once (answered); the overflow is counted, the gauges say three."""
    proxy, control = await held_proxy(controlled, capture, tmp_path, "--max-active-faults", "3")
    await proxy.send(*(request(n, "_x/hold") for n in range(5)))
    answers = [(await lines_until_answer(proxy, n))[0]["id"] for n in (3, 4)]
    assert answers == [3, 4]
    held = await off(control.held)
    assert [entry["jsonrpc_id"] for entry in held] == [0, 1, 2]
    assert await off(control.metric, "acp_proxy_held_messages") == 3
    assert await off(control.metric, "acp_proxy_active_faults") == 3
    overflow = await off(control.metric, "acp_proxy_faults_overflow_total", action="hold")
    assert overflow == 2
    for entry in held:
        await off(control.release_held, entry["id"])
    assert [(await lines_until_answer(proxy, n))[0]["id"] for n in range(3)] == [0, 1, 2]
    assert await off(control.metric, "acp_proxy_active_faults") == 0


async def test_held_bytes_count_in_flight_so_reading_waits_at_the_bound(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """Held messages are bytes in flight: past ``--max-inflight-bytes`` the proxy reads the
    Client no more (the waits counted, the bound logged), so fewer than all are held; each one
    released makes room for the next, and every request reaches the Agent and is answered, in
    order."""
    size, count, bound = 256 * 1024, 8, 1024 * 1024
    proxy, control = await held_proxy(
        controlled, capture, tmp_path, "--max-inflight-bytes", str(bound)
    )
    pad = {"pad": "x" * size}
    writing = asyncio.create_task(  # noqa: TID251 - awaited: the pipe fills while reading waits
        proxy.send(*(request(n, "_x/hold", pad) for n in range(count)))
    )
    await proxy.logged(INFLIGHT_BOUND_REACHED)
    held = await off(control.held)
    assert 0 < len(held) < count
    assert all(entry["truncated"] and entry["body"] is None for entry in held)  # over 16 KiB
    assert await off(control.metric, "acp_proxy_held_messages") == len(held)
    assert await off(control.metric, "acp_proxy_inflight_waits_total") >= 1
    for n in range(count):
        entry = await off(control.wait_held, jsonrpc_id=n)
        await off(control.release_held, entry["id"])
    await asyncio.wait_for(writing, TIMEOUT)
    answers = [(await lines_until_answer(proxy, n))[0]["id"] for n in range(count)]
    assert answers == list(range(count))


async def test_a_link_that_ends_loses_what_it_holds_and_the_trace_says_so(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """The Client leaves with a request held: the link ends, the trace has a ``held_ended``
    record (``link_end``) for it, the Agent never read it, the outcome is counted."""
    trace = tmp_path / "trace.jsonl"
    proxy, control = await held_proxy(controlled, capture, tmp_path, "--trace", str(trace))
    await proxy.send(request(9, "_x/hold"))
    held_id = (await off(control.wait_held))["id"]
    await proxy.close_stdin()
    assert await asyncio.wait_for(proxy.wait(), TIMEOUT) == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    [ended] = [r for r in records if r["event"] == "held_ended"]
    assert (ended["held_id"], ended["outcome"], ended["rule"]) == (held_id, "link_end", "bp")
    [held] = [r for r in records if r["event"] == "held"]
    assert (held["held_id"], held["hold"], held["id"]) == (held_id, ended["hold"], 9)
    assert (held["then"], held["delay_ms"]) == ("release", 600_000.0)
    assert agent_saw(capture, "_x/hold") == []


async def test_wait_held_waits_on_the_events_and_times_out(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """``wait_held`` started before the message comes returns it once held (matching only what
    it asked: the first held message is another method's); with nothing to match it raises
    TimeoutError."""
    faults = fault_file(tmp_path, {**hold(), "when": {"direction": "to_agent"}})
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    with pytest.raises(
        TimeoutError, match=r"no message matching .*_x/never.* was held within 0\.3 s"
    ):
        await off(control.wait_held, 0.3, method="_x/never")
    waiting = asyncio.create_task(off(control.wait_held, method="_x/wanted"))  # noqa: TID251 - awaited
    await proxy.send(request(1, "_x/other"))
    await proxy.send(request(2, "_x/wanted", {"n": 2}))
    entry = await asyncio.wait_for(waiting, TIMEOUT)
    assert (entry["method"], entry["body"]["params"]) == ("_x/wanted", {"n": 2})
    assert len(await off(control.held)) == 2


async def test_a_respawned_agent_ends_the_holds_of_the_relay_it_replaces(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """``kill_agent`` with ``respawn`` starts a fresh relay: the request held for the old Agent
    is lost (``link_end``), no longer listed, and the link goes on with the new Agent."""
    proxy, control = await held_proxy(controlled, capture, tmp_path)
    with await off(control.events) as events:
        await proxy.send(request(1, "_x/hold"))
        held_id = (await off(control.wait_held))["id"]
        await off(control.kill_agent, signal="TERM", respawn=True)
        ended = await off(events.until, "held_ended", held_id=held_id)
    assert ended["outcome"] == "link_end"
    assert await off(control.held) == []
    assert await barrier(proxy, "after") == []
    assert agent_saw(capture, "_x/hold") == []
    with pytest.raises(ControlError) as gone:
        await off(control.drop_held, held_id)
    assert gone.value.status == 409


async def test_the_ledger_judges_the_edit_not_the_original(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """A keyed prompt held and edited to carry an invalid key (empty) is judged as edited: the
    Agent's success answer to it is the finding ``invalid_key_accepted``; the valid original
    would have been recorded in the ledger instead."""
    faults = fault_file(
        tmp_path,
        {**hold(), "when": {"direction": "to_agent", "method": "session/prompt"}},
    )
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    params = {"sessionId": "S", "prompt": [{"type": "text", "text": "hi"}], "idempotencyKey": "k1"}
    await proxy.send(request("p", "session/prompt", params))
    entry = await off(control.wait_held, method="session/prompt")
    edit = {**entry["body"], "params": {**params, "idempotencyKey": ""}}
    await off(control.edit_held, entry["id"], edit)
    answer, _ = await lines_until_answer(proxy, "p")
    assert "result" in answer
    [finding] = await off(control.findings)
    assert finding["check"] == "invalid_key_accepted"
    assert await off(control.ledger) == []


async def test_a_respawn_forgets_the_lost_holds_timers_at_once(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """When a respawned Agent's relay replaces the one holding a request, the request's timer
    goes with it: no fault is in progress and no byte is in flight from then on (not only when
    its timeout would have come)."""
    proxy, control = await held_proxy(controlled, capture, tmp_path)
    with await off(control.events) as events:
        await proxy.send(request(1, "_x/hold", {"pad": "x" * 100}))
        held_id = (await off(control.wait_held))["id"]
        assert await off(control.metric, "acp_proxy_active_faults") == 1
        assert await off(control.metric, "acp_proxy_inflight_bytes") > 0
        await off(control.kill_agent, signal="TERM", respawn=True)
        await off(events.until, "held_ended", held_id=held_id)
    assert await off(control.metric, "acp_proxy_active_faults") == 0
    assert await off(control.metric, "acp_proxy_inflight_bytes") == 0


async def test_a_conductor_clients_holds_outlive_the_timers_of_the_client_before(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """Conductor mode (``--keep-upstream``): the first Client leaves with a request held for 2 s;
    the next Client's relay numbers its timers afresh and holds two requests. When the first
    hold's 2 s are long past (a delayed request of the second Client has come back after 2 s),
    both of the second Client's requests are still held: the old relay's timer did not fire into
    the new one."""
    faults = fault_file(
        tmp_path,
        {**hold("first", timeout_ms=2000), "when": {"direction": "to_agent", "method": "_x/first"}},
        {**hold("second"), "when": {"direction": "to_agent", "method": "_x/second"}},
        {
            "name": "slow",
            "when": {"direction": "to_agent", "method": "_x/wait"},
            "do": {"action": "delay", "ms": 2000},
        },
    )
    proxy, control = await controlled(
        raw_agent(capture),
        "--listen",
        "ws://127.0.0.1:0/acp",
        "--keep-upstream",
        "--faults",
        str(faults),
    )
    url = (await proxy.logged("listening"))["url"]

    async def answered(ws: Any, request_id: object) -> list[Any]:
        """What came up to the answer to ``request_id``, that answer last."""
        seen = []
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            seen.append(message)
            if message.get("id") == request_id and "method" not in message:
                return seen

    async with websockets.connect(url, proxy=None) as first:
        await first.send(request(0, "initialize", {"protocolVersion": 1}).decode())
        await answered(first, 0)
        await first.send(request(1, "_x/first").decode())
        await off(control.wait_held, rule="first")
    await proxy.logged("client gone; keeping the agent connection for the next client")
    async with websockets.connect(url, proxy=None) as second:
        await second.send(request(0, "initialize", {"protocolVersion": 1}).decode())
        await answered(second, 0)
        await second.send(request(1, "_x/second").decode())
        await second.send(request(2, "_x/second").decode())
        await off(control.wait_held, rule="second", jsonrpc_id=2)
        await second.send(request(3, "_x/wait").decode())
        before = await answered(second, 3)
        assert [m["id"] for m in before] == [3]
        held = await off(control.held)
        assert [(e["rule"], e["kind"], e["jsonrpc_id"]) for e in held] == [
            ("second", "request", 1),
            ("second", "request", 2),
        ]
    assert agent_saw(capture, "_x/second") == []


async def test_big_integers_are_shown_and_edited_exactly(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """A request whose id and params hold integers past 64 bits: ``/api/held`` shows them as
    they were written (not as floats), the edit that keeps that id is accepted, and the Agent
    reads the edit byte for byte as the control API was sent it (but for its id, the proxy's)."""
    proxy, control = await held_proxy(controlled, capture, tmp_path)
    big = 10**23
    sent = {"jsonrpc": "2.0", "id": big, "method": "_x/hold", "params": {"n": big + 1}}
    await proxy.send(encode(sent))
    entry = await off(control.wait_held, method="_x/hold")
    assert (entry["jsonrpc_id"], entry["body"]) == (big, sent)
    for path in ("/api/held", f"/api/held/{entry['id']}"):
        shown = await off(call, control.base_url, "GET", path)
        assert b'"jsonrpc_id":100000000000000000000000,' in shown.body
        assert b'{"n":100000000000000000000001}' in shown.body
    message = (
        b'{"jsonrpc":"2.0", "id":100000000000000000000000, "method":"_x/hold",'
        b' "params":{"n":123456789012345678901234567890, "f":1.50, "e":1E400}}'
    )
    edited = await off(
        call, control.base_url, "POST", f"/api/held/{entry['id']}/edit", b'{"body": %s}' % message
    )
    assert edited.status == 200, edited
    answer, _ = await lines_until_answer(proxy, big)
    assert answer["id"] == big
    [seen] = [line for line in captured(capture) if b"_x/hold" in line]
    forwarded = str(entry["forwarded_id"]).encode()
    assert seen == message.replace(b"100000000000000000000000", forwarded)


async def test_past_max_held_a_hold_rule_lets_the_message_go_and_the_list_is_bounded(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """With ``--max-held 2`` a third request to hold reaches the Agent at once (answered), the
    refusal counted and logged once; ``GET /api/held?limit=1`` lists the oldest, its ``total``
    says two; a ``limit`` that is not from 1 to 10,000 is refused (400)."""
    proxy, control = await held_proxy(controlled, capture, tmp_path, "--max-held", "2")
    await proxy.send(*(request(n, "_x/hold") for n in range(4)))
    answers = [(await lines_until_answer(proxy, n))[0]["id"] for n in (2, 3)]
    assert answers == [2, 3]
    overflow = await off(control.metric, "acp_proxy_faults_overflow_total", action="hold")
    assert overflow == 2
    await proxy.logged(HOLD_REFUSED)
    listed = (await off(call, control.base_url, "GET", "/api/held?limit=1")).json()
    assert ([entry["jsonrpc_id"] for entry in listed["held"]], listed["total"]) == ([0], 2)
    assert [entry["jsonrpc_id"] for entry in await off(control.held)] == [0, 1]
    for limit in ("0", "10001", "x"):
        refused = await off(call, control.base_url, "GET", f"/api/held?limit={limit}")
        assert_error(refused, 400, "limit is a whole number from 1 to 10000")
    assert len(log_events(proxy.stderr, HOLD_REFUSED)) == 1  # the second refusal: counted only
