"""The entry of ``acp-proxy check-client``: the Client run, the scenarios judged, the results
printed, the exit status."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

from proxy.tools import cannot_run, verdicts
from proxy.tools.check_client.options import ClientCheckOptions
from proxy.tools.check_client.runner import check_client

__all__ = ["check_client_main"]


def check_client_main(options: ClientCheckOptions, *, as_json: bool, junit: Path | None) -> int:
    """``acp-proxy check-client``: run the Client and judge the scenarios, print the results (a
    table, or JSON), write them as JUnit XML to ``junit`` if given; the exit status
    (:func:`~proxy.tools.verdicts.exit_status`), 2 when ``junit`` cannot be written (told before
    anything runs, as a Client command that cannot be run is)."""
    why = cannot_run(options.client_argv, "Client")
    if why is None and junit is not None and not junit.parent.is_dir():
        why = f"--junit {junit}: its folder {junit.parent} does not exist"
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    results = asyncio.run(check_client(options))
    if as_json:
        text = verdicts.to_json(results, what="scenario")
    else:
        heading = f"check-client over {options.transport}: {shlex.join(options.client_argv)}"
        text = verdicts.render(results, heading, what="scenario")
    sys.stdout.write(text + "\n")
    if junit is not None:
        junit.write_bytes(verdicts.to_junit(results, f"acp-check-client-{options.transport}"))
    return verdicts.exit_status(results)
