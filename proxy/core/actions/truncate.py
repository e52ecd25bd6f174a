"""``truncate``: only the first ``bytes`` of the message are forwarded, then the connection
toward its peer is severed (Toxiproxy's ``limit_data``, for one message): the peer reads a message
cut short, as a process that dies while writing leaves it. On stdio the line has no end; over a
WebSocket the frame holds the cut message; over Streamable HTTP the event (or the POST) does."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from proxy.core.actions.base import Action, ActionModel, CutShort, Effect, Fault

__all__ = ["ACTION", "Truncate"]


class Truncate(ActionModel):
    """Forward the first ``bytes`` of the message, then sever the connection toward its peer."""

    action: Literal["truncate"]
    bytes: PositiveInt = Field(description="bytes of the message forwarded before the cut")


def apply(params: Truncate, _fault: Fault) -> list[Effect]:
    """The cut, at ``bytes``."""
    return [CutShort(params.bytes)]


ACTION = Action(
    Truncate,
    apply,
    "only the first `bytes` of the message are forwarded (on stdio, without the line end), "
    "then the connection toward its peer is severed",
)
