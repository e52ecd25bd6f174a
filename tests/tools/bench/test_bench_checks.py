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
        assert ("ping added p50 within 2x socat's", target) in names
        assert ("stream throughput at least 50% of direct", target) in names
        assert ("64 KiB prompt added p50 under 0.5 ms", target) in names
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
    if not report["targets"]["socat"]["available"]:
        relative = [c for c in checks if c["name"].startswith("ping added")]
        assert all(check["status"] == "SKIP" for check in relative)
