"""The entry of ``acp-proxy client``: the Client run, its report printed, the exit status."""

from __future__ import annotations

import asyncio
import json
import sys

from proxy.tools import cannot_run
from proxy.tools.lab.client.options import ClientOptions
from proxy.tools.lab.client.render import render
from proxy.tools.lab.client.run import run_client

__all__ = ["client_main"]


def client_main(options: ClientOptions, *, as_json: bool) -> int:
    """``acp-proxy client``: run the Client, print its report (for people, or JSON); the exit
    status (:attr:`~proxy.tools.lab.client.report.ClientReport.exit_status`); 2 when the Agent
    command cannot be run (told on one line, before anything starts)."""
    why = cannot_run(options.agent_argv) if options.agent_argv else None
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    report = asyncio.run(run_client(options))
    text = json.dumps(report.to_json(), indent=2) if as_json else render(report)
    sys.stdout.write(text + "\n")
    return report.exit_status
