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

import pytest
from harness import TIMEOUT

__all__ = [
    "acp_proxy",
    "bench",
    "check_agent",
    "check_client",
    "command",
    "latency_figures",
    "positive",
    "session_run",
    "short_bench",
]


CHECK_AGENT_BOUND = TIMEOUT * 8
"""Seconds a check-agent run may take before it counts as hung: 12 s on an idle 2-core machine,
15 with a CPU hog on both cores, and past 120 (the earlier bound) once with a test run, a bench
and a CPU hog sharing the cores."""


def command(*args: str) -> list[str]:
    """The argv of ``acp-proxy ARGS`` (this interpreter's), e.g. an Agent command after ``--``."""
    return [sys.executable, "-m", "proxy", *args]


def acp_proxy(
    *args: str, env: dict[str, str] | None = None, stdin: str = "", timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``acp-proxy ARGS`` (a command that ends by itself: ``validate``, ``schema``, ``run``
    whose stdin ends, ``client``), finished within ``timeout``, its output captured; ``stdin``:
    all it reads (never the test's own); ``env``: the whole environment it runs in."""
    return subprocess.run(
        command(*args),
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def session_run(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy ARGS`` that runs a whole session (a Client and its Agent, a replay): bounded
    by four waits."""
    return acp_proxy(*args, timeout=TIMEOUT * 4)


def check_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy check-agent ARGS``, finished; past its bound the test fails with what the run
    had printed, so that a hang shows where it stopped."""
    return _checker("check-agent", CHECK_AGENT_BOUND, args)


CHECK_CLIENT_BOUND = TIMEOUT * 8
"""Seconds a check-client run may take before it counts as hung (five runs of a Client, each
bounded by the --client-timeout a test gives)."""


def check_client(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy check-client ARGS``, finished; past its bound the test fails with what the
    run had printed."""
    return _checker("check-client", CHECK_CLIENT_BOUND, args)


def _checker(name: str, bound: float, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command(name, *args),
            capture_output=True,
            text=True,
            timeout=bound,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        printed = [_text(exc.stdout), _text(exc.stderr)]
        pytest.fail(f"{name} ran past {bound:g} s; it printed:\n" + "\n".join(printed))


def _text(output: str | bytes | None) -> str:
    """What a timed-out run printed on one stream (bytes: the run was killed mid-line)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


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
