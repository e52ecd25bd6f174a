"""The proxy in front of the Agent (``proxy.tools.check_agent.lab``): a connection that closes early
is explained from the proxies' logs, which never reach the checker's output."""

from __future__ import annotations

import sys

import pytest
from tool_runs import check_agent

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("transport", "lost"),
    [
        ("stdio", "no answer to initialize: the connection closed"),
        ("ws", "no answer to initialize: the connection closed"),
        # The HTTP proxy answers the initialize POST itself when its Agent is gone.
        ("http", "initialize was answered with error -32603"),
    ],
)
def test_an_agent_that_exits_at_once_is_explained(transport: str, lost: str) -> None:
    """An Agent that exits at once fails with what the proxy saw, its exit status, on every
    transport (a listening proxy's log is read once it has logged the link's end)."""
    exiting = check_agent(
        "--transport", transport, "--only", "T0", "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert lost in exiting.stdout, exiting.stdout
    assert "the proxy says: the agent exited (3)" in exiting.stdout, exiting.stdout
    assert exiting.returncode == 1
    assert exiting.stderr == ""  # the proxies' log lines stay out of the checker's output
