"""``stall``: from the message on, nothing goes on in its direction for ``ms`` (or until the
control API releases it: ``POST /api/actions/release``); the connection stays open, the other
direction flows, nothing is lost. Then what was held goes on, in order: a peer that waits on a
silent connection, as Toxiproxy's ``timeout`` with no timeout, or a stalled network path."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Freeze

__all__ = ["ACTION", "Stall"]


class Stall(ActionModel):
    """Hold everything in the message's direction for ``ms``, the message first."""

    action: Literal["stall"]
    ms: PositiveFloat = Field(description="milliseconds nothing goes on in that direction")


def apply(params: Stall, _fault: Fault) -> list[Effect]:
    """A freeze of the direction that ends by letting what it held go on."""
    return [Freeze(params.ms / 1000)]


ACTION = Action(
    Stall,
    apply,
    "from the message on, nothing goes on in its direction for `ms` (or until released over the "
    "control API); the connection stays open, then what was held goes on, in order",
)
