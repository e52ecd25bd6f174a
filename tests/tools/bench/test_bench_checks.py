"""The DESIGN 11 targets (``proxy.tools.bench.checks``): each checked, PASS, MISS or SKIP with a
reason, in the short bench's report."""

from __future__ import annotations

import math

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, short_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TEST_TIMEOUT)]

STATUSES = {"PASS", "MISS", "SKIP"}


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
