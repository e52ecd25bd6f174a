"""What check-agent tells, through the checkers' shared verdicts (:mod:`proxy.tools.verdicts`):
the table headed by the Agent and the transport, JSON with each result's ``trace``, JUnit XML in
the suite ``acp-check-agent-TRANSPORT``, and the exit status."""

from __future__ import annotations

from proxy.tools import verdicts
from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.verdicts import Result, exit_status

__all__ = ["exit_status", "render", "to_json", "to_junit"]


def render(results: list[Result], options: CheckOptions) -> str:
    """A table for people."""
    heading = f"check-agent over {options.transport}: {' '.join(options.agent_argv)}"
    return verdicts.render(results, heading, what="trace")


def to_json(results: list[Result]) -> str:
    """The results as JSON."""
    return verdicts.to_json(results, what="trace")


def to_junit(results: list[Result], options: CheckOptions) -> bytes:
    """JUnit XML, one test case per trace, for CI dashboards."""
    return verdicts.to_junit(results, f"acp-check-agent-{options.transport}")
