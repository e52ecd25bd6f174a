"""The injected-delay check (``--delays M``): do held messages go on within +2 ms of their
setting at p99, with the proxy idle and busy? (The method: the package's docstring.)

One stdio proxy holds every ``_bench/delayed`` request toward the Agent :data:`DELAY_MS`; M pairs
of a ping (the baseline) and a delayed request (observed) go through it, one in flight, first
alone (``idle``), then beside :data:`BACKGROUND_RATE` notifications a second (``busy``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from proxy.core import acp
from proxy.tools.bench.messages import PING_METHOD
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import StdioPeer
from proxy.tools.bench.stats import latency, percentile
from proxy.tools.bench.targets import agent_argv, quiet_proxy

__all__ = [
    "BACKGROUND_RATE",
    "DELAY_EXCESS_LIMIT_MS",
    "DELAY_METHOD",
    "DELAY_MS",
    "DELAY_RULES",
    "delay_check",
]

DELAY_METHOD = "_bench/delayed"
DELAY_MS = 50.0
DELAY_EXCESS_LIMIT_MS = 2.0
BACKGROUND_RATE = 10_000
"""Notifications a second the Client sends through the proxy in the ``busy`` delay variant."""
MAX_BURST = BACKGROUND_RATE // 100
"""Notifications written at once, at most (10 ms of the rate)."""

DELAY_RULES = f"""\
# Hold every {DELAY_METHOD} request toward the Agent {DELAY_MS:g} ms; nothing else is touched.
version: 1
seed: 1
rules:
  - name: hold-marked-requests
    when: {{direction: to_agent, kind: request, method: {DELAY_METHOD}}}
    do: {{action: delay, ms: {DELAY_MS:g}}}
"""


def _noise(seq: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"_bench/noise","params":{"sessionId":"bench-1","seq":%d,'
        b'"text":"background traffic the Agent ignores"}}\n' % seq
    )


async def _background(peer: StdioPeer, stop: asyncio.Event) -> tuple[int, float]:
    """Notifications at :data:`BACKGROUND_RATE` until ``stop``, or as many as the proxy takes
    when it takes fewer (the report gives the rate reached); how many, over how long.

    A burst is :data:`MAX_BURST` notifications at most: what fell behind the schedule is skipped,
    never sent late, so a proxy slower than the rate (a loaded machine) is not buried under a
    backlog that every later round trip would wait behind."""
    start = time.perf_counter()
    scheduled = sent = 0
    while not stop.is_set():
        due = int((time.perf_counter() - start) * BACKGROUND_RATE)
        scheduled = max(scheduled, due - MAX_BURST)
        if due > scheduled:
            peer.writer.write(b"".join(_noise(seq) for seq in range(scheduled, due)))
            sent += due - scheduled
            scheduled = due
            await peer.writer.drain()
        await asyncio.sleep(0.001)  # pacing, not waiting for an event
    return sent, time.perf_counter() - start


async def _delay_samples(peer: StdioPeer, count: int) -> dict[str, Any]:
    """``count`` pairs of a ping (baseline) and a delayed request, one in flight; the figures."""
    baseline: list[float] = []
    observed: list[float] = []
    for seq in range(count):
        baseline.append(await peer.call(PING_METHOD, {"seq": seq}))
        observed.append(await peer.call(DELAY_METHOD, {"seq": seq}))
    base = latency(baseline)
    excess = [value * 1000 - DELAY_MS - base["p50_ms"] for value in observed]
    return {
        "baseline": base,
        "observed": latency(observed),
        "excess": {
            "count": len(excess),
            "p50_ms": percentile(excess, 50),
            "p99_ms": percentile(excess, 99),
            "max_ms": max(excess),
            "mean_ms": statistics.fmean(excess),
        },
    }


async def delay_check(options: BenchOptions, rules: Path) -> dict[str, Any]:
    """The injected-delay check: its two variants through one proxy loaded with ``rules``
    (:data:`DELAY_RULES`)."""
    peer = await StdioPeer.spawn(delay_argv(options, rules))
    try:
        await peer.call(acp.INITIALIZE, {"protocolVersion": 1, "clientCapabilities": {}})
        for _ in range(5):
            await peer.call(PING_METHOD, {"seq": -1})
        await peer.call(DELAY_METHOD, {"seq": -1})  # warm-up
        idle = await _delay_samples(peer, options.delays)
        stop = asyncio.Event()
        background = asyncio.get_running_loop().create_task(_background(peer, stop))
        try:
            busy = await _delay_samples(peer, options.delays)
        finally:
            stop.set()
            sent, seconds = await background
        busy["background_per_second"] = sent / seconds
    finally:
        await peer.close()
    return {
        "setting_ms": DELAY_MS,
        "requests": options.delays,
        "command": delay_argv(options, Path("DELAY_RULES.yaml")),
        "variants": {"idle": idle, "busy": busy},
    }


def delay_argv(options: BenchOptions, rules: Path) -> list[str]:
    """The proxy of the check, with the fault file ``rules``, in front of the stdio Agent."""
    return [*quiet_proxy(options.python), "--faults", str(rules), "--", *agent_argv(options.python)]
