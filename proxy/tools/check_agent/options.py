"""What check-agent checks, and how: :class:`CheckOptions`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from proxy.core.errors import OptionError, at_least

__all__ = ["CheckOptions", "Transport"]

Transport = Literal["stdio", "ws", "http"]
"""How the checker reaches the proxy in front of the Agent."""

MIN_WAIT = 0.1
"""The least the checker waits for an answer or for an Agent to start: less would judge an Agent
by the machine's load."""


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What to check, and how."""

    agent_argv: tuple[str, ...]
    transport: Transport = "stdio"
    answer_timeout: float = 5.0
    """Seconds to wait for one expected message before judging the trace."""
    loss_wait: float = 1.0
    """Seconds to wait for an answer the proxy is meant to have lost (proof it is lost)."""
    startup_timeout: float = 30.0
    """Seconds an Agent just started (or restarted) has to answer ``initialize``: a slow start (an
    ``npx`` download, a cold JIT, a loaded machine) is not a failure of the RFD."""
    traces: tuple[str, ...] = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")

    def __post_init__(self) -> None:
        from proxy.tools.check_agent.traces import TRACES  # noqa: PLC0415 - the traces use these options

        if self.transport not in get_args(Transport):
            raise OptionError(
                f"--transport: expected one of {list(get_args(Transport))}, got {self.transport!r}"
            )
        at_least("--answer-timeout", self.answer_timeout, MIN_WAIT)
        at_least("--startup-timeout", self.startup_timeout, MIN_WAIT)
        at_least("loss_wait", self.loss_wait, 0)
        unknown = [name for name in self.traces if name not in TRACES]
        if unknown:
            raise OptionError(f"unknown traces {unknown}; known: {list(TRACES)}", option="--only")

    @classmethod
    def from_command_line(
        cls, *, agent_argv: Sequence[str], traces: Sequence[str] = (), **settings: Any
    ) -> CheckOptions:
        """The options of ``acp-proxy check-agent``: ``traces`` the names of those to run (none:
        every one)."""
        if traces:
            settings["traces"] = tuple(traces)
        return cls(agent_argv=tuple(agent_argv), **settings)
