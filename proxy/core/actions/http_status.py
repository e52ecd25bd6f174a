"""``http_status``: the POST that carried the message is answered ``status`` instead of 200/202
(HTTP listener only); with ``forward`` the message is relayed all the same: "the POST failed but
the Agent acted"."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Now, Stop, Subject
from proxy.core.commands import FailPost
from proxy.core.events import Direction

__all__ = ["ACTION", "HttpStatus"]


class HttpStatus(ActionModel):
    """HTTP listener: answer the POST with ``status``; ``forward`` still relays the message."""

    action: Literal["http_status"]
    status: int = Field(ge=400, le=599, description="the HTTP status the POST is answered with")
    forward: bool = Field(
        False, description="relay the message all the same (the POST failed but the Agent acted)"
    )


def applies(_params: HttpStatus, subject: Subject) -> bool:
    """Only a POST from an HTTP Client can fail."""
    return subject.downstream == "http" and subject.direction is Direction.TO_AGENT


def apply(params: HttpStatus, _fault: Fault) -> list[Effect]:
    """The POST's status; the message goes on only with ``forward``."""
    fail: list[Effect] = [Now(FailPost(params.status))]
    return fail if params.forward else [*fail, Stop("refused")]


ACTION = Action(
    HttpStatus,
    apply,
    "HTTP listener: the POST is answered `status` instead of 200/202; `forward: true` still "
    "relays the message (the POST failed but the Agent acted)",
    applies=applies,
    needs_http=True,
)
