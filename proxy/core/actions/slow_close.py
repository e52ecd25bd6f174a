"""``slow_close``: once the rule fired on a message, the close of the connection toward the peer
the message went to reaches that peer ``ms`` late (Toxiproxy's ``slow_close``): when the other
peer ends its stream, the proxy passes the end on only after ``ms``. The message itself goes on
as it came; nothing else is held."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from proxy.core.actions.base import Action, ActionModel, CloseLate, Effect, Fault

__all__ = ["ACTION", "SlowClose"]


class SlowClose(ActionModel):
    """Pass the end of the other peer's stream on to the message's peer ``ms`` late."""

    action: Literal["slow_close"]
    ms: PositiveFloat = Field(description="milliseconds the close reaches the peer late")


def apply(params: SlowClose, _fault: Fault) -> list[Effect]:
    """The close toward the message's peer, from now on, ``ms`` late."""
    return [CloseLate(params.ms / 1000)]


ACTION = Action(
    SlowClose,
    apply,
    "the message goes on; from then on the close of the connection toward its peer reaches that "
    "peer `ms` late",
)
