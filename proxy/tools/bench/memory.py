"""The long-run memory check (``--memory-check N``): N messages through the proxy with the rules
loaded, its ``VmRSS`` sampled as they go.

Mostly small requests, with a notification stream and a 64 KiB prompt every so often, pipelined
32 at a time. Memory is *flat* when, after the first 10% (warm-up), the largest sample of the
last quarter is within 10% of the largest of the first quarter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.core import acp
from proxy.tools.bench.driver import BlockingPeer
from proxy.tools.bench.messages import PING_METHOD
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import children_maxrss_kib, proc_kib
from proxy.tools.bench.targets import target_argv
from proxy.tools.bench.workloads import PROMPT_BYTES, prompt_params

__all__ = ["FLAT_GROWTH", "memory_check"]

FLAT_GROWTH = 1.10
"""The last quarter's largest RSS over the first quarter's, at most, for memory to be flat."""
WINDOW = 32
"""Requests in flight at once."""


def memory_check(options: BenchOptions, rules: Path) -> dict[str, Any]:
    """Send ``options.memory_check`` messages through ``proxy+rules``; the RSS samples and their
    verdict (blocking: call it in a thread)."""
    peer = BlockingPeer(target_argv("proxy+rules", options, rules))
    pid = peer.process.pid
    sample_every = max(WINDOW, options.memory_check // 64)
    samples: list[tuple[int, int]] = []
    sent = 0
    prompt = prompt_params(PROMPT_BYTES)
    try:
        peer.call(acp.INITIALIZE, {"protocolVersion": 1, "clientCapabilities": {}})
        next_sample = 0
        batch = 0
        while sent < options.memory_check:
            batch += 1
            if batch % 50 == 0:
                received, _seconds = peer.stream(200)
                sent += received + 1
            else:
                ids, lines = [], []
                for i in range(WINDOW):
                    big = batch % 10 == 0 and i == 0
                    request_id, data = peer.request(
                        acp.PROMPT if big else PING_METHOD,
                        prompt if big else {"seq": sent + i},
                    )
                    ids.append(request_id)
                    lines.append(data)
                peer.send(b"".join(lines))
                for request_id in ids:
                    peer.answer(request_id)
                sent += WINDOW
            if sent >= next_sample:
                rss = proc_kib(pid, "VmRSS")
                if rss is not None:
                    samples.append((sent, rss))
                next_sample = sent + sample_every
    finally:
        peak = proc_kib(pid, "VmHWM")
        peer.close()
    peak = peak or children_maxrss_kib()
    if len(samples) < 8:
        return {
            "messages": sent,
            "samples": samples,
            "peak_rss_kib": peak,
            "flat": None,
            "growth_ratio": None,
            "note": "too few RSS samples (no /proc?)",
        }
    steady = samples[len(samples) // 10 :]
    quarter = max(1, len(steady) // 4)
    first = max(rss for _, rss in steady[:quarter])
    last = max(rss for _, rss in steady[-quarter:])
    growth = last / first
    return {
        "messages": sent,
        "samples": samples,
        "peak_rss_kib": peak,
        "first_quarter_max_kib": first,
        "last_quarter_max_kib": last,
        "growth_ratio": growth,
        "flat": growth <= FLAT_GROWTH,
    }
