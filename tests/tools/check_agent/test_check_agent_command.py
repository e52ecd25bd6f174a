"""``acp-proxy check-agent``'s usage errors: refused before any trace, exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tool_runs import check_agent

pytestmark = pytest.mark.slow

REFERENCE = [sys.executable, "-m", "proxy", "agent", "--turn-ms", "300"]


def test_unknown_traces_are_a_usage_error() -> None:
    """Only T0-T7 exist."""
    done = check_agent("--only", "T9", "--", *REFERENCE)
    assert done.returncode == 2
    assert "unknown traces" in done.stderr


def test_an_agent_that_cannot_run_is_refused_before_any_trace() -> None:
    """A command that is not there is refused before any trace (exit 2)."""
    missing = check_agent("--", "/nonexistent/agent")
    assert missing.returncode == 2
    assert "cannot run the Agent: '/nonexistent/agent' is not an executable" in missing.stderr


def test_a_junit_file_that_cannot_be_written_is_refused_before_any_trace(tmp_path: Path) -> None:
    """--junit in a folder that does not exist: said before the traces run (exit 2), not after."""
    junit = tmp_path / "reports" / "check.xml"
    done = check_agent("--junit", str(junit), "--only", "T0", "--", *REFERENCE)
    assert (done.returncode, done.stdout) == (2, "")
    assert f"--junit {junit}: its folder {junit.parent} does not exist" in done.stderr
