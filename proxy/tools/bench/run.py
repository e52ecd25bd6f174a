"""One bench run: every target in turn, round after round, then the checks; the report as a
JSON-ready dict (see :func:`proxy.tools.bench.render.render` for the text).

A round runs every stdio target, then every WebSocket target, in turn, each in a fresh process
tree; samples of all rounds are pooled, so slow drift touches every target alike. A target
that cannot be driven is left out of the later rounds, with its error in the report (a
WebSocket target's under ``websocket TARGET``).

Each process runs with glibc's allocator as it comes, as a relay is usually run; its moving
thresholds make a bare asyncio relay map and unmap a 256 KiB read buffer for every read, in most
runs but not all (its ping's CPU 85 or 45 us a round trip), and the floors every ratio is taken
against move with them. ``--fixed-allocator`` runs every process with the thresholds
``acp-proxy run`` sets for itself (:mod:`proxy.shell.allocator`): the floors without those page
faults, steady from run to run, and far lower.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from proxy import compiled_modules, core_build
from proxy.tools.bench.checks import Comparisons, RoundAdded, design_checks, websocket_checks
from proxy.tools.bench.delays import DELAY_MS, DELAY_RULES, delay_check
from proxy.tools.bench.memory import memory_check
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import BenchError, rss_source
from proxy.tools.bench.stats import Figures
from proxy.tools.bench.targets import PROCESSES, RULES, TARGETS, pure_copy, target_argv
from proxy.tools.bench.workloads import (
    PROMPT_BYTES,
    Samples,
    compare,
    drive,
    figures,
    round_added,
)
from proxy.tools.bench.ws_links import ws_links
from proxy.tools.bench.ws_targets import WS_PROCESSES, WS_TARGETS, ws_round, ws_target_argv

__all__ = ["COMPILE_HINT", "run_bench"]

COMPILE_HINT = "the compiled core: HATCH_BUILD_HOOK_ENABLE_MYPYC=1 pip install ."


async def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every target and workload; the report as a JSON-ready dict (see :func:`render`)."""
    fixing = _allocator_fixed() if options.fixed_allocator else contextlib.nullcontext(None)
    with fixing as allocator:
        report = await _run(options)
    report["config"]["allocator"] = allocator
    return report


@contextlib.contextmanager
def _allocator_fixed() -> Iterator[dict[str, str]]:
    """The allocator thresholds the processes started meanwhile inherit (see the module): the
    environment's own when it sets them, else :mod:`proxy.shell.allocator`'s."""
    # Imported here: the measured processes import this package, and load none of the shell.
    from proxy.shell.allocator import ENVIRONMENT  # noqa: PLC0415

    if any(name in os.environ for name in ENVIRONMENT):
        yield {name: os.environ.get(name, "glibc's") for name in ENVIRONMENT}
        return
    os.environ.update(ENVIRONMENT)
    try:
        yield dict(ENVIRONMENT)
    finally:
        for name in ENVIRONMENT:
            os.environ.pop(name, None)


async def _run(options: BenchOptions) -> dict[str, Any]:
    compiled = compiled_modules()
    targets = [
        t
        for t in TARGETS
        if (t != "socat" or options.socat is not None) and (t != "proxy-pure" or compiled)
    ]
    samples = {target: Samples() for target in targets}
    ws_targets = [
        t for t in WS_TARGETS if options.websocket and (t != "mitmproxy" or options.mitmdump)
    ]
    ws_samples = {target: Samples() for target in ws_targets}
    errors: dict[str, str] = {}
    ws_errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as directory:
        rules = Path(directory) / "rules.yaml"
        rules.write_text(RULES)
        pure = pure_copy(Path(directory) / "pure") if compiled else Path(directory)
        for _round in range(options.rounds):
            for target in targets:
                if target in errors:
                    continue
                try:
                    argv = target_argv(target, options, rules, pure=pure)
                    await asyncio.to_thread(drive, argv, options, samples[target])
                except (BenchError, OSError, ValueError) as exc:
                    errors[target] = f"{type(exc).__name__}: {exc}"
            for target in ws_targets:
                if target in ws_errors:
                    continue
                try:
                    await ws_round(target, options, ws_samples[target])
                except (BenchError, OSError, ValueError) as exc:
                    ws_errors[target] = f"{type(exc).__name__}: {exc}"
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
    report_targets, comparisons, measured, rounds = _section(
        TARGETS,
        samples,
        errors,
        ("direct", "socat", "asyncio"),
        describe=lambda target: {
            "command": target_argv(target, options, Path("RULES.yaml"), pure=Path("PURE")),
            "process": PROCESSES.get(target, "proxy"),
        },
        absent={
            "socat": "socat left out (--no-socat)"
            if shutil.which("socat")
            else "socat not found on PATH (apt-get install socat for this column)",
            "proxy-pure": f"the core is pure Python: proxy is the pure column ({COMPILE_HINT})",
        },
    )
    websocket = None
    ws_checks = websocket_checks(
        {}, {}, {}, unmeasured="left out (--no-websocket)", mitmproxy="left out (--no-websocket)"
    )
    if options.websocket:
        ws_report, ws_comparisons, ws_measured, ws_rounds = _section(
            WS_TARGETS,
            ws_samples,
            ws_errors,
            ("direct", "websockets", "mitmproxy"),
            describe=lambda target: {
                "command": ws_target_argv(target, options, "ws://AGENT"),
                "process": WS_PROCESSES.get(target, "proxy"),
            },
            absent={
                "mitmproxy": "mitmproxy left out (--no-mitmproxy)"
                if shutil.which("mitmdump")
                else "mitmdump not found on PATH (pip install mitmproxy for this column)"
            },
        )
        websocket = {"targets": ws_report, "comparisons": ws_comparisons}
        ws_checks = websocket_checks(
            ws_comparisons,
            _streams(ws_measured),
            ws_rounds,
            unmeasured="not measured over WebSocket: see errors",
            mitmproxy=ws_report["mitmproxy"].get("reason", "mitmproxy failed: see errors"),
        )
    return {
        "bench": "acp-proxy bench",
        "version": 1,
        "mode": "short" if options.short else "normal",
        "core": {"build": core_build(), "compiled": compiled},
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
            "websocket": options.websocket,
            "mitmdump": options.mitmdump,
            "rss_source": rss_source(),
        },
        "targets": report_targets,
        "comparisons": comparisons,
        "websocket": websocket,
        "design_targets": design_checks(
            comparisons, memory, ws, delays, _streams(measured), rounds=rounds, websocket=ws_checks
        ),
        "memory_check": memory,
        "ws_links": ws,
        "delays": delays,
        "errors": errors | {f"websocket {target}": error for target, error in ws_errors.items()},
    }


def _streams(measured: dict[str, dict[str, Figures]]) -> dict[str, float]:
    """The stream's messages a second, per target measured."""
    return {target: mine["stream"]["per_second"] for target, mine in measured.items()}


def _section(
    names: Sequence[str],
    samples: dict[str, Samples],
    errors: dict[str, str],
    bases: Sequence[str],
    *,
    describe: Callable[[str], dict[str, Any]],
    absent: dict[str, str],
) -> tuple[dict[str, Any], Comparisons, dict[str, dict[str, Figures]], RoundAdded]:
    """One transport's report: each of ``names`` (run: what ``describe`` says of it, its error
    or its figures; not run: why, from ``absent``), each measured target compared to ``bases``;
    the figures measured; and the latency each added over direct, round by round."""
    report: dict[str, Any] = {}
    measured: dict[str, dict[str, Figures]] = {}
    for target in names:
        entry: dict[str, Any] = {"available": target in samples}
        if target in samples:
            entry |= describe(target)
        else:
            entry["reason"] = absent[target]
        if target in errors:
            entry["error"] = errors[target]
        elif target in samples:
            measured[target] = figures(samples[target])
            entry["workloads"] = measured[target]
            entry["round_p50_ms"] = samples[target].round_p50_ms
            entry["peak_rss_kib"] = samples[target].peak_rss_kib
        report[target] = entry
    comparisons: Comparisons = {
        target: {
            base: compare(mine, measured[base])
            for base in bases
            if base in measured and base != target
        }
        for target, mine in measured.items()
    }
    rounds: RoundAdded = {}
    if "direct" in measured:
        direct = samples["direct"]
        rounds = {target: round_added(samples[target], direct) for target in measured}
    return report, comparisons, measured, rounds
