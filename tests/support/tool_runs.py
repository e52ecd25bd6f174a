"""The tools as a user runs them: ``acp-proxy check-agent`` in a subprocess, its output captured."""

from __future__ import annotations

import subprocess
import sys

from harness import TIMEOUT

__all__ = ["check_agent"]


def check_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy check-agent ARGS``, finished."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-agent", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
        check=False,
    )
