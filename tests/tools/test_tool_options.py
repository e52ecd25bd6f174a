"""The tools' options models: each checks the values of its command line and refuses an invalid
one with an :class:`~proxy.core.errors.OptionError` (the command line's usage error, tested with
the commands themselves in ``tests/tools/check_agent/test_check_agent_command.py``,
``tests/tools/lab/test_demo.py``, ``tests/e2e/test_cli.py``)."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
from command_options import option_defaults, ranged_options

from proxy.core.errors import OptionError
from proxy.tools import cannot_run
from proxy.tools.bench import BenchOptions
from proxy.tools.check_agent import TRACES, CheckOptions
from proxy.tools.check_client import SCENARIOS, ClientCheckOptions
from proxy.tools.lab.agent import AgentOptions
from proxy.tools.lab.client import ClientOptions
from proxy.tools.lab.demo import DemoOptions

MODELS: dict[str, Callable[..., Any]] = {
    "agent": AgentOptions,
    "bench": BenchOptions,
    "check-agent": functools.partial(CheckOptions, agent_argv=("agent",)),
    "check-client": functools.partial(ClientCheckOptions, client_argv=("client", "{agent}")),
    "client": functools.partial(ClientOptions, agent_argv=("agent",)),
    "demo": DemoOptions,
}
"""Each tool's command, and how to build its options' model with a value of it."""


def test_the_agent_listens_where_told_or_refuses_what_is_no_address() -> None:
    options = AgentOptions.from_command_line(listen="ws://127.0.0.1:0/acp", turn_ms=5.0)
    assert (options.listen.scheme, options.listen.path, options.turn_ms) == ("ws", "/acp", 5.0)
    with pytest.raises(OptionError, match="--listen: expected stdio, http://HOST:PORT/PATH"):
        AgentOptions.from_command_line(listen="bogus")


def test_check_agent_runs_the_traces_named_or_every_one() -> None:
    every = CheckOptions.from_command_line(agent_argv=["agent"])
    assert every.traces == tuple(TRACES)
    assert CheckOptions.from_command_line(agent_argv=["agent"], traces=["T3"]).traces == ("T3",)
    with pytest.raises(OptionError, match=r"unknown traces \['T9'\]; known: \['T0'"):
        CheckOptions.from_command_line(agent_argv=["agent"], traces=["T1", "T9"])


def test_check_client_needs_the_agent_named_in_the_clients_command() -> None:
    """``{agent}`` or ``{agent-json}`` over stdio, ``{url}`` with ``--listen``; every scenario
    unless told which."""
    every = ClientCheckOptions.from_command_line(client_argv=["client", "--agent={agent}"])
    assert (every.scenarios, every.transport) == (tuple(SCENARIOS), "stdio")
    assert ClientCheckOptions(client_argv=("c", "{agent-json}"), scenarios=("C3",)).scenarios == (
        "C3",
    )
    served = ClientCheckOptions(client_argv=("c", "{url}"), listen="ws://127.0.0.1:0/acp")
    assert served.transport == "ws"
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"client_argv": ("client", "--", "agent")}, "must name its Agent with {agent}"),
        ({"client_argv": ("c", "{agent}"), "listen": "ws://h:1/a"}, "must name the URL with"),
        ({"client_argv": ("c", "{url}"), "listen": "tcp://h:1"}, "expected an http:// or ws://"),
        ({"client_argv": ("c", "{agent}"), "scenarios": ("C8",)}, r"unknown scenarios \['C8'\]"),
        ({"client_argv": ()}, "give the Client's command"),
    ]
    for settings, message in refusals:
        with pytest.raises(OptionError, match=message):
            ClientCheckOptions(**settings)


def test_the_demo_takes_the_bad_agent_or_an_agent_command_not_both() -> None:
    assert DemoOptions(bad_agent=True).bad_agent
    with pytest.raises(OptionError) as refused:
        DemoOptions(bad_agent=True, agent_argv=("agent",))
    assert str(refused.value) == (
        "--bad-agent picks the reference Agent: give it or an Agent command, not both"
    )
    assert refused.value.option == "AGENT_CMD"


@pytest.mark.parametrize("command", sorted(MODELS))
def test_a_tool_command_defaults_to_its_model(command: str) -> None:
    """The command line cannot import a tool's model for its defaults (it loads no tool until one
    runs): each default of an option the model holds as given (a number, a name) is the model's,
    written again, and kept equal here."""
    model = MODELS[command]()
    defaults = option_defaults(command)
    compared = 0
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name in defaults and isinstance(value, int | float | str):
            assert defaults[field.name] == value, f"{command} --{field.name}"
            compared += 1
    assert compared


@pytest.mark.parametrize(
    ("command", "option"),
    [(command, option) for command in sorted(MODELS) for option in ranged_options(command)],
    ids=lambda value: getattr(value, "flag", value),
)
def test_a_tool_model_refuses_what_its_command_line_refuses(command: str, option: Any) -> None:
    """An option's least value, as the command's ``--help`` states it, is the model's: the model
    takes it and refuses the nearest value under it, naming the option."""
    MODELS[command](**{option.name: option.minimum})
    with pytest.raises(OptionError) as refused:
        MODELS[command](**{option.name: option.below()})
    assert str(refused.value) == (
        f"{option.flag} must be at least {option.minimum} (got {option.below()})"
    )


@pytest.mark.parametrize(
    ("command", "values", "message"),
    [
        (
            "check-agent",
            {"transport": "bogus"},
            "--transport: expected one of ['stdio', 'ws', 'http'], got 'bogus'",
        ),
        ("check-agent", {"answer_timeout": float("nan")}, "--answer-timeout must be at least 0.1"),
        ("check-agent", {"loss_wait": -1.0}, "loss_wait must be at least 0 (got -1.0)"),
        ("check-agent", {"traces": ("T9",)}, "unknown traces ['T9']; known: ['T0'"),
        ("client", {"setup_timeout": 0.0}, "setup_timeout must be at least 0.001 (got 0.0)"),
        ("client", {"grace": -1.0}, "grace must be at least 0 (got -1.0)"),
        ("client", {"max_message_bytes": 0}, "max_message_bytes must be at least 1 (got 0)"),
        ("agent", {"max_message_bytes": 0}, "max_message_bytes must be at least 1 (got 0)"),
    ],
)
def test_a_tool_model_refuses_a_value_out_of_its_range(
    command: str, values: dict[str, Any], message: str
) -> None:
    """What no option of the command line sets (or a typer choice refuses first) is checked by
    the model too."""
    with pytest.raises(OptionError) as refused:
        MODELS[command](**values)
    assert str(refused.value).startswith(message)


def test_the_client_needs_an_agent_command_or_a_url() -> None:
    with pytest.raises(
        OptionError, match="no Agent given: give its command after --, or --connect URL"
    ):
        ClientOptions(prompts=("hello",))
    with pytest.raises(OptionError, match="expected a ws:// or http:// URL, got 'foo'"):
        ClientOptions(connect="foo")


def test_an_agent_command_that_cannot_run_is_named() -> None:
    assert cannot_run([sys.executable, "-c", "pass"]) is None
    assert cannot_run(["/nonexistent/agent"]) == (
        "cannot run the Agent: '/nonexistent/agent' is not an executable"
    )
