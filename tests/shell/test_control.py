"""The control API (``--admin``) route by route, through ``proxy.control.ControlClient``.

Each test runs a real proxy process (``python -m proxy run --admin 127.0.0.1:0``; the bound URL is
read from its ``control API listening`` log line) in front of the scripted raw Agent, with the test
as its Client (stdio) or as a WebSocket Client. The control client is synchronous: the async tests
call it in a thread, so the proxy's output keeps being read meanwhile. Status codes are read with a
bare ``urllib`` request where the client would hide them. Effects are checked on real traffic:
a rule added over the API drops what it names, ``kill_agent`` ends a stdio proxy with 137,
``sever`` closes a WebSocket with the code asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import websockets
import yaml
from control_calls import OPENER, Answer, assert_error, call, off, raw
from harness import (
    PROXY_RUN,
    RAW_AGENT,
    TIMEOUT,
    Controlled,
    ProxyProcess,
    captured,
    encode,
    fault_file,
    log_events,
    notification,
    raw_agent,
    replace_file,
    request,
    say,
    unboxed,
)
from stdio_scenario import barrier, until_logged
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from proxy.control import ControlClient, ControlError, RuleCounters

MAX_BODY = 1024 * 1024


# -- helpers -----------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def websocket(url: str) -> AsyncIterator[ClientConnection]:
    """A raw WebSocket Client of the proxy."""
    async with asyncio.timeout(TIMEOUT):
        connection = await ws_connect(url)
    try:
        yield connection
    finally:
        await connection.close()


async def ask(connection: ClientConnection, request_id: object, method: str) -> Any:
    """Send a request over ``connection``; its answer (the Agent answers every request)."""
    await connection.send(request(request_id, method).decode())
    async with asyncio.timeout(TIMEOUT):
        answer = json.loads(await connection.recv())
    assert answer["id"] == request_id, answer
    return answer


async def closed_with(connection: ClientConnection) -> int | None:
    """Wait for the proxy to close ``connection``; the close code it sent."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(TIMEOUT):
            await connection.recv()
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


A, B, C = notification("_x/a"), notification("_x/b"), notification("_x/c")


def drop(name: str, method: str) -> dict[str, Any]:
    """A rule dropping the Agent's ``method`` notifications."""
    return {
        "name": name,
        "when": {"direction": "to_client", "method": method},
        "do": {"action": "drop"},
    }


# -- rules -------------------------------------------------------------------------------------------


async def test_rules_are_validated_added_replaced_deleted_and_reset(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """/api/rules: located errors, 201, 409, 404, PUT replaces, reset restores the file's rules."""
    faults = fault_file(tmp_path, drop("file-drop-a", "_x/a"))
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    file_rules = [drop("file-drop-a", "_x/a")]
    assert await off(control.rules) == file_rules
    assert await off(control.counters) == {"file-drop-a": RuleCounters(0, 0)}
    await proxy.send(say(A, B))
    assert await barrier(proxy, "1") == [B]
    assert await off(control.counters) == {"file-drop-a": RuleCounters(1, 1)}

    bad = {"name": "bad", "when": {"kind": "reqest"}, "do": {"action": "delay", "ms": -5}}
    with pytest.raises(ControlError) as invalid:
        await off(control.add_rule, bad)
    assert (invalid.value.status, invalid.value.message) == (400, "invalid rules")
    assert len(invalid.value.errors) == 2
    assert invalid.value.errors[0].startswith("request: rule 'bad': when.kind: ")
    assert invalid.value.errors[1].startswith("request: rule 'bad': do.ms: ")
    with pytest.raises(ControlError) as unknown:
        await off(control.add_rule, {"name": "boom", "do": {"action": "explode"}})
    assert "unknown action 'explode'" in unknown.value.errors[0]

    added = await off(
        call, control.base_url, "POST", "/api/rules", encode(drop("api-drop-b", "_x/b"))
    )
    assert added.status == 201
    assert added.json()["rules"] == [*file_rules, drop("api-drop-b", "_x/b")]
    with pytest.raises(ControlError) as duplicate:
        await off(control.add_rule, drop("api-drop-b", "_x/c"))
    assert (duplicate.value.status, duplicate.value.message) == (
        409,
        "a rule named 'api-drop-b' already exists",
    )
    await proxy.send(say(A, B, C))
    assert await barrier(proxy, "2") == [C]

    with pytest.raises(ControlError) as missing:
        await off(control.remove_rule, "missing")
    assert (missing.value.status, missing.value.message) == (404, "no rule named 'missing'")
    assert await off(control.remove_rule, "file-drop-a") == [drop("api-drop-b", "_x/b")]
    await proxy.send(say(A, B, C))
    assert await barrier(proxy, "3") == [A, C]

    with pytest.raises(ControlError) as twice:
        await off(control.set_rules, [drop("x", "_x/a"), drop("x", "_x/b")])
    assert twice.value.status == 400
    assert "rule name 'x' is used twice" in twice.value.errors[0]
    not_a_list = await off(call, control.base_url, "PUT", "/api/rules", b'{"rules": "none"}')
    assert_error(not_a_list, 400, "rules are a JSON list")
    replaced = await off(
        call, control.base_url, "PUT", "/api/rules", encode({"rules": [drop("drop-c", "_x/c")]})
    )
    assert replaced.status == 200
    assert replaced.json()["rules"] == [drop("drop-c", "_x/c")]
    await proxy.send(say(A, B, C))
    assert await barrier(proxy, "4") == [A, B]
    assert await off(control.counters) == {"drop-c": RuleCounters(1, 1)}

    assert await off(control.reset) == file_rules
    assert await off(control.counters) == {"file-drop-a": RuleCounters(0, 0)}
    await proxy.send(say(A, B, C))
    assert await barrier(proxy, "5") == [B, C]
    assert await off(control.counters) == {"file-drop-a": RuleCounters(1, 1)}


async def test_two_rules_on_one_match_each_count_it(controlled: Controlled, capture: Path) -> None:
    """Issue 12.6 through /api/rules: rules nth: [1] and nth: [2] on the same messages act on
    the first and the second; the counters show every match of each rule's own when, and the
    times each acted."""
    proxy, control = await controlled(raw_agent(capture))
    first = {**drop("drop-first", "_x/n"), "schedule": {"nth": [1]}}
    second = {**drop("drop-second", "_x/n"), "schedule": {"nth": [2]}}
    await off(control.set_rules, [first, second])
    numbered = [notification("_x/n", {"n": n}) for n in range(1, 5)]
    await proxy.send(say(*numbered))
    assert await barrier(proxy, "1") == numbered[2:]
    assert await off(control.counters) == {
        "drop-first": RuleCounters(matched=4, fired=1),
        "drop-second": RuleCounters(matched=4, fired=1),
    }


async def test_rules_that_cannot_fire_here_are_warned_once_at_load(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """On a stdio listener, every http_status or close_stream rule loaded (from the file at start,
    over PUT or POST, by a --watch reload) is accepted and logged once as a rule that can never
    fire, with its name and why; sever's old `when` is logged as a name to change."""
    fail_post = {"name": "fail-post", "do": {"action": "http_status", "status": 503}}
    faults = fault_file(tmp_path, fail_post, drop("drop-a", "_x/a"))
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults), "--watch")
    cut_stream = {"name": "cut-stream", "do": {"action": "close_stream"}}
    await off(control.set_rules, [fail_post, cut_stream])  # fail-post kept: not told again
    old_sever = {"name": "cut", "do": {"action": "sever", "side": "client", "when": "after"}}
    await off(control.add_rule, old_sever)
    assert await off(control.rules) == [
        fail_post,
        cut_stream,
        {"name": "cut", "do": {"action": "sever", "side": "client", "moment": "after"}},
    ]
    fail_again = {"name": "fail-again", "do": {"action": "http_status", "status": 502}}
    replace_file(faults, yaml.safe_dump({"version": 1, "rules": [fail_post, fail_again]}))
    await proxy.logged("fault files reloaded")
    never = log_events(proxy.stderr, "a rule can never fire here")
    assert [event["rule"] for event in never] == ["fail-post", "cut-stream", "fail-again"]
    http = "fires only when Clients connect over Streamable HTTP (--listen http://...)"
    assert never[0]["why"] == f"http_status {http}; they connect over stdio"
    assert never[1]["why"] == f"close_stream {http}; they connect over stdio"
    [renamed] = log_events(proxy.stderr, "a rule needs a change")
    assert (renamed["rule"], renamed["field"]) == ("cut", "do.when")
    assert "'when' is the old name of 'moment'" in renamed["note"]


async def test_a_large_legal_file_stays_bounded_and_so_do_the_api_rules(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """Issue 13.5: with the most rules a run holds, aliases adding nearly the most values they
    may, GET /api/rules stays small (an alias bomb once made it 80 MB); the control API adds no
    rule past the bound and takes no list longer than it."""
    shared = "{direction: to_client, kind: notification, method: _x/never, params: {a: [1, 2, 3]}}"
    lines = ["version: 1", "rules:", f"  - {{name: r0, when: &w {shared}, do: {{action: drop}}}}"]
    lines += [f"  - {{name: r{n}, when: *w, do: {{action: drop}}}}" for n in range(1, 700)]
    lines += [f"  - {{name: r{n}, do: {{action: drop}}}}" for n in range(700, 1000)]
    faults = tmp_path / "large.yaml"
    faults.write_text("\n".join(lines) + "\n")  # 699 aliases of 14 values: 9,786 values added
    _proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    answer = await off(call, control.base_url, "GET", "/api/rules")
    assert answer.status == 200
    assert len(answer.json()["rules"]) == 1000
    assert len(answer.body) < MAX_BODY  # as small as the largest body the API takes
    full = await off(call, control.base_url, "POST", "/api/rules", encode(drop("one-more", "_x")))
    assert_error(full, 409, "there are 1,000 rules already: the most a run holds")
    too_many = json.dumps([drop(f"d{n}", "_x") for n in range(1001)]).encode()
    body = assert_error(
        await off(call, control.base_url, "PUT", "/api/rules", too_many), 400, "invalid rules"
    )
    assert body["errors"] == ["request: rules: 1,001 rules: at most 1,000"]
    assert len(await off(control.rules)) == 1000


async def test_a_reload_into_an_alias_bomb_keeps_the_last_good_rules(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """--watch: an edit that turns the file into an alias bomb is refused at once, located, and
    the rules stay as they were."""
    faults = fault_file(tmp_path, drop("drop-a", "_x/a"))
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults), "--watch")
    levels = [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 9)]
    bomb = "\n".join(
        [
            "version: 1",
            "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]",
            *levels,
            "rules:",
            "  - {name: laugh, when: {params: {x: *l8}}, do: {action: drop}}",
        ]
    )
    replace_file(faults, bomb + "\n")
    refused = await proxy.logged("fault file reload refused; keeping the last good rules")
    assert refused["error"] == (
        f"{faults}:6: aliases expand to more than 10,000 values "
        "(each use of an alias copies what it names)"
    )
    assert await off(control.rules) == [drop("drop-a", "_x/a")]


async def test_every_error_is_json_with_its_status(controlled: Controlled, capture: Path) -> None:
    """Unknown routes and methods, bad bodies, a body over the limit, bad actions: JSON errors."""
    proxy, control = await controlled(raw_agent(capture))
    base = control.base_url
    kept = [drop("kept", "_x/a")]
    assert await off(control.set_rules, kept) == kept
    assert_error(await off(call, base, "GET", "/nope"), 404, "Not Found")
    assert_error(await off(call, base, "DELETE", "/api/reset"), 405, "Method Not Allowed")
    assert_error(
        await off(call, base, "POST", "/api/rules", b"{not json"), 400, "the body is not JSON"
    )
    assert_error(await off(call, base, "POST", "/api/rules", b""), 400, "a JSON body is required")
    too_big = b"[" + b" " * MAX_BODY + b"]"
    assert_error(await off(call, base, "PUT", "/api/rules", too_big), 413, f"over {MAX_BODY} bytes")
    actions = "/api/actions/"
    assert_error(await off(call, base, "POST", actions + "sever", b"[]"), 400, "a JSON object")
    assert_error(
        await off(call, base, "POST", actions + "sever", b'{"link": 999}'), 404, "no link 999"
    )
    assert_error(await off(call, base, "POST", actions + "explode", b"{}"), 404, "unknown action")
    # Nothing was changed by a refused call: the rule is kept, the link relays, the Agent lives.
    assert await off(control.rules) == kept
    await proxy.send(say(A, B))
    assert await barrier(proxy, "alive") == [B]
    assert proxy.process.returncode is None


SEVER, KILL, RESTART = "/api/actions/sever", "/api/actions/kill_agent", "/api/actions/restart_proxy"
NOT_JSON = "the body is not JSON: "
MALFORMED = [
    # JSON that is not JSON, or that no parser should be made to follow
    ("POST", RESTART, b'{"downtime_ms": NaN}', NOT_JSON),
    ("POST", RESTART, b'{"downtime_ms": Infinity}', NOT_JSON),
    ("POST", SEVER, b'{"close_code": -Infinity}', NOT_JSON),
    ("POST", SEVER, b'{"close_code": 1e400}', NOT_JSON),
    ("PUT", "/api/rules", b"[" * 200_000 + b"]" * 200_000, NOT_JSON + "depth limit exceeded"),
    ("POST", "/api/rules", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, NOT_JSON),
    ("POST", "/api/rules", b'{"name": "\\ud800", "do": {"action": "drop"}}', NOT_JSON),
    ("POST", "/api/rules", b'{"name": "\xff", "do": {"action": "drop"}}', NOT_JSON),
    ("POST", SEVER, b'{"link": ' + b"9" * 5000 + b"}", NOT_JSON),
    # numbers: finite, within bounds, integers where an integer is meant (never a boolean)
    ("POST", RESTART, b'{"downtime_ms": -1}', "downtime_ms: Input should be greater than or equal"),
    (
        "POST",
        RESTART,
        b'{"downtime_ms": 3600001}',
        "downtime_ms: Input should be less than or equal",
    ),
    ("POST", RESTART, b'{"downtime_ms": "5"}', "downtime_ms: Input should be a valid number"),
    ("POST", RESTART, b'{"downtime_ms": true}', "downtime_ms: Input should be a valid number"),
    ("POST", SEVER, b'{"close_code": 999}', "close_code: Input should be greater than or equal"),
    ("POST", SEVER, b'{"close_code": 1005}', "close_code: 1005 cannot be sent in a close frame"),
    ("POST", SEVER, b'{"close_code": 1006}', "close_code: 1006 cannot be sent in a close frame"),
    ("POST", SEVER, b'{"close_code": 1015}', "close_code: 1015 cannot be sent in a close frame"),
    ("POST", SEVER, b'{"close_code": 2000}', "close_code: 2000 cannot be sent in a close frame"),
    ("POST", SEVER, b'{"close_code": 70000}', "close_code: Input should be less than or equal"),
    ("POST", SEVER, b'{"close_code": 1000.5}', "close_code: Input should be a valid integer"),
    ("POST", SEVER, b'{"close_code": true}', "close_code: Input should be a valid integer"),
    ("POST", KILL, b'{"link": true}', "link: Input should be a valid integer"),
    ("POST", SEVER, b'{"link": false}', "link: Input should be a valid integer"),
    ("POST", KILL, b'{"link": 1.0}', "link: Input should be a valid integer"),
    ("POST", KILL, b'{"link": "1"}', "link: Input should be a valid integer"),
    # booleans are JSON booleans; names are among the names; nothing unknown is ignored
    ("POST", KILL, b'{"respawn": "no"}', "respawn: Input should be a valid boolean"),
    ("POST", KILL, b'{"respawn": 1}', "respawn: Input should be a valid boolean"),
    ("POST", KILL, b'{"signal": "BOGUS"}', "signal: 'BOGUS' is not a signal name"),
    ("POST", KILL, b'{"signal": true}', "signal: a signal is a name such as KILL or TERM"),
    ("POST", SEVER, b'{"side": "middle"}', "side: Input should be 'client', 'agent' or 'both'"),
    ("POST", SEVER, b'{"sid": "client"}', "sid: unknown field (did you mean 'side'?)"),
    ("POST", RESTART, b'{"link": 1}', "link: unknown field"),
]
"""Malformed bodies: each is refused with 400 and an error naming the field (or the JSON fault)."""


async def test_every_malformed_body_is_a_400_naming_the_field(
    controlled: Controlled, capture: Path
) -> None:
    """Strict JSON, finite bounded numbers, real integers and booleans: anything else is 400 with
    a JSON error naming what is wrong, and changes nothing (no action on the link, whose id 1
    ``true`` would once have named)."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "up") == []
    [before] = await off(control.links)
    assert before["id"] == 1
    wrong = []
    for method, path, body, expected in MALFORMED:
        answer = await off(call, control.base_url, method, path, body)
        json_error = answer.headers.get_content_type() == "application/json"
        error = answer.json() if json_error else {"error": answer.body.decode(errors="replace")}
        said = " ".join([str(error.get("error")), *error.get("errors", [])])
        if (answer.status, error.get("status")) != (400, 400) or expected not in said:
            wrong.append((path, body[:40], answer.status, said[:200]))
    assert wrong == []
    assert await off(control.links) == [before]  # the same Agent: never killed nor restarted
    assert await barrier(proxy, "alive") == []
    assert log_events(proxy.stderr, "action over the control API") == []
    assert log_events(proxy.stderr, "restart requested over the control API") == []
    assert "Traceback" not in proxy.stderr


# -- what a web page in the browser can send --------------------------------------------------------

JSON = {"Content-Type": "application/json"}
FORGED = [
    ({"Content-Type": "application/x-www-form-urlencoded"}, b"signal=KILL&respawn=false"),
    (
        {"Content-Type": "multipart/form-data; boundary=b"},
        b'--b\r\nContent-Disposition: form-data; name="signal"\r\n\r\nKILL\r\n--b--\r\n',
    ),
    ({"Content-Type": "text/plain"}, b'{"signal": "KILL"}'),
    ({"Content-Type": "text/plain;charset=UTF-8"}, b"{}"),
    ({}, b"{}"),  # a body that does not say what it is
    ({"Content-Type": "application/x-www-form-urlencoded"}, b""),  # an empty form
]
"""What any page can POST anywhere without a preflight (forms, ``text/plain``), and bodies that do
not say they are JSON."""


async def test_a_forged_form_or_text_post_is_refused_and_acts_on_nothing(
    controlled: Controlled, capture: Path
) -> None:
    """A form or text/plain POST (or a body of no stated type) to any route is a 415: no Agent is
    killed, no rule replaced, no restart; an empty JSON body where one is needed is a 400 (an
    action's defaults are ``{}``), a body where none is taken too."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "up") == []
    base = control.base_url
    kept = [drop("kept", "_x/a")]
    assert await off(control.set_rules, kept) == kept
    for method, path in [
        ("POST", KILL),
        ("POST", RESTART),
        ("POST", SEVER),
        ("PUT", "/api/rules"),
        ("POST", "/api/rules"),
        ("POST", "/api/reset"),
        ("DELETE", "/api/rules/kept"),
    ]:
        for headers, body in FORGED:
            answer = await off(raw, base, method, path, body, headers)
            assert_error(answer, 415, "Content-Type must be application/json")
    for path in (KILL, RESTART, SEVER, "/api/rules"):
        for headers in ({}, JSON):  # a bodiless POST (a no-cors fetch), or one of empty JSON
            answer = await off(raw, base, "POST", path, None, headers)
            assert_error(answer, 400, "a JSON body is required")
    for method, path in [("POST", "/api/reset"), ("DELETE", "/api/rules/kept")]:
        answer = await off(raw, base, method, path, b"{}", JSON)
        assert_error(answer, 400, f"{method} {path} takes no body")
    assert await off(control.rules) == kept
    assert await barrier(proxy, "alive") == []
    assert log_events(proxy.stderr, "action over the control API") == []
    assert log_events(proxy.stderr, "restart requested over the control API") == []
    # Without a body where none is taken, and with a JSON body where one is, it all works.
    assert (await off(raw, base, "DELETE", "/api/rules/kept")).json()["rules"] == []
    assert (await off(raw, base, "POST", "/api/reset")).json()["rules"] == []
    sever = await off(raw, base, "POST", SEVER, b'{"side": "client"}', JSON)
    assert (sever.status, sever.json()["action"]) == (200, "sever")


def refused(answer: Answer, message: str) -> None:
    """``answer`` is the policy's 403, exactly."""
    assert answer.status == 403, answer
    assert answer.headers.get_content_type() == "application/json"
    assert answer.json() == {"error": message, "status": 403}
    assert not [name for name in answer.headers if name.lower().startswith("access-control-")]


async def test_a_cross_origin_request_is_refused_by_its_origin(
    controlled: Controlled, capture: Path
) -> None:
    """A request a page sends (it carries the page's Origin) is 403, JSON body and all, and acts
    on nothing; the API's own origin is fine. Each origin is logged once; every refusal counted."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "up") == []
    base = control.base_url
    evil = "origin http://evil.example is not allowed (see --admin-allow-origin)"
    page = {**JSON, "Origin": "http://evil.example"}
    refused(await off(raw, base, "POST", KILL, b"{}", page), evil)
    refused(await off(raw, base, "PUT", "/api/rules", b"[]", page), evil)
    refused(await off(raw, base, "GET", "/api/rules", None, page), evil)
    refused(
        await off(raw, base, "GET", "/healthz", None, {"Origin": "null"}),
        evil.replace("http://evil.example", "null"),
    )
    own = {**JSON, "Origin": base}  # http:// and the Host the request was sent to
    added = await off(raw, base, "POST", "/api/rules", encode(drop("x", "_x/a")), own)
    assert added.status == 201
    assert await barrier(proxy, "alive") == []
    assert log_events(proxy.stderr, "action over the control API") == []
    [logged] = [
        event for event in log_events(proxy.stderr, "request refused") if event["detail"] == evil
    ]
    assert (logged["server"], logged["reason"]) == ("admin", "origin")
    counted = await off(
        control.metric, "acp_proxy_refused_requests_total", server="admin", reason="origin"
    )
    assert counted == 4


async def test_a_rebinding_host_is_refused_by_the_control_api(
    controlled: Controlled, capture: Path
) -> None:
    """DNS rebinding: a page whose name now points to 127.0.0.1 sends its own name as Host:
    403 (with the API's own port too), and nothing happens; the loopback names are fine, on any
    port (a tunnel or a relay changes it)."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "up") == []
    base = control.base_url
    port = urlsplit(base).port
    assert port is not None
    for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}"):
        refused(
            await off(raw, base, "POST", KILL, b"{}", {**JSON, "Host": host}),
            f"host {host} is not allowed (see --allow-host)",
        )
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"localhost:{port + 1}", "[::1]"):
        assert (await off(raw, base, "GET", "/healthz", None, {"Host": host})).status == 200
    assert await barrier(proxy, "alive") == []
    assert log_events(proxy.stderr, "action over the control API") == []
    assert (
        await off(control.metric, "acp_proxy_refused_requests_total", server="admin", reason="host")
        == 3
    )


async def test_allow_host_and_allow_origin_admit_exactly_what_they_name(
    controlled: Controlled, capture: Path
) -> None:
    """--allow-host names a host for both servers (any port, or the one given); --allow-origin
    opens the listener and --admin-allow-origin the control API, each only that origin."""
    proxy, control = await controlled(
        raw_agent(capture),
        "--listen",
        "http://127.0.0.1:0/acp",
        "--allow-host",
        "proxy.test",
        "--allow-host",
        "pinned.test:1",
        "--allow-origin",
        "https://ide.example",
        "--admin-allow-origin",
        "https://dash.example",
    )
    listener = (await proxy.logged("listening"))["url"]
    admin = control.base_url
    init = encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})

    async def status(base: str, headers: dict[str, str]) -> int:
        if base == admin:
            return (await off(raw, base, "GET", "/healthz", None, headers)).status
        return (await off(raw, base, "POST", urlsplit(base).path, init, {**JSON, **headers})).status

    for base in (admin, listener):
        port = urlsplit(base).port
        assert await status(base, {"Host": "proxy.test"}) == 200
        assert await status(base, {"Host": f"proxy.test:{port}"}) == 200
        assert await status(base, {"Host": "pinned.test:1"}) == 200
        for host in (f"pinned.test:{port}", f"proxy.test.evil.example:{port}", f"test:{port}"):
            assert await status(base, {"Host": host}) == 403
    assert await status(admin, {"Origin": "https://dash.example"}) == 200
    assert await status(listener, {"Origin": "https://ide.example"}) == 200
    for origin in (
        "https://ide.example",
        "http://dash.example",
        "https://dash.example:8443",
        "https://dash.example.evil.example",
    ):
        assert await status(admin, {"Origin": origin}) == 403, origin
    for origin in ("https://dash.example", "http://ide.example", "https://evil.example"):
        assert await status(listener, {"Origin": origin}) == 403, origin


async def test_a_preflight_grants_nothing(controlled: Controlled, capture: Path) -> None:
    """OPTIONS with CORS preflight headers: 403 for a foreign origin, 405 for an allowed one, and
    never an Access-Control-Allow-* header, on the control API and on the listener."""
    proxy, control = await controlled(
        raw_agent(capture),
        "--listen",
        "http://127.0.0.1:0/acp",
        "--allow-origin",
        "https://ide.example",
        "--admin-allow-origin",
        "https://ide.example",
    )
    listener = (await proxy.logged("listening"))["url"]
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization",
    }
    for base, path in ((control.base_url, KILL), (listener, urlsplit(listener).path)):
        for origin, expected in (("https://evil.example", 403), ("https://ide.example", 405)):
            answer = await off(raw, base, "OPTIONS", path, None, {**preflight, "Origin": origin})
            assert answer.status == expected, (base, origin, answer)
            granted = [name for name in answer.headers if name.lower().startswith("access-")]
            assert granted == [], granted


# -- the token and the bind address -----------------------------------------------------------------

GUARDED = [
    ("GET", "/metrics", None),
    ("GET", "/api/rules", None),
    ("PUT", "/api/rules", b"[]"),
    ("POST", "/api/rules", encode(drop("x", "_x/a"))),
    ("DELETE", "/api/rules/x", None),
    ("POST", "/api/reset", b""),
    ("POST", "/api/actions/sever", b"{}"),
    ("POST", "/api/actions/kill_agent", b"{}"),
    ("POST", "/api/actions/restart_proxy", b"{}"),
    ("GET", "/api/links", None),
    ("GET", "/api/held", None),
    ("GET", "/api/held/1", None),
    ("POST", "/api/held/1/release", b""),
    ("POST", "/api/held/1/edit", b'{"body": {}}'),
    ("GET", "/api/ledger", None),
    ("GET", "/api/findings", None),
    ("GET", "/api/events", None),
]
"""Every route but /healthz, each with a body it would accept."""


def unauthorized(token: str | None) -> str:
    """What a 401 says to a request with ``token`` (``None``: no Authorization header)."""
    return "a bearer token is required" if token is None else "is not this proxy's admin token"


async def test_token_from_the_environment_guards_every_route_but_healthz(
    controlled: Controlled, capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACP_PROXY_ADMIN_TOKEN: 401 without (or with a wrong) bearer token; /healthz stays open."""
    monkeypatch.setenv("ACP_PROXY_ADMIN_TOKEN", "s3cret")
    proxy, control = await controlled(raw_agent(capture), token="s3cret")
    base = control.base_url
    for method, path, body in GUARDED:
        for token in (None, "wrong", "s3cre", "S3CRET"):
            answer = await off(call, base, method, path, body, token)
            assert_error(answer, 401, unauthorized(token))
    assert (await off(call, base, "GET", "/healthz")).json() == {"status": "ok", "links": 1}
    with pytest.raises(ControlError) as refused:
        await off(ControlClient(base).rules)
    assert refused.value.status == 401
    # With the token every route answers (the actions are tried on a link only at the end).
    assert await off(control.add_rule, drop("x", "_x/a")) == [drop("x", "_x/a")]
    assert await off(control.remove_rule, "x") == []
    assert await off(control.links) != []
    assert await off(control.ledger) == []
    assert await off(control.findings) == []
    assert "acp_proxy_messages_total" in await off(control.metrics)
    assert await barrier(proxy, "untouched") == []
    await off(control.kill_agent)
    assert await proxy.wait() == 128 + signal.SIGKILL


async def test_token_from_the_command_line_is_required_and_never_echoed(
    controlled: Controlled, capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--admin-token: a request without it, or with any other token (one that differs by a
    character, bytes that are not UTF-8), gets 401, and neither the token given nor the real one
    appears in an answer or in the proxy's logs (debug level)."""
    monkeypatch.delenv("ACP_PROXY_ADMIN_TOKEN", raising=False)
    secret = "flag-" + uuid.uuid4().hex
    proxy, control = await controlled(
        raw_agent(capture), "--admin-token", secret, "--log-level", "debug", token=secret
    )
    base = control.base_url
    guesses = ["guess-" + uuid.uuid4().hex, secret[:-1], secret + "x", secret.upper()]
    not_utf8 = "\xff\xfe" + secret  # sent as latin-1: bytes that are not UTF-8
    wrong: list[str | None] = [None, *guesses, not_utf8]
    for method, path, body in GUARDED:
        for token in wrong:
            answer = await off(call, base, method, path, body, token)
            assert_error(answer, 401, unauthorized(token))
            assert secret.encode() not in answer.body
            assert token is None or token.encode("latin-1") not in answer.body
    assert await off(control.add_rule, drop("x", "_x/a")) == [drop("x", "_x/a")]
    assert await barrier(proxy, "guarded") == []
    assert proxy.process.returncode is None
    assert all(token not in proxy.stderr for token in [secret, *guesses])


@pytest.mark.parametrize("line_end", ["\n", "\r\n", ""])
async def test_token_from_a_file_guards_the_api_and_wins_over_the_environment(
    controlled: Controlled,
    capture: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    line_end: str,
) -> None:
    """--admin-token-file: its one line, without the line end, is the token (the variable, also
    set, is not); neither appears in an answer or a log line."""
    monkeypatch.setenv("ACP_PROXY_ADMIN_TOKEN", "from-the-environment")
    secret = "file-" + uuid.uuid4().hex
    path = tmp_path / "token"
    path.write_bytes((secret + line_end).encode())
    proxy, control = await controlled(
        raw_agent(capture), "--admin-token-file", str(path), "--log-level", "debug", token=secret
    )
    base = control.base_url
    for token in (None, "from-the-environment", secret + "x", secret[:-1]):
        answer = await off(call, base, "GET", "/api/rules", None, token)
        assert_error(answer, 401, unauthorized(token))
        assert secret.encode() not in answer.body
    assert await off(control.add_rule, drop("x", "_x/a")) == [drop("x", "_x/a")]
    assert await barrier(proxy, "guarded") == []
    assert secret not in proxy.stderr
    assert "from-the-environment" not in proxy.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, ": cannot read it: No such file or directory"),
        (b"", "is empty: give a token, or unset it"),
        (b"\n", "is empty: give a token, or unset it"),
        (b"s3cret\nsecond\n", ": holds more than one line"),
        (b" s3cret\n", "has whitespace at its ends or characters that are not printable"),
        (b"s3cr\xffet\n", ": not UTF-8 text"),
        (b"x" * 5000, ": over 4096 bytes"),
        ("directory", "is a directory"),
        ("and --admin-token", "give --admin-token or --admin-token-file, not both"),
    ],
)
async def test_a_token_file_that_gives_no_usable_token_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes | str | None, expected: str
) -> None:
    """An unreadable, empty, many-line or unusable --admin-token-file (or one given with
    --admin-token): exit 2 before the Agent starts, and the message never repeats the file."""
    monkeypatch.delenv("ACP_PROXY_ADMIN_TOKEN", raising=False)
    marker = tmp_path / "agent-ran"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    path = tmp_path / "token"
    options = ["--admin", "127.0.0.1:0", "--admin-token-file", str(path)]
    if content == "directory":
        path.mkdir()
    elif content == "and --admin-token":
        path.write_text("s3cret\n")
        options += ["--admin-token", "s3cret"]
    elif isinstance(content, bytes):
        path.write_bytes(content)
    refused = await ProxyProcess.start(agent, *options)
    try:
        assert await refused.wait() == 2
        said = unboxed(refused.stderr)
        assert expected in said, said
        assert "s3cr" not in said.replace("--admin-token", "")
        assert not marker.exists()
    finally:
        await refused.stop()


async def test_the_help_says_a_token_on_the_command_line_is_visible_to_other_users() -> None:
    """``run --help``: --admin-token warns of ps, and names the variable and the file."""
    process = await asyncio.create_subprocess_exec(
        *PROXY_RUN, "--help", stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    said = unboxed(stdout.decode())
    assert "Given on the command line it is visible to other local users (ps)" in said, said
    assert "ACP_PROXY_ADMIN_TOKEN" in said
    assert "--admin-token-file" in said


@pytest.mark.parametrize(
    ("how", "token", "expected"),
    [
        ("environment", "", "is empty: give a token, or unset it"),
        ("option", "", "is empty: give a token, or unset it"),
        ("option", " padded", "has whitespace at its ends or characters that are not printable"),
        ("environment", "two\nlines", "has whitespace at its ends or characters that are not"),
    ],
)
async def test_a_token_that_would_not_guard_the_api_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, token: str, expected: str
) -> None:
    """An empty token (a secret never filled in) must not silently turn authentication off, nor
    may a token be one no Authorization header can carry: exit 2 before the Agent starts, and the
    message does not repeat the token."""
    marker = tmp_path / "agent-ran"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    options = ["--admin", "127.0.0.1:0"]
    if how == "environment":
        monkeypatch.setenv("ACP_PROXY_ADMIN_TOKEN", token)
    else:
        monkeypatch.delenv("ACP_PROXY_ADMIN_TOKEN", raising=False)
        options += ["--admin-token", token]
    refused = await ProxyProcess.start(agent, *options)
    try:
        assert await refused.wait() == 2
        said = unboxed(refused.stderr)
        assert f"--admin-token (or ACP_PROXY_ADMIN_TOKEN) {expected}" in said
        assert not token.strip() or token.strip() not in said
        assert not marker.exists()
    finally:
        await refused.stop()


@pytest.mark.parametrize(("address", "allowed_status"), [("0.0.0.0:0", 127), ("192.0.2.1:0", 1)])
async def test_a_non_loopback_admin_address_is_refused_unless_allowed(
    tmp_path: Path, address: str, allowed_status: int
) -> None:
    """--admin on a non-loopback address: exit 2 before the Agent starts; allowed: it runs on."""
    marker = tmp_path / "agent-ran"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    refused = await ProxyProcess.start(agent, "--admin", address)
    try:
        assert await refused.wait() == 2
        assert "binds to loopback only, unless --admin-allow-remote is given" in unboxed(
            refused.stderr
        )
        assert not marker.exists()
    finally:
        await refused.stop()
    # Allowed: the address is accepted, and bound before the Agent starts: 0.0.0.0 binds, and
    # the Agent command, which does not exist, ends the run (127); 192.0.2.1 is no address of
    # this machine (1, without starting the Agent).
    missing = str(tmp_path / "no-such-agent")
    allowed = await ProxyProcess.start([missing], "--admin", address, "--admin-allow-remote")
    try:
        assert await allowed.wait() == allowed_status
        assert "loopback only" not in allowed.stderr
    finally:
        await allowed.stop()


def ipv6_loopback() -> bool:
    """Whether this machine can bind ::1."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
async def test_ipv6_loopback_addresses_are_accepted_and_logged_as_urls(capture: Path) -> None:
    """--admin [::1]:0 is loopback; it and --listen ws://[::1]:0/acp are logged as URLs, with the
    address in brackets, that a Client and the control client can use as they are."""
    options = ["--log-format", "json", "--admin", "[::1]:0", "--listen", "ws://[::1]:0/acp"]
    proxy = await ProxyProcess.start(raw_agent(capture), *options)
    try:
        admin_url = (await proxy.logged("control API listening"))["url"]
        listen_url = (await proxy.logged("listening"))["url"]
        assert re.fullmatch(r"http://\[::1\]:\d+", admin_url), admin_url
        assert re.fullmatch(r"ws://\[::1\]:\d+/acp", listen_url), listen_url
        async with websocket(listen_url) as connection:
            await ask(connection, 1, "_x/over-ipv6")
            [link] = await off(ControlClient(admin_url).links)
            assert link["client"] == {"transport": "ws"}
    finally:
        await proxy.stop()


# -- actions on real links ------------------------------------------------------------------------


async def test_kill_agent_action_ends_a_stdio_proxy_with_137(
    controlled: Controlled, capture: Path
) -> None:
    """POST /api/actions/kill_agent: SIGKILL to the Agent; the stdio proxy exits 137, stdout ends."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "up") == []
    [link] = await off(control.links)
    assert await off(control.kill_agent) == [link["id"]]
    assert await proxy.at_eof()
    assert await proxy.wait() == 128 + signal.SIGKILL
    (action,) = log_events(proxy.stderr, "action over the control API")
    assert (action["action"], action["links"]) == ("kill_agent", [link["id"]])


async def test_kill_agent_action_with_respawn_starts_a_new_agent(
    controlled: Controlled, tmp_path: Path
) -> None:
    """kill_agent with respawn: the link stays, a new Agent (new pid) answers the next request."""
    agents = tmp_path / "agents"
    agents.mkdir()
    per_process = ["sh", "-c", 'exec "$0" "$1" "$2/$$.jsonl"', sys.executable, str(RAW_AGENT)]
    proxy, control = await controlled([*per_process, str(agents)])
    assert await barrier(proxy, "first") == []
    [before] = await off(control.links)
    assert await off(control.kill_agent, signal="TERM", respawn=True) == [before["id"]]
    assert await barrier(proxy, "second") == []  # waits while the Agent is down
    [after] = await off(control.links)
    assert after["id"] == before["id"]
    assert after["agent"]["pid"] != before["agent"]["pid"]
    assert captured(agents / f"{before['agent']['pid']}.jsonl") == [request(0, "_test/barrier")]
    assert captured(agents / f"{after['agent']['pid']}.jsonl") == [request(1, "_test/barrier")]
    assert proxy.process.returncode is None


async def test_sever_action_closes_the_chosen_websocket_with_the_code(
    controlled: Controlled, capture: Path
) -> None:
    """POST /api/actions/sever: one link's Client gets the close code asked for, the other lives."""
    proxy, control = await controlled(raw_agent(capture), "--listen", "ws://127.0.0.1:0/acp")
    url = (await proxy.logged("listening"))["url"]
    async with websocket(url) as first:
        await ask(first, 1, "_x/one")  # answered: its link exists
        [first_link] = await off(control.links)
        async with websocket(url) as second:
            await ask(second, 1, "_x/two")
            links = await off(control.links)
            assert [link["client"] for link in links] == [{"transport": "ws"}] * 2
            [second_id] = [link["id"] for link in links if link["id"] != first_link["id"]]
            cut = await off(control.sever, side="client", close_code=4001, link=first_link["id"])
            assert cut == [first_link["id"]]
            assert await closed_with(first) == 4001
            await ask(second, 2, "_x/still-here")
            assert await off(control.sever, link=second_id) == [second_id]  # both sides, 1001
            assert await closed_with(second) == 1001


async def test_kill_agent_closes_a_websocket_client_with_1011_and_the_signal(
    controlled: Controlled, capture: Path
) -> None:
    """kill_agent on a WebSocket Client's link: the Agent dies as a crashed one does, and the
    Client's close says so (1011, "the agent was killed by SIGKILL")."""
    proxy, control = await controlled(raw_agent(capture), "--listen", "ws://127.0.0.1:0/acp")
    url = (await proxy.logged("listening"))["url"]
    async with websocket(url) as connection:
        await ask(connection, 1, "_x/up")
        await off(control.kill_agent)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(TIMEOUT):
                await connection.recv()
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1011,
        "the agent was killed by SIGKILL",
    )


async def test_restart_proxy_action_cuts_every_link_and_listens_again(
    controlled: Controlled, capture: Path
) -> None:
    """POST /api/actions/restart_proxy: the Client is cut, the listener comes back on its port."""
    proxy, control = await controlled(raw_agent(capture), "--listen", "ws://127.0.0.1:0/acp")
    url = (await proxy.logged("listening"))["url"]
    async with websocket(url) as before:
        await ask(before, 1, "_x/before")
        [old] = await off(control.links)
        await off(control.restart_proxy, downtime_ms=0)
        assert await closed_with(before) is not None
    assert (await proxy.logged("listening", 2))["url"] == url
    async with websocket(url) as after:
        await ask(after, 1, "_x/after")
        [new] = await off(control.links)
    assert new["id"] != old["id"]
    (restart,) = log_events(proxy.stderr, "restart requested over the control API")
    assert restart["downtime_ms"] == 0


async def test_the_api_answers_while_messages_stream_through(
    controlled: Controlled, capture: Path
) -> None:
    """/healthz and /metrics answer while the relay carries a steady stream of requests."""
    proxy, control = await controlled(raw_agent(capture))
    stop, flowing = asyncio.Event(), asyncio.Event()
    answered = 0

    async def stream() -> None:
        nonlocal answered
        padding = {"pad": "x" * 2000}
        while not stop.is_set():
            await proxy.send(*(request(answered + n, "_x/load", padding) for n in range(100)))
            for n in range(100):
                assert json.loads(await proxy.recv())["id"] == answered + n
            answered += 100
            flowing.set()

    load = asyncio.create_task(stream())  # noqa: TID251 - the test awaits it
    try:
        await asyncio.wait_for(flowing.wait(), TIMEOUT)
        for _ in range(5):
            assert (await off(control.health))["status"] == "ok"
            scraped = await off(
                control.metric, "acp_proxy_messages_total", direction="to_agent", method="other"
            )
            assert scraped >= 100
            assert not load.done()  # answered while the stream still flowed
    finally:
        stop.set()
        await asyncio.wait_for(load, TIMEOUT)
    assert await off(control.metric, "acp_proxy_messages_total", direction="to_client") == answered


# -- what the proxy knows ----------------------------------------------------------------------------


async def test_links_show_transports_pids_and_pending_requests(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """/api/links: each side's transport, the Agent's pid, requests pending per direction, and
    messages a fault holds (an answer held is no longer pending, and counted there)."""
    faults = fault_file(
        tmp_path,
        {
            "name": "late-answer",
            "when": {"method": "_x/slow", "kind": "response"},
            "do": {"action": "delay", "ms": 600_000},
        },
    )
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    pid = (await proxy.logged("agent started"))["pid"]
    assert await off(control.health) == {"status": "ok", "links": 1}
    [link] = await off(control.links)
    assert link == {
        "id": link["id"],
        "client": {"transport": "stdio"},
        "agent": {"transport": "stdio", "pid": pid},
        "pending": {"to_agent": 0, "to_client": 0},
        "held": {"to_agent": 0, "to_client": 0},
    }
    # The Agent asks the Client something: pending toward the Client until the Client answers.
    await proxy.send(say(request("agent-asks", "_x/question")))
    [asked] = await barrier(proxy, "1")
    forwarded_id = json.loads(asked)["id"]
    [link] = await off(control.links)
    assert link["pending"] == {"to_agent": 0, "to_client": 1}
    await proxy.send(encode({"jsonrpc": "2.0", "id": forwarded_id, "result": {}}))
    assert await barrier(proxy, "2") == []
    [link] = await off(control.links)
    assert link["pending"] == {"to_agent": 0, "to_client": 0}
    assert captured(capture)[-2] == encode({"jsonrpc": "2.0", "id": "agent-asks", "result": {}})
    await proxy.send(request("slow", "_x/slow"))
    await until_logged(proxy, "fault injected")
    [link] = await off(control.links)
    assert (link["pending"], link["held"]) == (
        {"to_agent": 0, "to_client": 0},
        {"to_agent": 0, "to_client": 1},
    )


async def test_ledger_and_findings_are_empty_lists_without_keyed_prompts(
    controlled: Controlled, capture: Path
) -> None:
    """/api/ledger and /api/findings: ``{"ledger": []}`` and ``{"findings": []}`` on a quiet run."""
    proxy, control = await controlled(raw_agent(capture))
    assert await barrier(proxy, "1") == []
    ledger = await off(call, control.base_url, "GET", "/api/ledger")
    assert (ledger.status, ledger.json()) == (200, {"ledger": []})
    findings = await off(call, control.base_url, "GET", "/api/findings")
    assert (findings.status, findings.json()) == (200, {"findings": []})


def raw_events(response: Any, count: int) -> list[bytes]:
    """The next ``count`` events of a bare /api/events response, as bytes (keep-alives skipped)."""
    events: list[bytes] = []
    event = b""
    while len(events) < count:
        line = response.readline()
        assert line, "the event stream ended"
        event += line
        if line == b"\n":
            if event.strip() not in (b"", b":"):
                events.append(event)
            event = b""
    return events


async def test_events_stream_trace_records_live_to_every_subscriber(
    controlled: Controlled, capture: Path, tmp_path: Path
) -> None:
    """/api/events: SSE, one ``data:`` line per trace record, live, to each subscriber."""
    faults = fault_file(tmp_path, drop("lose-a", "_x/a"))
    proxy, control = await controlled(raw_agent(capture), "--faults", str(faults))
    assert await barrier(proxy, "before") == []  # not streamed: nobody listened yet
    bare = await off(OPENER.open, control.base_url + "/api/events", timeout=TIMEOUT)
    with bare, await off(control.events) as events:
        assert bare.headers.get_content_type() == "text/event-stream"
        await proxy.send(request(7, "_x/ping"))
        assert (await proxy.recv_json())["id"] == 7
        first = await off(events.next)  # live: before anything else happens
        await proxy.send(say(A, B))
        assert await barrier(proxy, "after") == [B]
        records = [first, *[await off(events.next) for _ in range(7)]]
        raw = await off(raw_events, bare, 8)

    def summary(direction: str) -> list[tuple[str, str, str | None, str | None]]:
        return [
            (r["event"], r["kind"], r["method"], r.get("rule"))
            for r in records
            if r["direction"] == direction
        ]

    # Per direction the order is the relay's; between directions it depends on the peers' timing.
    assert summary("to_agent") == [
        ("message", "request", "_x/ping", None),
        ("message", "notification", "_test/say", None),
        ("message", "request", "_test/barrier", None),
    ]
    assert summary("to_client") == [
        ("message", "response", "_x/ping", None),
        ("fault", "notification", "_x/a", "lose-a"),
        ("message", "notification", "_x/a", "lose-a"),  # dropped: not relayed
        ("message", "notification", "_x/b", None),
        ("message", "response", "_test/barrier", None),
    ]
    assert (records[0]["id"], records[0]["forwarded_id"]) == (7, 1)  # the proxy minted 0 before
    assert (records[1]["id"], records[1]["forwarded_id"]) == (7, 1)
    assert [json.loads(event.removeprefix(b"data: ")) for event in raw] == records
    for event in raw:
        assert event.startswith(b"data: {"), event
        assert event.endswith(b"}\n\n"), event
        assert event.count(b"\n") == 2  # one line of compact JSON per event


async def test_rules_are_disabled_enabled_and_added_as_yaml_text(
    controlled: Controlled, capture: Path
) -> None:
    """PATCH /api/rules/{name} turns a rule off and on (its counters kept); POST /api/rules/text
    takes YAML, its errors located on their lines as ``validate`` locates a file's."""
    proxy, control = await controlled(raw_agent(capture))
    text = "name: lose-a\nwhen:\n  method: _x/a\ndo:\n  action: dorp\n"
    typo = await off(call, control.base_url, "POST", "/api/rules/text", encode({"text": text}))
    body = assert_error(typo, 400, "invalid rules")
    assert body["errors"][0].startswith(
        "rule:4: rule 'lose-a': do: unknown action 'dorp' (did you mean 'drop'?)"
    )
    text = text.replace("dorp", "drop")
    added = await off(call, control.base_url, "POST", "/api/rules/text", encode({"text": text}))
    assert added.status == 201
    assert added.json()["rules"] == [drop("lose-a", "_x/a") | {"when": {"method": "_x/a"}}]
    again = await off(call, control.base_url, "POST", "/api/rules/text", encode({"text": text}))
    assert_error(again, 409, "a rule named 'lose-a' already exists")
    await proxy.send(say(A, B))
    assert await barrier(proxy, "1") == [B]

    off_ = await off(call, control.base_url, "PATCH", "/api/rules/lose-a", b'{"enabled": false}')
    assert off_.json()["rules"][0]["enabled"] is False
    await proxy.send(say(A, B))
    assert await barrier(proxy, "2") == [A, B]
    assert await off(control.counters) == {"lose-a": RuleCounters(1, 1)}
    await off(call, control.base_url, "PATCH", "/api/rules/lose-a", b'{"enabled": true}')
    await proxy.send(say(A, B))
    assert await barrier(proxy, "3") == [B]
    assert await off(control.counters) == {"lose-a": RuleCounters(2, 2)}
    missing = await off(call, control.base_url, "PATCH", "/api/rules/nope", b'{"enabled": true}')
    assert_error(missing, 404, "no rule named 'nope'")
    bad = await off(call, control.base_url, "PATCH", "/api/rules/lose-a", b'{"enabled": "no"}')
    assert bad.status == 400
    assert "enabled" in bad.json()["errors"][0]


async def test_events_carry_the_messages_bodies_only_when_asked(
    controlled: Controlled, capture: Path
) -> None:
    """/api/events?bodies=1: each ``message`` record carries its message's JSON as it arrived (a
    long one cut, ``truncated``); a plain subscriber gets the records without them."""
    proxy, control = await controlled(raw_agent(capture))
    plain = await off(OPENER.open, control.base_url + "/api/events", timeout=TIMEOUT)
    bodies = await off(OPENER.open, control.base_url + "/api/events?bodies=1", timeout=TIMEOUT)
    with plain, bodies:
        await proxy.send(request(7, "_x/ping", {"text": "x" * 20_000}))
        assert (await proxy.recv_json())["id"] == 7
        [without] = [json.loads(e.removeprefix(b"data: ")) for e in await off(raw_events, plain, 1)]
        [asked, answer] = [
            json.loads(e.removeprefix(b"data: ")) for e in await off(raw_events, bodies, 2)
        ]
    assert "body" not in without
    assert asked == {**without, "body": asked["body"], "truncated": True}
    assert asked["body"].startswith('{"jsonrpc":"2.0","id":7,"method":"_x/ping"')
    assert len(asked["body"]) == 16 * 1024
    assert json.loads(answer["body"])["result"]["method"] == "_x/ping"  # as the Agent sent it
    assert "truncated" not in answer
