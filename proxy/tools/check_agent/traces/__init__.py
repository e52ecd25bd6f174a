"""The traces T0-T7 of the wire brief (section 5), by what they are about, in one table.

Each trace is ``async def tN(lab) -> str``: it starts the proxy with a fault file of its own,
talks to it as a Client, provokes the loss it is about, and returns the reason of its PASS (or
raises :class:`~proxy.tools.verdicts.Fail` or
:class:`~proxy.tools.verdicts.Skip`).

* :mod:`.invalid_keys`: T0;
* :mod:`.lost_answers`: T1, T2, T3, T7, a retry after the answer was lost;
* :mod:`.held_prompts`: T4, T5, a key whose prompt is held, withdrawn or refused;
* :mod:`.key_scope`: T6.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from proxy.tools.check_agent.lab import Lab
from proxy.tools.check_agent.traces.held_prompts import t4, t5
from proxy.tools.check_agent.traces.invalid_keys import t0
from proxy.tools.check_agent.traces.key_scope import t6
from proxy.tools.check_agent.traces.lost_answers import t1, t2, t3, t7

__all__ = ["TRACES", "Trace"]

Trace = Callable[[Lab], Awaitable[str]]
"""A trace: run against a lab, the reason of its PASS."""

TRACES: dict[str, tuple[str, Trace]] = {
    "T0": ("invalid keys are rejected with -32602", t0),
    "T1": ("retry on the same connection", t1),
    "T2": ("retry after session/resume on a new connection", t2),
    "T3": ("retry after an Agent restart with a stored session", t3),
    "T4": ("retry while the prompt is held; cancel of a held key", t4),
    "T5": ("retry after an error", t5),
    "T6": ("same key in another session", t6),
    "T7": ("retry of a prompt inserted during active work", t7),
}
"""Every trace by name: its title and its coroutine function."""
