"""``acp-proxy check-agent``'s usage errors: refused before any trace, exit status 2."""

from __future__ import annotations

import sys

import pytest
from tool_runs import check_agent

pytestmark = pytest.mark.slow

REFERENCE = [sys.executable, "-m", "proxy", "agent", "--turn-ms", "300"]


def test_unknown_traces_are_a_usage_error() -> None:
    """Only T0-T7 exist."""
    done = check_agent("--trace", "T9", "--", *REFERENCE)
    assert done.returncode == 2
    assert "unknown traces" in done.stderr


def test_an_agent_that_cannot_run_is_refused_before_any_trace() -> None:
    """A command that is not there is refused before any trace (exit 2)."""
    missing = check_agent("--", "/nonexistent/agent")
    assert missing.returncode == 2
    assert "cannot run the Agent: '/nonexistent/agent' is not an executable" in missing.stderr
