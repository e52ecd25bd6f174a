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
    assert ("rules loaded cost at most 5% of the stream", "proxy+rules") in names
    client = "the Client is not the bottleneck: direct stream at least 3x the proxy's"
    assert (client, "direct") in names
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
    headroom = next(check for check in checks if check["name"] == client)
    assert headroom["status"] != "SKIP", headroom
