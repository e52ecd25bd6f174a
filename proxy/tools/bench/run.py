"""One bench run: every target in turn, round after round, then the checks; the report as a
JSON-ready dict (see :func:`proxy.tools.bench.render.render` for the text).

A round runs every target in turn, each in a fresh process tree; samples of all rounds are
pooled, so slow drift touches every target alike. A target that cannot be driven is left out of
the later rounds, with its error in the report.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

from proxy.tools.bench.checks import design_checks
from proxy.tools.bench.delays import DELAY_MS, DELAY_RULES, delay_check
from proxy.tools.bench.memory import memory_check
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import BenchError, rss_source
from proxy.tools.bench.stats import Figures
from proxy.tools.bench.targets import PROCESSES, RULES, TARGETS, target_argv
from proxy.tools.bench.workloads import PROMPT_BYTES, Samples, compare, drive, figures
from proxy.tools.bench.ws_links import ws_links

__all__ = ["run_bench"]


async def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every target and workload; the report as a JSON-ready dict (see :func:`render`)."""
    targets = [t for t in TARGETS if t != "socat" or options.socat is not None]
    samples = {target: Samples() for target in targets}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as directory:
        rules = Path(directory) / "rules.yaml"
        rules.write_text(RULES)
        for _round in range(options.rounds):
            for target in targets:
                if target in errors:
                    continue
                try:
                    argv = target_argv(target, options, rules)
                    await asyncio.to_thread(drive, argv, options, samples[target])
                except (BenchError, OSError, ValueError) as exc:
                    errors[target] = f"{type(exc).__name__}: {exc}"
        memory = None
        if options.memory_check > 0 and "proxy+rules" not in errors:
            try:
                memory = await asyncio.to_thread(memory_check, options, rules)
            except (BenchError, OSError, ValueError) as exc:
                errors["memory_check"] = f"{type(exc).__name__}: {exc}"
        delays = None
        if options.delays > 0:
            delay_rules = Path(directory) / "delay.yaml"
            delay_rules.write_text(DELAY_RULES)
            try:
                delays = await delay_check(options, delay_rules)
            except (BenchError, OSError, ValueError) as exc:
                errors["delays"] = f"{type(exc).__name__}: {exc}"
        ws = None
        if options.ws_links > 0:
            try:
                ws = await ws_links(options)
            except (BenchError, OSError, ValueError) as exc:
                errors["ws_links"] = f"{type(exc).__name__}: {exc}"
    report_targets: dict[str, Any] = {}
    measured: dict[str, dict[str, Figures]] = {}
    for target in TARGETS:
        entry: dict[str, Any] = {"available": target in samples}
        if target in samples:
            entry["command"] = target_argv(target, options, Path("RULES.yaml"))
            entry["process"] = PROCESSES.get(target, "proxy")
        else:
            entry["reason"] = (
                "socat left out (--no-socat)"
                if shutil.which("socat")
                else "socat not found on PATH (apt-get install socat for this column)"
            )
        if target in errors:
            entry["error"] = errors[target]
        elif target in samples:
            measured[target] = figures(samples[target])
            entry["workloads"] = measured[target]
            entry["peak_rss_kib"] = samples[target].peak_rss_kib
        report_targets[target] = entry
    comparisons: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for target, mine in measured.items():
        comparisons[target] = {
            base: compare(mine, measured[base])
            for base in ("direct", "socat", "asyncio")
            if base in measured and base != target
        }
    return {
        "bench": "acp-proxy bench",
        "version": 1,
        "mode": "short" if options.short else "normal",
        "config": {
            "requests": options.requests,
            "notifications": options.notifications,
            "prompts": options.prompts,
            "prompt_bytes": PROMPT_BYTES,
            "rounds": options.rounds,
            "ws_links": options.ws_links,
            "delays": options.delays,
            "delay_ms": DELAY_MS,
            "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
            "socat": options.socat,
            "rss_source": rss_source(),
        },
        "targets": report_targets,
        "comparisons": comparisons,
        "design_targets": design_checks(
            comparisons,
            memory,
            ws,
            delays,
            {target: mine["stream"]["per_second"] for target, mine in measured.items()},
        ),
        "memory_check": memory,
        "ws_links": ws,
        "delays": delays,
        "errors": errors,
    }
