"""``drop``: the message is discarded (a request never reaches its peer; an answer is lost)."""

from __future__ import annotations

from typing import Literal

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Stop

__all__ = ["ACTION", "Drop"]


class Drop(ActionModel):
    """Discard the message."""

    action: Literal["drop"]


def apply(_params: Drop, _fault: Fault) -> list[Effect]:
    """The message goes no further."""
    return [Stop("dropped")]


ACTION = Action(
    Drop, apply, "the message is discarded: a request never reaches its peer, an answer is lost"
)
