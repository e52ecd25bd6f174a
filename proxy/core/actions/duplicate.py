"""``duplicate``: the message is sent ``copies`` extra times, ``gap_ms`` apart. A request's copies
get ids of their own; the first answer is relayed and the others recorded and swallowed: a
replayed retry, as the Agent sees it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt

from proxy.core.actions.base import Action, ActionModel, Copies, Effect, Fault

__all__ = ["ACTION", "Duplicate"]


class Duplicate(ActionModel):
    """Send the message ``copies`` extra times, ``gap_ms`` apart (a request: a replayed retry)."""

    action: Literal["duplicate"]
    copies: PositiveInt = Field(1, description="how many copies follow the message")
    gap_ms: NonNegativeFloat = Field(0.0, description="milliseconds between the copies")


def apply(params: Duplicate, _fault: Fault) -> list[Effect]:
    """The copies follow the message."""
    return [Copies(params.copies, params.gap_ms / 1000)]


ACTION = Action(
    Duplicate,
    apply,
    "the message is sent `copies` extra times, `gap_ms` apart; a request's copies get ids of "
    "their own, the first answer is relayed and the others swallowed (a replayed retry)",
)
