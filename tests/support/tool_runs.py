"""The tools as a user runs them: ``acp-proxy check-agent`` and ``acp-proxy bench`` in a
subprocess, their output captured; the short bench's report, run once per test session, and the
shape of its figures."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from typing import Any

from harness import TIMEOUT

__all__ = ["bench", "check_agent", "latency_figures", "positive", "short_bench"]


def check_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy check-agent ARGS``, finished."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-agent", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
        check=False,
    )


BENCH_BOUND = TIMEOUT * 12
"""Seconds a short bench may take before it counts as hung: about a minute on an idle 2-core
machine, over 5 with two test runs and two CPU hogs on the same cores."""

BENCH_TEST_TIMEOUT = BENCH_BOUND + 60
"""pytest-timeout's backstop for a test that runs a short bench (its default of 300 s is
shorter than the bench's own bound: under load the backstop fired first)."""


def bench(*args: str) -> dict[str, Any]:
    """The report of ``acp-proxy bench --short --json ARGS``, which must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "bench", "--short", "--json", *args],
        capture_output=True,
        text=True,
        # A bound on a hang, not a figure: the short bench runs about a minute on an idle 2-core
        # machine, and took over 3 with two test runs and a CPU hog on the same cores.
        timeout=BENCH_BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


@functools.cache
def short_bench() -> dict[str, Any]:
    """The report of one ``acp-proxy bench --short --json``, shared by the tests that read it."""
    return bench()


def positive(value: object) -> bool:
    """A finite number above 0."""
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def latency_figures(figures: dict[str, Any], count: int) -> None:
    """Latency figures of ``count`` round trips, each positive and in order."""
    assert figures["count"] == count
    for key in ("min_ms", "p50_ms", "p99_ms", "mean_ms", "per_second"):
        assert positive(figures[key]), key
    assert figures["min_ms"] <= figures["p50_ms"] <= figures["p99_ms"]
