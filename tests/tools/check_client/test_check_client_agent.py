"""The Client's command with the checker's Agent put in (``proxy.tools.check_client.agent``):
``{agent}`` as the Agent's words or its shell-quoted command line, ``{agent-json}``, ``{url}``."""

from __future__ import annotations

import json
import shlex

from proxy.tools.check_client.agent import expand

AGENT = ["python", "-m", "proxy", "run", "--trace", "/tmp/a b/trace.jsonl", "--", "agent"]


def test_an_argument_that_is_exactly_agent_becomes_the_agents_words() -> None:
    """For Clients that take ``-- AGENT_CMD ARGS``."""
    assert expand(["client", "-p", "hi", "--", "{agent}"], agent=AGENT, url=None) == [
        "client", "-p", "hi", "--", *AGENT,
    ]  # fmt: skip


def test_agent_inside_a_longer_argument_is_the_shell_quoted_command_line() -> None:
    """For Clients such as ``acpx --agent "{agent}" exec TEXT``: one argument a shell splits
    back into the same words."""
    argv = expand(["acpx", "--agent", "{agent}!", "--cmd={agent}"], agent=AGENT, url=None)
    assert argv[2] == shlex.join(AGENT) + "!"
    assert shlex.split(argv[3].removeprefix("--cmd=")) == AGENT


def test_agent_json_is_a_json_array_of_the_words() -> None:
    (argv,) = expand(["{agent-json}"], agent=AGENT, url=None)
    assert json.loads(argv) == AGENT


def test_url_is_replaced_only_when_the_agent_is_served() -> None:
    """``{url}`` with ``--listen``; left alone otherwise (the options refuse that command)."""
    served = expand(["client", "--connect", "{url}"], agent=AGENT, url="ws://127.0.0.1:9/acp")
    assert served == ["client", "--connect", "ws://127.0.0.1:9/acp"]
    assert expand(["{url}"], agent=AGENT, url=None) == ["{url}"]
