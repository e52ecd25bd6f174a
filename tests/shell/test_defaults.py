"""The shell's defaults, each in one place: the command line and the run options default to them,
and the command line reference (docs/cli.md) states them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from proxy import cli
from proxy.core.relay import DEFAULT_MAX_PENDING
from proxy.shell import defaults, limits
from proxy.shell.app import RunOptions
from proxy.shell.inflight import DEFAULT_MAX_INFLIGHT_BYTES

CLI_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

# option of `acp-proxy run` -> (its parameter, its default where it is declared)
DEFAULTS: dict[str, tuple[str, float]] = {
    "--max-message-bytes": ("max_message_bytes", defaults.DEFAULT_MAX_MESSAGE_BYTES),
    "--pipe-bytes": ("pipe_bytes", defaults.PIPE_BYTES),
    "--agent-grace": ("agent_grace", defaults.AGENT_GRACE),
    "--connect-timeout": ("connect_timeout", defaults.CONNECT_TIMEOUT),
    "--initialize-timeout": ("initialize_timeout", defaults.INITIALIZE_TIMEOUT),
    "--http-timeout": ("http_timeout", defaults.HTTP_TIMEOUT),
    "--shutdown-timeout": ("shutdown_timeout", defaults.SHUTDOWN_TIMEOUT),
    "--max-pending": ("max_pending", DEFAULT_MAX_PENDING),
    "--max-inflight-bytes": ("max_inflight_bytes", DEFAULT_MAX_INFLIGHT_BYTES),
    "--max-links": ("max_links", limits.DEFAULT_MAX_LINKS),
    "--idle-timeout": ("idle_timeout", limits.DEFAULT_IDLE_TIMEOUT),
    "--max-sessions": ("max_sessions", limits.DEFAULT_MAX_SESSIONS),
    "--header-timeout": ("header_timeout", limits.DEFAULT_HEADER_TIMEOUT),
    "--max-event-subscribers": ("max_event_subscribers", limits.DEFAULT_MAX_EVENT_SUBSCRIBERS),
    "--max-held": ("max_held", limits.DEFAULT_MAX_HELD),
}


def documented_defaults() -> dict[str, str]:
    """The defaults ``docs/cli.md`` states in its ``run --help``: option -> the default as written."""
    text = CLI_REFERENCE.read_text()
    found: dict[str, str] = {}
    for match in re.finditer(r"^  (--[a-z-]+)(.*?)(?=^  --|^```|\Z)", text, re.M | re.S):
        default = re.search(r"\[default:\s+([0-9.]+)", match[2])
        if default is not None:
            found.setdefault(match[1], default[1])
    return found


@pytest.mark.parametrize("option", sorted(DEFAULTS))
def test_the_command_line_and_the_readme_state_each_default(option: str) -> None:
    parameter, value = DEFAULTS[option]
    assert inspect.signature(cli.run).parameters[parameter].default == value
    assert float(documented_defaults()[option]) == value


def test_the_run_options_default_to_them() -> None:
    options = RunOptions(agent_argv=("agent",))
    assert options.max_message_bytes == defaults.DEFAULT_MAX_MESSAGE_BYTES
    assert options.pipe_bytes == defaults.PIPE_BYTES
    assert options.agent_grace == defaults.AGENT_GRACE
    assert options.connect_timeout == defaults.CONNECT_TIMEOUT
    assert options.initialize_timeout == defaults.INITIALIZE_TIMEOUT
    assert options.http_timeout == defaults.HTTP_TIMEOUT
    assert options.shutdown_timeout == defaults.SHUTDOWN_TIMEOUT
    assert options.limits == limits.Limits()
