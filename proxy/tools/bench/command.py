"""The entry of ``acp-proxy bench``: the options from the command line's values, the run, the
report printed, the exit status (0, or 1 when a target could not be driven; never the timings).

The command line itself is :func:`proxy.cli.bench` (typer, the bench's only one).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from typing import Any

from proxy.core.errors import OptionError
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.render import render
from proxy.tools.bench.run import run_bench

__all__ = ["bench_main", "make_options"]


def make_options(
    *,
    short: bool = False,
    requests: int | None = None,
    notifications: int | None = None,
    prompts: int | None = None,
    rounds: int | None = None,
    memory_check: int = 0,
    ws_links: int | None = None,
    delays: int | None = None,
    socat: bool = True,
) -> BenchOptions:
    """The options of a run: the defaults (or ``short``'s tiny counts) with what was given.

    ``socat=False`` leaves the byte relay out even when ``socat`` is on ``PATH``. A count out of
    its range is an :class:`~proxy.core.errors.OptionError`.
    """
    given = {
        "requests": requests,
        "notifications": notifications,
        "prompts": prompts,
        "rounds": rounds,
    }
    for name, value in given.items():
        if value is not None and value < 1:
            raise OptionError(f"--{name} must be at least 1")
    optional = {"memory-check": memory_check, "ws-links": ws_links, "delays": delays}
    for name, value in optional.items():
        if value is not None and value < 0:
            raise OptionError(f"--{name} must be 0 or more")
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    changes["memory_check"] = memory_check
    if ws_links is not None:
        changes["ws_links"] = ws_links
    if delays is not None:
        changes["delays"] = delays
    changes["socat"] = shutil.which("socat") if socat else None
    return BenchOptions.short_run(**changes) if short else BenchOptions(**changes)


def bench_main(options: BenchOptions, *, as_json: bool) -> int:
    """Run the bench, print its report; 0, or 1 when a target could not be driven."""
    report = asyncio.run(run_bench(options))
    text = json.dumps(report, indent=2) if as_json else render(report)
    sys.stdout.write(text + "\n")
    return 1 if report["errors"] else 0
