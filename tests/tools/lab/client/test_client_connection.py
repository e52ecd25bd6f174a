"""How the reference Client reaches the Agent (``proxy.tools.lab.client.connection``): a spawned
command, a WebSocket or Streamable HTTP; a command that cannot start is reported, not raised."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from client_lab import AGENT, TEXTS, check_inserted_once, run, servers
from harness import PEERS, TIMEOUT

from proxy.tools.lab.client.render import render

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scheme", ["ws", "http"])
async def test_over_a_network_transport(scheme: str) -> None:
    """The Client connects to an Agent served over WebSocket or Streamable HTTP."""
    async with servers() as serve:
        url = await serve(*AGENT, "--turn-ms", "1", "--listen", f"{scheme}://127.0.0.1:0/acp")
        report = await run(connect=url, prompts=TEXTS)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects) == (scheme, 1, 0)


async def test_a_command_that_cannot_start_is_reported(tmp_path: Path) -> None:
    """No exception: the report carries the error, and nothing was submitted."""
    report = await run(agent_argv=(str(tmp_path / "missing"),), prompts=TEXTS)
    assert report.error is not None
    assert report.error.startswith("cannot connect")
    assert (report.connections, report.submissions, report.ok) == (0, [], False)
    assert report.not_submitted == list(TEXTS)
    assert report.exit_status == 2
    assert render(report).splitlines() == [f"ERROR: stopped: {report.error}; nothing was submitted"]


V1_AGENT = str(PEERS / "seq_agent.py")


def test_an_agent_of_acp_v1_is_refused_with_one_line() -> None:
    """As the README says: ``client`` against an Agent that answers protocol version 1 prints one
    line (no empty table, no log line repeating it) and exits 2."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "client", "-p", "one", "--", sys.executable, V1_AGENT],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        "ERROR: stopped: not an ACP v2 Agent: initialize answered protocol version 1 "
        "(idempotency keys need 2); nothing was submitted"
    ]
    assert "the client stopped" not in done.stderr


def test_an_agent_command_that_is_no_executable_is_one_error_line(tmp_path: Path) -> None:
    """Told before anything starts, as ``check-agent`` and ``demo`` tell it: exit 2."""
    missing = str(tmp_path / "no-such-agent")
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "client", "-p", "one", "--", missing],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: cannot run the Agent: {missing!r} is not an executable\n"


async def test_an_agent_that_fails_at_start_is_named_with_its_exit_status() -> None:
    """The Agent exits 3 before it answers initialize: the error says so, not only that the
    connection ended (its own stderr says more), and nothing was checked (ERROR, exit 2)."""
    failing = (sys.executable, "-c", "import sys; sys.exit(3)")
    report = await run(agent_argv=failing, prompts=TEXTS)
    assert report.error == (
        "the connection ended during initialize: the agent exited with status 3"
    )
    assert report.exit_status == 2
    assert render(report).splitlines()[-1].startswith("ERROR: stopped: the connection ended")
