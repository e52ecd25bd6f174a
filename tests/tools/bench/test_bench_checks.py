"""The DESIGN 11 targets (``proxy.tools.bench.checks``): each checked, PASS, MISS or SKIP with a
reason, in the short bench's report."""

from __future__ import annotations

import math

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, short_bench

from proxy.tools.bench import render
from proxy.tools.bench.checks import design_checks
from proxy.tools.bench.workloads import Samples, compare, figures, round_added

STATUSES = {"PASS", "MISS", "SKIP"}


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TEST_TIMEOUT)
def test_the_design_targets_are_checked() -> None:
    report = short_bench()
    checks = report["design_targets"]
    assert {check["status"] for check in checks} <= STATUSES
    names = {(check["name"], check["target"]) for check in checks}
    for target in ("proxy", "proxy+rules"):
        assert ("stream at least 0.6x the asyncio relay's", target) in names
        assert ("ping added p50 at most 1.2x the asyncio relay's", target) in names
        assert ("64 KiB prompt added p50 at most 1.2x the asyncio relay's", target) in names
    assert ("stream with rules loaded at least 0.95x the stream without", "proxy+rules") in names
    client = "the Client is not the bottleneck: direct stream at least 3x the proxy's"
    assert (client, "direct") in names
    ws_client = "the Client is not the bottleneck: direct WebSocket stream at least 3x the proxy's"
    assert ("WebSocket stream at least 0.9x the websockets relay's", "proxy") in names
    assert ("WebSocket ping added p50 at most 1.3x the websockets relay's", "proxy") in names
    assert ("WebSocket stream at least 1x mitmproxy's", "proxy") in names
    assert ("WebSocket ping added p50 at most 1x mitmproxy's", "proxy") in names
    assert (ws_client, "direct") in names
    assert ("memory flat over a long run", "proxy+rules") in names
    assert ("1,000 concurrent WebSocket links", "proxy") in names
    assert ("injected delays within +2 ms at p99", "proxy, idle") in names
    assert ("injected delays within +2 ms at p99", "proxy, busy") in names
    for check in checks:
        if check["status"] == "SKIP":
            assert check["note"]
        else:
            assert math.isfinite(check["value"])
            assert math.isfinite(check["limit"])
    for name in (client, ws_client):
        headroom = next(check for check in checks if check["name"] == name)
        assert headroom["status"] != "SKIP", headroom
    relay = [c for c in checks if "websockets relay" in c["name"]]
    assert {c["status"] for c in relay} <= {"PASS", "MISS"}, relay
    mitmproxy = [c for c in checks if "mitmproxy" in c["name"]]
    assert len(mitmproxy) == 2
    if not report["websocket"]["targets"]["mitmproxy"]["available"]:
        assert all(c["status"] == "SKIP" for c in mitmproxy)
        assert all("mitmdump not found on PATH" in c["note"] for c in mitmproxy)
    rounds = report["config"]["rounds"]
    for target in report["targets"].values():
        if "workloads" in target:
            assert [len(p50s) for p50s in target["round_p50_ms"].values()] == [rounds, rounds]
    added = [c for c in checks if " added p50 " in c["name"] and c["status"] != "SKIP"]
    assert added
    for each in added:
        assert len(each["rounds"]) <= rounds
        if rounds == 1 and each["rounds"]:  # one round: its figure is the run's
            assert each["rounds"] == [pytest.approx(each["value"])]


def samples(ping_p50_ms: list[float], prompt_p50_ms: list[float]) -> Samples:
    """A target's samples whose rounds had these p50s (the pooled figures from the same)."""
    taken = Samples(
        ping=[ms / 1000 for ms in ping_p50_ms],
        prompt=[ms / 1000 for ms in prompt_p50_ms],
        stream_messages=1000,
        stream_seconds=0.01,
    )
    taken.round_p50_ms = {"ping": ping_p50_ms, "prompt64k": prompt_p50_ms}
    return taken


def test_each_rounds_ratio_stands_beside_the_runs() -> None:
    """A round runs every target in turn: its own ratio of added latency says how far the rounds
    agree (a floor that added nothing in a round has no ratio there)."""
    measured = {
        "direct": samples([0.10, 0.10, 0.10], [0.20, 0.20, 0.20]),
        "asyncio": samples([0.20, 0.30, 0.10], [0.30, 0.40, 0.50]),
        "proxy": samples([0.22, 0.40, 0.15], [0.35, 0.45, 0.50]),
    }
    assert round_added(measured["proxy"], measured["direct"])["ping"] == pytest.approx(
        [0.12, 0.30, 0.05]
    )
    rounds = {target: round_added(taken, measured["direct"]) for target, taken in measured.items()}
    figured = {target: figures(taken) for target, taken in measured.items()}
    comparisons = {
        target: {base: compare(figured[target], figured[base]) for base in ("direct", "asyncio")}
        for target in ("proxy", "asyncio")
    }
    checks = design_checks(comparisons, None, None, None, {}, rounds=rounds, websocket=[])
    by_name = {(c["name"], c["target"]): c for c in checks}
    ping = by_name["ping added p50 at most 1.2x the asyncio relay's", "proxy"]
    assert ping["rounds"] == pytest.approx([1.2, 1.5])  # the third round's floor added nothing
    prompt = by_name["64 KiB prompt added p50 at most 1.2x the asyncio relay's", "proxy"]
    assert prompt["rounds"] == pytest.approx([1.5, 1.25, 1.0])
    unmeasured = by_name["ping added p50 at most 1.2x the asyncio relay's", "proxy+rules"]
    assert unmeasured["status"] == "SKIP"
    assert "rounds" not in unmeasured


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TEST_TIMEOUT)
def test_the_text_report_shows_each_rounds_figure() -> None:
    report = short_bench()
    name = "ping added p50 at most 1.2x the asyncio relay's"
    shown = {
        3: "; each round 1.31 1.12 1.55)",
        8: "; 8 rounds 1.00-1.70)",
    }
    for count, text in shown.items():
        figures_of_rounds = [1.31, 1.12, 1.55] if count == 3 else [1.0, 1.7, *[1.2] * 6]
        checks = [
            {**c, "value": 1.3, "limit": 1.2, "status": "MISS", "rounds": figures_of_rounds}
            if c["name"] == name and c["target"] == "proxy"
            else c
            for c in report["design_targets"]
        ]
        line = next(
            line
            for line in render({**report, "design_targets": checks}).splitlines()
            if name in line and "[proxy]" in line
        )
        assert f"1.300 (limit 1.200{text}" in line
    one = [{**c, "rounds": [1.3]} for c in report["design_targets"]]
    assert "each round" not in render({**report, "design_targets": one})
