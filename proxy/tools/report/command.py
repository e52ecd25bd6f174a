"""``acp-proxy report``: the summary of traces as text, JSON or an HTML page, and its status."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from proxy.tools.report import report_main
from proxy.tools.report.html import write_html

__all__ = ["print_report"]


def print_report(paths: Sequence[Path], *, as_json: bool, html: Path | None) -> int:
    """Summarize the traces at ``paths``: the text (or with ``as_json`` the JSON) on stdout, or
    with ``html`` the page written there (and with ``as_json`` the JSON as well); the exit status
    (0; 1 for a finding other than a warning; 2 for a trace that cannot be read, its error on
    stderr)."""
    if html is not None:
        status = write_html(paths, html)
        if status != 2:
            sys.stderr.write(f"wrote {html}\n")
        if status == 2 or not as_json:
            return status
    text, status = report_main(paths, as_json=as_json)
    (sys.stderr if status == 2 else sys.stdout).write(text.rstrip("\n") + "\n")
    return status
