"""The injected-delay check (``proxy.tools.bench.delays``), in the short bench's report, and its
fault file."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, latency_figures, positive, short_bench

from proxy.shell.fault_files import load_fault_files
from proxy.tools.bench import DELAY_RULES
from proxy.tools.bench.delays import BACKGROUND_RATE, MAX_BURST, _background
from proxy.tools.bench.processes import StdioPeer

pytestmark = pytest.mark.timeout(BENCH_TEST_TIMEOUT)


@pytest.mark.slow
def test_injected_delays_are_measured_idle_and_busy() -> None:
    report = short_bench()
    delays = report["delays"]
    setting = report["config"]["delay_ms"]
    count = report["config"]["delays"]
    assert delays["setting_ms"] == setting > 0
    assert delays["requests"] == count > 0
    assert set(delays["variants"]) == {"idle", "busy"}
    for variant in delays["variants"].values():
        latency_figures(variant["baseline"], count)
        latency_figures(variant["observed"], count)
        # The rule fired on every marked request: none came back sooner than it was held.
        assert variant["observed"]["min_ms"] >= setting
        excess = variant["excess"]
        assert excess["count"] == count
        for key in ("p50_ms", "p99_ms", "max_ms", "mean_ms"):
            assert math.isfinite(excess[key]), key
        assert excess["p50_ms"] <= excess["p99_ms"] <= excess["max_ms"]
    assert positive(delays["variants"]["busy"]["background_per_second"])
    checks = [c for c in report["design_targets"] if c["name"].startswith("injected delays")]
    assert {c["target"] for c in checks} == {"proxy, idle", "proxy, busy"}
    assert {c["status"] for c in checks} <= {"PASS", "MISS"}


def test_the_delay_rule_holds_the_marked_method_only(tmp_path: Path) -> None:
    """One rule: a delay of ``_bench/delayed`` requests."""
    path = tmp_path / "delay.yaml"
    path.write_text(DELAY_RULES)
    [rule] = load_fault_files([path]).rules
    assert rule.do.action == "delay"
    assert rule.when.method == "_bench/delayed"


async def test_the_background_traffic_never_buries_a_slow_proxy() -> None:
    """Beside a target that reads at most 1,000 lines a second, the busy variant's traffic is
    what the target takes: what fell behind the 10,000-a-second schedule is skipped, never
    written late in one catch-up burst that every later round trip would wait behind."""
    slow = "import sys, time\nfor line in sys.stdin.buffer:\n    time.sleep(0.001)\n"
    peer = await StdioPeer.spawn([sys.executable, "-c", slow])
    writes: list[int] = []
    write = peer.writer.write

    def counted(data: bytes) -> None:  # the real write, its size recorded
        writes.append(data.count(b"\n"))
        write(data)

    peer.writer.write = counted  # type: ignore[method-assign,assignment]
    stop = asyncio.Event()
    try:
        background = asyncio.get_running_loop().create_task(_background(peer, stop))
        await asyncio.sleep(1.0)  # the length of the traffic, not a wait for an event
        stop.set()
        sent, seconds = await background
    finally:
        await peer.close()
    assert seconds >= 1.0
    assert sum(writes) == sent
    assert max(writes) <= MAX_BURST
    assert sent < 0.6 * BACKGROUND_RATE * seconds  # the target took far less than the schedule
