"""What check-agent checks, and how: :class:`CheckOptions`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CheckOptions"]


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What to check, and how."""

    agent_argv: tuple[str, ...]
    transport: str = "stdio"
    answer_timeout: float = 5.0
    """Seconds to wait for one expected message before judging the trace."""
    loss_wait: float = 1.0
    """Seconds to wait for an answer the proxy is meant to have lost (proof it is lost)."""
    startup_timeout: float = 30.0
    """Seconds an Agent just started (or restarted) has to answer ``initialize``: a slow start (an
    ``npx`` download, a cold JIT, a loaded machine) is not a failure of the RFD."""
    traces: tuple[str, ...] = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")
