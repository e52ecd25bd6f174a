"""``RunOptions.from_command_line``: the checks of ``acp-proxy run``'s options, in the model that
the command line builds (no process, no socket). How a refusal reads on the command line (usage,
exit 2) is tested in ``tests/e2e/test_cli.py`` and ``tests/shell/test_control.py``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from command_options import Ranged, ranged_options

from proxy.core.errors import OptionError
from proxy.shell.admin import ADMIN_TOKEN_ENV
from proxy.shell.app import RunOptions
from proxy.shell.limits import Limits
from proxy.shell.server import STDIO


def test_the_values_of_the_command_line_become_the_model() -> None:
    """Addresses are parsed; lists become tuples; the other settings are taken as given."""
    options = RunOptions.from_command_line(
        listen="ws://127.0.0.1:0/acp",
        upstream="http://127.0.0.1:9/acp",
        admin="[::1]:0",
        allow_hosts=["agent.internal"],
        allow_origins=["https://app.example"],
        faults=[Path("a.yaml")],
        strict=True,
        environ={},
    )
    assert (options.listen.scheme, options.listen.host, options.listen.path) == (
        "ws",
        "127.0.0.1",
        "/acp",
    )
    assert (options.upstream.scheme, options.upstream.port) == ("http", 9)
    assert options.admin == ("::1", 0)
    assert options.allow_hosts == ("agent.internal",)
    assert options.allow_origins == ("https://app.example",)
    assert options.faults == (Path("a.yaml"),)
    assert options.strict
    assert options.agent_argv == ()
    assert options.admin_token is None


def test_the_defaults_are_a_stdio_proxy_in_front_of_the_agent_command() -> None:
    options = RunOptions.from_command_line(agent_argv=["node", "agent.js"], environ={})
    assert options == RunOptions(agent_argv=("node", "agent.js"), listen=STDIO, upstream=STDIO)


@pytest.mark.parametrize(
    ("values", "message", "option"),
    [
        ({"listen": "bogus"}, "--listen: expected stdio, http://HOST:PORT/PATH", None),
        ({"upstream": "ftp://x:1/"}, "--upstream: expected stdio, http://HOST:PORT/PATH", None),
        ({"admin": "::1:0"}, "--admin: expected HOST:PORT (an IPv6 address in brackets", None),
        ({"admin": "10.1.2.3:0"}, "binds to loopback only, unless --admin-allow-remote", None),
        ({"allow_hosts": ["bad host"]}, "--allow-host: expected NAME or NAME:PORT", None),
        ({"allow_origins": ["nope"]}, "--allow-origin: expected an origin", None),
        ({"admin_allow_origins": ["nope"]}, "--admin-allow-origin: expected an origin", None),
        (
            {"admin": "127.0.0.1:0", "admin_token": "a", "admin_token_file": Path("t")},
            "give --admin-token or --admin-token-file, not both",
            None,
        ),
        (
            {"admin": "127.0.0.1:0", "admin_token": " a"},
            f"--admin-token (or {ADMIN_TOKEN_ENV}) has whitespace at its ends",
            None,
        ),
        (
            {"trace": Path("-")},
            "in stdio mode stdout is the protocol channel; give the trace a file",
            "--trace",
        ),
        ({"agent_argv": []}, "give the Agent command after --", "AGENT_CMD"),
        (
            {"upstream": "ws://127.0.0.1:1/acp"},
            "an Agent command makes sense only with --upstream stdio",
            "AGENT_CMD",
        ),
    ],
)
def test_an_invalid_option_is_one_option_error(
    values: dict[str, Any], message: str, option: str | None
) -> None:
    """Each refusal is an OptionError whose message names what is wrong (or whose ``option``
    does, for the command line to print it beside the message)."""
    given: dict[str, Any] = {"agent_argv": ["agent"], **values}
    with pytest.raises(OptionError) as refused:
        RunOptions.from_command_line(**given, environ={})
    assert message in str(refused.value)
    assert refused.value.option == option


def run_options(name: str, value: float) -> RunOptions:
    """The run's options with one field (of theirs, or of their limits) set to ``value``."""
    setting: dict[str, Any] = {name: value}
    if name in {field.name for field in dataclasses.fields(Limits)}:
        return RunOptions(agent_argv=("agent",), limits=Limits(**setting))
    return RunOptions(agent_argv=("agent",), **setting)


@pytest.mark.parametrize("option", ranged_options("run"), ids=lambda option: option.flag)
def test_the_model_refuses_what_the_command_line_refuses(option: Ranged) -> None:
    """An option's least value, as ``run --help`` states it, is the model's: the options (or
    their limits) take it and refuse the nearest value under it, naming the option."""
    run_options(option.name, option.minimum)
    with pytest.raises(OptionError) as refused:
        run_options(option.name, option.below())
    assert str(refused.value) == (
        f"{option.flag} must be at least {option.minimum} (got {option.below()})"
    )


def test_a_value_that_is_no_number_is_refused() -> None:
    with pytest.raises(OptionError, match=r"^--connect-timeout must be at least 0.001 \(got nan\)"):
        RunOptions(agent_argv=("agent",), connect_timeout=float("nan"))
    with pytest.raises(OptionError, match=r"^--idle-timeout must be at least 0.001 \(got nan\)"):
        Limits(idle_timeout=float("nan"))


def test_the_token_comes_from_the_option_the_file_or_the_environment(tmp_path: Path) -> None:
    """``--admin-token``, else ``--admin-token-file``, else the variable; the variable is read
    only for a control API, and an empty one is refused rather than taken for no token."""
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    environ = {ADMIN_TOKEN_ENV: "from-the-environment"}

    def token(**values: Any) -> str | None:
        options = RunOptions.from_command_line(agent_argv=["agent"], environ=environ, **values)
        return options.admin_token

    admin = "127.0.0.1:0"
    assert token(admin=admin, admin_token="given") == "given"
    assert token(admin=admin, admin_token_file=token_file) == "from-the-file"
    assert token(admin=admin) == "from-the-environment"
    assert token() is None  # no control API: no token read
    environ[ADMIN_TOKEN_ENV] = ""
    with pytest.raises(OptionError, match="is empty"):
        token(admin=admin)
