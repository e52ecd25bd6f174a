"""``restart_proxy``: a simulated restart of the data plane once the message was forwarded: every
connection closed, every id map and pending table forgotten, spawned Agents stopped, listeners
down for ``downtime_ms``. The experiment's own state (counters, random stream, ledger) is kept."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxy.core.actions.base import Action, ActionModel, After, Effect, Fault
from proxy.core.commands import Restart

__all__ = ["ACTION", "MAX_DOWNTIME_MS", "Downtime", "RestartProxy"]

MAX_DOWNTIME_MS = 3_600_000.0
"""The longest ``restart_proxy`` downtime: an hour."""

Downtime = Annotated[float, Field(ge=0, le=MAX_DOWNTIME_MS, allow_inf_nan=False)]
"""Milliseconds a ``restart_proxy`` keeps the data plane down."""


class RestartProxy(ActionModel):
    """Restart the data plane: connections closed, id maps forgotten, down ``downtime_ms``."""

    action: Literal["restart_proxy"]
    downtime_ms: Downtime = Field(
        0.0, description="milliseconds the data plane stays down (an hour at most)"
    )


def apply(params: RestartProxy, _fault: Fault) -> list[Effect]:
    """The restart, once the message was forwarded."""
    return [After(Restart(params.downtime_ms / 1000))]


ACTION = Action(
    RestartProxy,
    apply,
    "a restart of the data plane: every connection closed, id maps forgotten, spawned Agents "
    "stopped, listeners down `downtime_ms`; counters, random stream and ledger kept",
)
