"""The statistics of the bench (``proxy.tools.bench.stats``): nearest-rank percentiles, latency
figures in milliseconds."""

from __future__ import annotations

import pytest

from proxy.tools.bench.stats import concurrent, latency, percentile


@pytest.mark.parametrize(("q", "value"), [(0, 1.0), (50, 2.0), (75, 3.0), (99, 4.0), (100, 4.0)])
def test_a_percentile_is_a_value_of_the_samples_by_nearest_rank(q: float, value: float) -> None:
    """Never interpolated: the p50 of 1, 2, 3, 4 is 2, the p99 is 4; the order given is ignored."""
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == value


def test_latency_figures_are_in_milliseconds() -> None:
    """Seconds in; count, min, p50, p99, mean in ms, and round trips a second one after another."""
    figures = latency([0.001, 0.003, 0.002, 0.002])
    assert figures["count"] == 4
    assert figures["min_ms"] == pytest.approx(1.0)
    assert figures["p50_ms"] == pytest.approx(2.0)
    assert figures["p99_ms"] == pytest.approx(3.0)
    assert figures["mean_ms"] == pytest.approx(2.0)
    assert figures["per_second"] == pytest.approx(500.0)


def test_concurrent_round_trips_add_the_aggregate_rate() -> None:
    """Round trips of many links at once: how many a second over the wall time; none: None."""
    figures = concurrent([0.01] * 10, wall=0.02)
    assert figures is not None
    assert (figures["wall_seconds"], figures["aggregate_per_second"]) == (0.02, 500.0)
    assert concurrent([], wall=1.0) is None
