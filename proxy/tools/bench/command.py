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
    websocket: bool = True,
    mitmproxy: bool = True,
    fixed_allocator: bool = False,
) -> BenchOptions:
    """The options of a run: the defaults (or ``short``'s tiny counts) with what was given.

    ``socat=False`` leaves the byte relay out even when ``socat`` is on ``PATH``,
    ``mitmproxy=False`` mitmproxy's WebSocket column even when ``mitmdump`` is;
    ``websocket=False`` leaves out every WebSocket column. A count out of its range is an
    :class:`~proxy.core.errors.OptionError` (:class:`BenchOptions` refuses it).
    """
    given = {
        "requests": requests,
        "notifications": notifications,
        "prompts": prompts,
        "rounds": rounds,
        "ws_links": ws_links,
        "delays": delays,
    }
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    changes["memory_check"] = memory_check
    changes["socat"] = shutil.which("socat") if socat else None
    changes["websocket"] = websocket
    changes["mitmdump"] = shutil.which("mitmdump") if websocket and mitmproxy else None
    changes["fixed_allocator"] = fixed_allocator
    return BenchOptions.short_run(**changes) if short else BenchOptions(**changes)


def bench_main(options: BenchOptions, *, as_json: bool) -> int:
    """Run the bench, print its report; 0, or 1 when a target could not be driven."""
    report = asyncio.run(run_bench(options))
    text = json.dumps(report, indent=2) if as_json else render(report)
    sys.stdout.write(text + "\n")
    return 1 if report["errors"] else 0
