"""The Prometheus metrics (DESIGN 9) as a scraper sees them after a scripted run.

A real proxy process (``--admin 127.0.0.1:0``) relays a scripted conversation between the test (a
raw stdio Client) and the scripted raw Agent, with fault rules, invalid lines, an orphan response,
an Agent respawn, a restart and two reloads of the fault file (``--watch``). Then ``/metrics`` is
fetched over HTTP and parsed with ``prometheus_client``'s own parser, and every series is checked
by value: which messages were counted under which labels, bytes, faults, durations, connections,
restarts and reloads, and that no label carries an id or a session.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import yaml
from harness import TIMEOUT, Controlled, encode, notification, raw_agent, request, say
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect as ws_connect

from proxy.core.acp import METHODS
from proxy.shell.limits import COUNTED

P = ParamSpec("P")
T = TypeVar("T")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
SESSION = "sess-7f3a"


async def off(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking call in a thread (the event loop keeps reading the proxy)."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kwargs), TIMEOUT)


def rules_file(path: Path, *extra: dict[str, Any]) -> None:
    """Write the fault file (replacing it in one step, for the watcher)."""
    rules = [
        {
            "name": "drop-b",
            "when": {"direction": "to_client", "method": "_x/b"},
            "do": {"action": "drop"},
        },
        {"name": "fail-it", "when": {"method": "_x/fail"}, "do": {"action": "error"}},
        *extra,
    ]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(yaml.safe_dump({"version": 1, "rules": rules}))
    os.replace(temporary, path)


def scrape(base: str) -> tuple[str, str]:
    """GET /metrics as a scraper does: the content type and the text."""
    with OPENER.open(base + "/metrics", timeout=TIMEOUT) as response:
        return response.headers["Content-Type"], response.read().decode()


def parse(text: str) -> tuple[dict[str, str], Series]:
    """The families' types, and every sample's value by (name, labels)."""
    types: dict[str, str] = {}
    series: Series = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            series[sample.name, frozenset(sample.labels.items())] = sample.value
    return types, series


def of(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one name, by their labels."""
    return {labels: value for (sample, labels), value in series.items() if sample == name}


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    """A label set."""
    return frozenset(pairs.items())


async def test_a_scripted_run_is_counted_exactly(controlled: Controlled, tmp_path: Path) -> None:
    """Messages, bytes, faults, invalid lines, orphans, durations, restarts, reloads: exact values."""
    faults = tmp_path / "faults.yaml"
    rules_file(faults)
    proxy, control = await controlled(
        raw_agent(tmp_path / "agent.jsonl"), "--faults", str(faults), "--watch"
    )
    # The Client uses the ids the proxy mints (0, 1, ...), so sizes are the same on both hops.
    to_agent = [
        request(0, "initialize", {"protocolVersion": 1}),
        request(1, "session/prompt", {"sessionId": SESSION, "prompt": []}),
        notification("session/cancel", {"sessionId": SESSION}),
    ]
    update = notification("session/update", {"sessionId": SESSION, "update": {}})
    orphan = encode({"jsonrpc": "2.0", "id": 999, "result": {}})
    from_agent = say(
        update, update, notification("_x/b"), b"not json", orphan, notification("_x/a")
    )
    await proxy.send(to_agent[0], to_agent[1], request("f", "_x/fail"), to_agent[2], from_agent)
    await proxy.send(b'{"jsonrpc":"2.0","method":5}', b"[]", b"\xff")  # invalid, forwarded as is
    barriers = [request(n, "_test/barrier") for n in (2, 3, 4)]
    await proxy.send(barriers[0])
    received = [await proxy.recv() for _ in range(8)]
    assert json.loads(received[-1])["id"] == 2  # the barrier's answer comes last

    assert await off(control.kill_agent, respawn=True) != []  # restarts_total{what="agent"}
    await proxy.send(barriers[1])
    received.append(await proxy.recv())
    await off(control.restart_proxy)  # restarts_total{what="proxy"}
    await proxy.send(barriers[2])
    received.append(await proxy.recv())

    rules_file(faults, {"name": "new", "do": {"action": "drop"}, "when": {"method": "_x/new"}})
    await proxy.logged("fault files reloaded")
    faults.write_text("version: 1\nrules: 5\n")  # not a list of rules: refused
    await proxy.logged("fault file reload refused; keeping the last good rules")

    content_type, text = await off(scrape, control.base_url)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    types, series = parse(text)

    assert of(series, "acp_proxy_messages_total") == {
        labels(direction="to_agent", kind="request", method="initialize"): 1,
        labels(direction="to_agent", kind="request", method="session/prompt"): 1,
        labels(direction="to_agent", kind="notification", method="session/cancel"): 1,
        labels(direction="to_agent", kind="notification", method="other"): 1,  # _test/say
        labels(direction="to_agent", kind="request", method="other"): 3,  # barriers, not _x/fail
        labels(direction="to_client", kind="response", method="initialize"): 1,
        labels(direction="to_client", kind="response", method="session/prompt"): 1,
        labels(direction="to_client", kind="notification", method="session/update"): 2,
        labels(direction="to_client", kind="notification", method="other"): 1,  # _x/a, not _x/b
        labels(direction="to_client", kind="response", method="other"): 3,
    }
    relayed_to_client = [
        line
        for line in received
        if line != b"not json" and b'"id":"f"' not in line  # forwarded invalid; injected error
    ]
    sent_to_agent = [*to_agent, from_agent, *barriers]
    assert of(series, "acp_proxy_bytes_total") == {
        labels(direction="to_agent"): sum(len(line) for line in sent_to_agent),
        labels(direction="to_client"): sum(len(line) for line in relayed_to_client),
    }
    assert of(series, "acp_proxy_faults_injected_total") == {
        labels(rule="drop-b", action="drop"): 1,
        labels(rule="fail-it", action="error"): 1,
    }
    assert of(series, "acp_proxy_invalid_messages_total") == {
        labels(direction="to_agent", reason="invalid_shape"): 1,
        labels(direction="to_agent", reason="empty_batch"): 1,
        labels(direction="to_agent", reason="not_utf8"): 1,
        labels(direction="to_client", reason="invalid_json"): 1,
    }
    assert of(series, "acp_proxy_orphan_responses_total") == {labels(direction="to_client"): 1}
    assert of(series, "acp_proxy_pending_requests") == {
        labels(direction="to_agent"): 0,
        labels(direction="to_client"): 0,
    }
    counts = of(series, "acp_proxy_request_duration_seconds_count")
    assert counts == {
        labels(method="initialize"): 1,
        labels(method="session/prompt"): 1,
        labels(method="other"): 3,
    }
    for method_labels, count in counts.items():
        buckets = of(series, "acp_proxy_request_duration_seconds_bucket")
        assert buckets[method_labels | {("le", "+Inf")}] == count
        assert series["acp_proxy_request_duration_seconds_sum", method_labels] > 0
    assert of(series, "acp_proxy_connections_total") == {
        labels(side="client", transport="stdio"): 1,
        labels(side="agent", transport="stdio"): 3,  # the first, the respawned, the restarted
    }
    assert of(series, "acp_proxy_active_connections") == {
        labels(side="client", transport="stdio"): 1,
        labels(side="agent", transport="stdio"): 1,
    }
    assert of(series, "acp_proxy_restarts_total") == {
        labels(what="agent"): 1,
        labels(what="proxy"): 1,
    }
    assert of(series, "acp_proxy_config_reloads_total") == {
        labels(result="success"): 1,
        labels(result="error"): 1,
    }
    assert control.metric("acp_proxy_messages_total", direction="to_client") == 8  # label subset
    assert of(series, "acp_proxy_refused_requests_total") == {  # scraped at 0 before a refusal
        labels(server=server, reason=reason): 0
        for server in ("listener", "admin")
        for reason in ("host", "origin")
    }
    assert of(series, "acp_proxy_limit_reached_total") == {  # scraped at 0 before a limit
        labels(limit=limit, where=where): 0 for limit, where in COUNTED
    }
    assert of(series, "acp_proxy_held_outcomes_total") == {  # scraped at 0 before a hold ends
        labels(outcome=outcome): 0
        for outcome in ("release", "drop", "edit", "timeout_release", "timeout_drop", "link_end")
    }
    assert of(series, "acp_proxy_held_messages") == {labels(): 0}

    assert types["acp_proxy_messages"] == "counter"
    assert types["acp_proxy_request_duration_seconds"] == "histogram"
    assert types["acp_proxy_pending_requests"] == "gauge"
    assert types["acp_proxy_active_connections"] == "gauge"
    # Labels are bounded: known names only, methods from ACP's list or "other", never an id.
    names = {name for _, label_set in series for name, _ in label_set}
    assert names <= {
        "direction", "kind", "method", "rule", "action", "side", "transport", "reason",
        "what", "result", "attempt", "check", "le", "file", "server", "limit", "where",
        "outcome",
    }  # fmt: skip
    values = {value for _, label_set in series for _, value in label_set}
    assert {SESSION, "f", "999", "2", "_x/a", "_x/b", "_test/barrier", "_test/say"}.isdisjoint(
        values
    )
    methods = {value for _, label_set in series for name, value in label_set if name == "method"}
    assert methods <= METHODS | {"other", "none"}

    # The closing log line sums the same count the metrics read: they agree.
    await proxy.close_stdin()
    finished = await proxy.logged("proxy finished")
    assert await proxy.wait() == 0

    def total(name: str) -> float:
        return sum(of(series, name).values())

    assert finished["messages"] == total("acp_proxy_messages_total") == 15
    assert finished["faults"] == total("acp_proxy_faults_injected_total") == 2
    assert finished["invalid"] == total("acp_proxy_invalid_messages_total") == 4
    assert finished["orphan_responses"] == total("acp_proxy_orphan_responses_total") == 1
    assert finished["restarts"] == total("acp_proxy_restarts_total") == 2
    reloads = of(series, "acp_proxy_config_reloads_total")  # a refused reload is no reload
    assert finished["reloads_success"] == reloads[labels(result="success")] == 1
    assert finished["reloads_error"] == reloads[labels(result="error")] == 1
    assert finished["connections"] == total("acp_proxy_connections_total") == 4
    assert "findings" not in finished  # a count at 0 is no field; the metric scrapes 0
    assert total("acp_proxy_findings_total") == 0


async def test_network_connections_are_counted_and_active_ones_go_down(
    controlled: Controlled, tmp_path: Path
) -> None:
    """connections_total by side and transport; active_connections back to 0 once the Client left."""
    proxy, control = await controlled(
        raw_agent(tmp_path / "agent.jsonl"), "--listen", "ws://127.0.0.1:0/acp"
    )
    url = (await proxy.logged("listening"))["url"]
    async with asyncio.timeout(TIMEOUT), ws_connect(url) as connection:
        await connection.send(request(1, "_x/hello").decode())
        assert json.loads(await connection.recv())["id"] == 1
        _, series = parse((await off(scrape, control.base_url))[1])
        assert of(series, "acp_proxy_active_connections") == {
            labels(side="client", transport="ws"): 1,
            labels(side="agent", transport="stdio"): 1,
        }
    await proxy.logged("peer disconnected", 2)  # the Client, then the Agent it leaves
    _, series = parse((await off(scrape, control.base_url))[1])
    assert of(series, "acp_proxy_connections_total") == {
        labels(side="client", transport="ws"): 1,
        labels(side="agent", transport="stdio"): 1,
    }
    assert of(series, "acp_proxy_active_connections") == {
        labels(side="client", transport="ws"): 0,
        labels(side="agent", transport="stdio"): 0,
    }


async def test_faults_past_max_active_faults_do_not_act_and_are_counted(
    controlled: Controlled, tmp_path: Path
) -> None:
    """With ``--max-active-faults 1`` and one request held by a long delay, the next the rule
    matches goes on at once and is counted as an overflow; the faults in progress are a gauge,
    back to 0 once the link that held one has ended."""
    faults = tmp_path / "faults.yaml"
    slow = {
        "name": "slow",
        "when": {"direction": "to_agent", "method": "_x/slow"},
        "do": {"action": "delay", "ms": 600_000},
    }
    faults.write_text(yaml.safe_dump({"version": 1, "rules": [slow]}))
    proxy, control = await controlled(
        raw_agent(tmp_path / "agent.jsonl"),
        *("--faults", str(faults), "--max-active-faults", "1", "--listen", "ws://127.0.0.1:0/acp"),
    )
    url = (await proxy.logged("listening"))["url"]
    async with asyncio.timeout(TIMEOUT), ws_connect(url) as connection:
        await connection.send(request(1, "_x/slow").decode())
        await connection.send(request(2, "_x/slow").decode())
        assert json.loads(await connection.recv())["id"] == 2  # the first is held
        _, series = parse((await off(scrape, control.base_url))[1])
        assert of(series, "acp_proxy_active_faults") == {labels(): 1}
        overflow = of(series, "acp_proxy_faults_overflow_total")
        assert overflow == {labels(rule="slow", action="delay"): 1}
        injected = of(series, "acp_proxy_faults_injected_total")
        assert injected == {labels(rule="slow", action="delay"): 1}
    await proxy.logged("link ended")  # its timers forgotten first
    _, series = parse((await off(scrape, control.base_url))[1])
    assert of(series, "acp_proxy_active_faults") == {labels(): 0}
