"""The entry of ``acp-proxy check-agent``: the traces run, the results printed, the exit status."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from proxy.core.errors import os_cause
from proxy.shell.writable import cannot_write_in
from proxy.tools import cannot_run
from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.check_agent.output import exit_status, render, to_json, to_junit
from proxy.tools.check_agent.runner import check_agent

__all__ = ["check_agent_main"]


def check_agent_main(options: CheckOptions, *, as_json: bool, junit: Path | None) -> int:
    """``acp-proxy check-agent``: run the traces, print the results (a table, or JSON), write
    them as JUnit XML to ``junit`` if given; the exit status (:func:`exit_status`), 2 when the
    Agent cannot be run or ``junit`` cannot be written (told before any trace runs)."""
    why = cannot_run(options.agent_argv)
    if why is None and junit is not None:
        if not junit.parent.is_dir():
            why = f"--junit {junit}: its folder {junit.parent} does not exist"
        elif (cause := cannot_write_in(junit.parent)) is not None:
            why = f"--junit {junit}: cannot be written: {cause}"
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    results = asyncio.run(check_agent(options))
    sys.stdout.write((to_json(results) if as_json else render(results, options)) + "\n")
    if junit is not None:
        try:
            junit.write_bytes(to_junit(results, options))
        except OSError as exc:  # the file itself read-only, the disk full
            sys.stderr.write(f"error: --junit {junit}: cannot be written: {os_cause(exc)}\n")
            return 2
    return exit_status(results)
