"""The entry of ``acp-proxy check-client``: the Client run, the scenarios judged, the results
printed, the exit status."""

from __future__ import annotations

import asyncio
import shlex
import signal
import sys
from pathlib import Path

from proxy.tools import verdicts
from proxy.tools.check_client.options import ClientCheckOptions
from proxy.tools.check_client.runner import check_client
from proxy.tools.verdicts import Result

__all__ = ["INTERRUPTED", "check_client_main"]

INTERRUPTED = 130
"""The exit status after SIGINT (Ctrl-C) or SIGTERM: the runs stopped, the Client reaped."""


async def _interruptible(options: ClientCheckOptions) -> list[Result]:
    """:func:`check_client`, cancelled by SIGTERM as by SIGINT (asyncio's own), so that the
    Client's process group is stopped on the way out."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await check_client(options)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def check_client_main(options: ClientCheckOptions, *, as_json: bool, junit: Path | None) -> int:
    """``acp-proxy check-client``: run the Client and judge the scenarios, print the results (a
    table, or JSON), write them as JUnit XML to ``junit`` if given; the exit status
    (:func:`~proxy.tools.verdicts.exit_status`), 2 when ``junit`` cannot be written (told before
    anything runs, as a Client command that cannot be run is)."""
    why = verdicts.refusal(options.client_argv, "Client", junit)
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    try:
        results = asyncio.run(_interruptible(options))
    except (KeyboardInterrupt, asyncio.CancelledError):
        sys.stderr.write("error: interrupted; the Client was stopped, nothing was judged\n")
        return INTERRUPTED
    if as_json:
        text = verdicts.to_json(results, what="scenario")
    else:
        heading = f"check-client over {options.transport}: {shlex.join(options.client_argv)}"
        text = verdicts.render(results, heading, what="scenario")
    suite = f"acp-check-client-{options.transport}"
    return verdicts.tell(results, text, junit, verdicts.to_junit(results, suite))
