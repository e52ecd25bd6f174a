"""The tools' options models: each checks the values of its command line and refuses an invalid
one with an :class:`~proxy.core.errors.OptionError` (the command line's usage error, tested with
the commands themselves in ``tests/tools/check_agent/test_check_agent_command.py``,
``tests/tools/lab/test_demo.py``, ``tests/e2e/test_cli.py``)."""

from __future__ import annotations

import inspect
import sys

import pytest

from proxy import cli
from proxy.core.errors import OptionError
from proxy.tools import cannot_run
from proxy.tools.check_agent import TRACES, CheckOptions
from proxy.tools.lab.agent import AgentOptions
from proxy.tools.lab.client import ClientOptions
from proxy.tools.lab.demo import ANSWER_TIMEOUT, DemoOptions


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


def test_the_demo_takes_the_bad_agent_or_an_agent_command_not_both() -> None:
    assert DemoOptions(bad_agent=True).bad_agent
    with pytest.raises(OptionError) as refused:
        DemoOptions(bad_agent=True, agent_argv=("agent",))
    assert str(refused.value) == (
        "--bad-agent picks the reference Agent: give it or an Agent command, not both"
    )
    assert refused.value.option == "AGENT_CMD"


def test_the_demo_command_waits_for_an_answer_as_long_as_the_demo_does() -> None:
    """The command line cannot import the demo for its default (it loads no tool until one
    runs): its --answer-timeout default is the demo's, written again, and kept equal here."""
    default = inspect.signature(cli.demo).parameters["answer_timeout"].default
    assert default == ANSWER_TIMEOUT == DemoOptions().answer_timeout


def test_the_client_needs_an_agent_command_or_a_url() -> None:
    with pytest.raises(OptionError, match="give either an agent command or a URL"):
        ClientOptions(prompts=("hello",))
    with pytest.raises(OptionError, match="expected a ws:// or http:// URL, got 'foo'"):
        ClientOptions(connect="foo")


def test_an_agent_command_that_cannot_run_is_named() -> None:
    assert cannot_run([sys.executable, "-c", "pass"]) is None
    assert cannot_run(["/nonexistent/agent"]) == (
        "cannot run the Agent: '/nonexistent/agent' is not an executable"
    )
