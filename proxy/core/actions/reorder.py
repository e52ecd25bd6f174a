"""``reorder``: the message is held until ``after`` later messages in its direction have passed
it, then forwarded right behind the last of them (at the latest after ``max_ms``, if fewer come):
the order a peer sees when a path reorders, as ``session/update`` chunks out of turn."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Hold

__all__ = ["ACTION", "Reorder"]


class Reorder(ActionModel):
    """Hold the message until ``after`` later ones in its direction have passed (or ``max_ms``)."""

    action: Literal["reorder"]
    after: PositiveInt = Field(1, description="later messages in its direction that pass it")
    max_ms: PositiveFloat = Field(
        1000.0, description="milliseconds it is held at most, when fewer messages come"
    )


def apply(params: Reorder, _fault: Fault) -> list[Effect]:
    """A hold that ends when ``after`` messages have passed, or after ``max_ms``."""
    return [Hold(params.max_ms / 1000, passed=params.after)]


ACTION = Action(
    Reorder,
    apply,
    "the message is held until `after` later messages in its direction have passed it (at most "
    "`max_ms`), then forwarded right behind them",
)
