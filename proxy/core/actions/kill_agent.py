"""``kill_agent``: the spawned Agent gets ``signal`` (default KILL), ``after_ms`` after the message
was forwarded; with ``respawn`` a new Agent is started on the same link."""

from __future__ import annotations

import signal
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, NonNegativeFloat

from proxy.core.actions.base import Action, ActionModel, After, Effect, Fault
from proxy.core.commands import SignalAgent

__all__ = ["ACTION", "KillAgent", "SignalNumber", "signal_number"]


def signal_number(value: Any) -> int:
    """A signal given by name (KILL, SIGTERM, term) or number, as its number."""
    if isinstance(value, bool):
        raise ValueError("a signal is a name such as KILL or TERM, or a number")
    if isinstance(value, int):
        valid = {int(s) for s in signal.Signals}
        if value not in valid:
            raise ValueError(f"{value} is not a signal number")
        return value
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        try:
            return int(signal.Signals[name])
        except KeyError:
            raise ValueError(f"{value!r} is not a signal name") from None
    raise ValueError("a signal is a name such as KILL or TERM, or a number")


SignalNumber = Annotated[
    int,
    BeforeValidator(signal_number, json_schema_input_type=int | str),
    Field(description="name (KILL, TERM, ...) or number"),
]
"""A signal, given by name or number."""


class KillAgent(ActionModel):
    """Send ``signal`` to the spawned Agent after ``after_ms``; ``respawn`` starts a new one."""

    action: Literal["kill_agent"]
    signal: SignalNumber = Field(
        int(signal.SIGKILL), description="a name (KILL, TERM, ...) or a number (9 is KILL)"
    )
    after_ms: NonNegativeFloat = Field(
        0.0,
        description="milliseconds after the message was forwarded; nothing is signalled if "
        "the proxy is closing the Agent's connection by then (the Client left)",
    )
    respawn: bool = Field(
        False, description="start a new Agent at once; the Client's connection stays open"
    )


def apply(params: KillAgent, _fault: Fault) -> list[Effect]:
    """The signal, once the message was forwarded."""
    return [After(SignalAgent(params.signal, params.respawn), params.after_ms / 1000)]


ACTION = Action(
    KillAgent,
    apply,
    "the spawned Agent gets `signal` (default KILL) `after_ms` after the message was forwarded; "
    "`respawn` starts a new one",
)
