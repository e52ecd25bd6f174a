"""The workloads driven through every target, one round in one process tree, and their figures.

* ``ping``: small requests, one in flight at a time (ping-pong); the round trip of each is timed
  with :func:`time.perf_counter` from just before the write to just after the answer is read;
* ``stream``: one request asks the Agent for N ``session/update`` notifications, written as fast
  as it can; throughput is N over the time from the request's write to the last message read;
* ``prompt64k``: ``session/prompt`` requests carrying a 64 KiB text, one in flight, each round
  trip timed.

:func:`exercise` drives them through any blocking Client (:class:`BenchClient`: the pipes' of
:mod:`.driver`, the WebSocket's of :mod:`.ws_driver`); :func:`drive` is a round on a stdio target.
A round pools its samples into the target's :class:`Samples`; :func:`figures` turns them into the
report's figures, :func:`compare` sets one target's against another's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.core import acp
from proxy.tools.bench.driver import BlockingPeer
from proxy.tools.bench.messages import PING_METHOD
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import children_maxrss_kib, proc_kib
from proxy.tools.bench.stats import Figures, latency, percentile

__all__ = [
    "PROMPT_BYTES",
    "WORKLOADS",
    "BenchClient",
    "Samples",
    "compare",
    "drive",
    "exercise",
    "figures",
    "prompt_params",
    "round_added",
]

WORKLOADS = ("ping", "stream", "prompt64k")
PROMPT_BYTES = 64 * 1024


@dataclass(slots=True)
class Samples:
    """What the rounds on one target measured, pooled."""

    ping: list[float] = field(default_factory=list)
    prompt: list[float] = field(default_factory=list)
    round_p50_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"ping": [], "prompt64k": []}
    )
    """Each round's own p50 (ms), by workload: how far the rounds, each in a fresh process
    tree, agree (:func:`round_added`)."""
    stream_messages: int = 0
    stream_seconds: float = 0.0
    peak_rss_kib: int = 0


def prompt_params(size: int) -> dict[str, Any]:
    """The params of a ``session/prompt`` whose text is ``size`` bytes."""
    return {"sessionId": "bench-1", "prompt": [{"type": "text", "text": "x" * size}]}


class BenchClient(Protocol):
    """A blocking Client of one target: round trips and streams, timed."""

    def call(self, method: str, params: dict[str, Any]) -> float: ...

    def stream(self, count: int) -> tuple[int, float]: ...


def exercise(peer: BenchClient, options: BenchOptions, samples: Samples) -> None:
    """The three workloads through ``peer``, after ``initialize`` and warm-ups (blocking: call
    it in a thread)."""
    peer.call(acp.INITIALIZE, {"protocolVersion": 1, "clientCapabilities": {}})
    warmup = max(5, options.requests // 20)
    for _ in range(warmup):
        peer.call(PING_METHOD, {"seq": -1})
    pings = [peer.call(PING_METHOD, {"seq": seq}) for seq in range(options.requests)]
    samples.ping += pings
    samples.round_p50_ms["ping"].append(percentile(pings, 50) * 1000)
    peer.stream(min(100, options.notifications))  # warm-up
    received, seconds = peer.stream(options.notifications)
    samples.stream_messages += received
    samples.stream_seconds += seconds
    prompt = prompt_params(PROMPT_BYTES)
    peer.call(acp.PROMPT, prompt)  # warm-up
    prompts = [peer.call(acp.PROMPT, prompt) for _ in range(options.prompts)]
    samples.prompt += prompts
    samples.round_p50_ms["prompt64k"].append(percentile(prompts, 50) * 1000)


def drive(argv: Sequence[str], options: BenchOptions, samples: Samples) -> None:
    """One round on one stdio target: the three workloads, in one process tree, with the
    blocking Client (:mod:`.driver`; call it in a thread)."""
    peer = BlockingPeer(argv)
    try:
        exercise(peer, options, samples)
        peak = proc_kib(peer.process.pid, "VmHWM")
    finally:
        peer.close()
    samples.peak_rss_kib = max(samples.peak_rss_kib, peak or children_maxrss_kib())


def figures(samples: Samples) -> dict[str, Figures]:
    """The figures of each workload from a target's samples."""
    prompt = latency(samples.prompt)
    prompt["mib_per_second"] = len(samples.prompt) * PROMPT_BYTES / sum(samples.prompt) / 2**20
    return {
        "ping": latency(samples.ping),
        "stream": {
            "count": samples.stream_messages,
            "seconds": samples.stream_seconds,
            "per_second": samples.stream_messages / samples.stream_seconds,
        },
        "prompt64k": prompt,
    }


def compare(mine: dict[str, Figures], base: dict[str, Figures]) -> dict[str, dict[str, float]]:
    """One target's figures against a base's: latency added and its ratio, throughput ratio."""
    out: dict[str, dict[str, float]] = {}
    for workload in ("ping", "prompt64k"):
        a, b = mine[workload], base[workload]
        out[workload] = {
            "added_p50_ms": a["p50_ms"] - b["p50_ms"],
            "added_p99_ms": a["p99_ms"] - b["p99_ms"],
            "p50_ratio": a["p50_ms"] / b["p50_ms"],
        }
    out["stream"] = {
        "throughput_ratio": mine["stream"]["per_second"] / base["stream"]["per_second"]
    }
    return out


def round_added(mine: Samples, direct: Samples) -> dict[str, list[float]]:
    """The latency ``mine`` added over ``direct`` in each round (p50 ms), by workload: the
    rounds run every target in turn, so a round's figures are of the same minutes."""
    return {
        workload: [a - b for a, b in zip(p50s, direct.round_p50_ms[workload], strict=False)]
        for workload, p50s in mine.round_p50_ms.items()
    }
