"""The entry of ``acp-proxy check-agent``: the traces run, the results printed, the exit status."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.check_agent.output import render, to_json, to_junit
from proxy.tools.check_agent.runner import check_agent
from proxy.tools.verdicts import refusal, tell

__all__ = ["check_agent_main"]


def check_agent_main(options: CheckOptions, *, as_json: bool, junit: Path | None) -> int:
    """``acp-proxy check-agent``: run the traces, print the results (a table, or JSON), write
    them as JUnit XML to ``junit`` if given; the exit status (:func:`exit_status`), 2 when the
    Agent cannot be run or ``junit`` cannot be written (told before any trace runs)."""
    why = refusal(options.agent_argv, "Agent", junit)
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    results = asyncio.run(check_agent(options))
    text = to_json(results) if as_json else render(results, options)
    return tell(results, text, junit, to_junit(results, options))
