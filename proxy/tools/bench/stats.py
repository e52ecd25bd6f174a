"""The statistics of the bench's samples: percentiles, and the latency figures of a list of
round trips (in seconds in, milliseconds out)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["Figures", "concurrent", "latency", "percentile"]

Figures = dict[str, float | int]
"""Named figures of one measurement (``p50_ms``, ``per_second``...), JSON-ready."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by the nearest rank (a value of ``values``, never interpolated)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def latency(values: Sequence[float]) -> Figures:
    """Round trips in seconds: their count, min, p50, p99 and mean in ms, and how many a second
    one after the other."""
    ms = [value * 1000 for value in values]
    return {
        "count": len(ms),
        "min_ms": min(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms),
        "per_second": len(ms) / sum(values),
    }


def concurrent(values: list[float], wall: float) -> Figures | None:
    """Round trips of many links at once: each one's, and how many a second in all."""
    if not values:
        return None
    return {**latency(values), "wall_seconds": wall, "aggregate_per_second": len(values) / wall}
