"""``close_stream``: the SSE stream that would carry the message to an HTTP Client is closed, and
the message is lost with it (HTTP listener only); later messages wait for a new GET."""

from __future__ import annotations

from typing import Literal

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, KillStream, Subject
from proxy.core.events import Direction

__all__ = ["ACTION", "CloseStream"]


class CloseStream(ActionModel):
    """HTTP listener: close the SSE stream that would carry the message; the message is lost."""

    action: Literal["close_stream"]


def applies(_params: CloseStream, subject: Subject) -> bool:
    """Only a message to an HTTP Client travels on an SSE stream."""
    return subject.downstream == "http" and subject.direction is Direction.TO_CLIENT


def apply(_params: CloseStream, _fault: Fault) -> list[Effect]:
    """The stream dies with the message."""
    return [KillStream()]


ACTION = Action(
    CloseStream,
    apply,
    "HTTP listener: the SSE stream that would carry the message is closed; the message is lost",
    applies=applies,
    needs_http=True,
)
