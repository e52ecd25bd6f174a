"""``timeout``: from the message on, nothing goes on in its direction; after ``ms`` the
connection to ``side`` is cut, and what was held is lost (Toxiproxy's ``timeout``): a peer that
stops answering, then hangs up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Freeze
from proxy.core.actions.sever import CloseCode

__all__ = ["ACTION", "Timeout"]


class Timeout(ActionModel):
    """Hold everything in the message's direction, then cut ``side`` after ``ms``."""

    action: Literal["timeout"]
    ms: PositiveFloat = Field(description="milliseconds of silence before the connection is cut")
    side: Literal["client", "agent", "both"] = Field(
        "both", description="the connection cut: the Client's, the Agent's or both"
    )
    close_code: CloseCode = 1001


def apply(params: Timeout, _fault: Fault) -> list[Effect]:
    """A freeze of the direction that ends by cutting the connection."""
    return [Freeze(params.ms / 1000, sever=params.side, close_code=params.close_code)]


ACTION = Action(
    Timeout,
    apply,
    "from the message on, nothing goes on in its direction; after `ms` the connection to `side` "
    "is cut and what was held is lost",
)
