"""What a trace concludes: its :class:`TraceResult`, and the exceptions a trace raises to say so.

A trace returns the reason of its PASS; it raises :class:`Fail` when the Agent broke the trace's
rule, :class:`Skip` when the Agent lacks what the trace needs, and :class:`Error` when the check
itself could not be carried out (the proxy did not start): not the Agent's fault.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Error", "Fail", "Skip", "Status", "TraceResult"]


class Status(enum.StrEnum):
    """A trace's verdict."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"
    """The check itself could not be carried out (not the Agent's fault)."""


@dataclass
class TraceResult:
    """The verdict of one trace."""

    trace: str
    title: str
    status: Status
    reason: str = ""
    seconds: float = 0.0


class Fail(Exception):
    """The Agent broke the trace's rule (``diagnose``: what the proxy logged explains it)."""

    def __init__(self, reason: str, *, diagnose: bool = False) -> None:
        super().__init__(reason)
        self.diagnose = diagnose


class Skip(Exception):
    """The Agent lacks what the trace needs; ``every_trace`` when it lacks what every trace needs
    (an Agent that is not a v2 one: the traces after it are skipped without running)."""

    def __init__(self, reason: str, *, every_trace: bool = False) -> None:
        super().__init__(reason)
        self.every_trace = every_trace


class Error(Exception):
    """The check could not be carried out (the proxy did not start, a bug of the checker)."""
