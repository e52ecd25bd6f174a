"""``http_status``: the POST that carried the message is answered ``status`` instead of 200/202
(HTTP listener only); with ``forward`` the message is relayed all the same: "the POST failed but
the Agent acted". Unless ``attribute`` is false, the answer has an ``Acp-Fault`` header:
``{"rule": ..., "action": "http_status"}``, as JSON."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from proxy.core.actions.base import (
    ATTRIBUTE_DESCRIPTION,
    Action,
    ActionModel,
    Effect,
    Fault,
    Now,
    Stop,
    Subject,
    attribution,
)
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
    attribute: bool = Field(True, description=f"an `Acp-Fault` header: {ATTRIBUTE_DESCRIPTION}")


def applies(_params: HttpStatus, subject: Subject) -> bool:
    """Only a POST from an HTTP Client can fail."""
    return subject.downstream == "http" and subject.direction is Direction.TO_AGENT


def apply(params: HttpStatus, fault: Fault) -> list[Effect]:
    """The POST's status; the message goes on only with ``forward``."""
    said = None
    if params.attribute:  # ASCII, one line: a header value whatever the rule's name holds
        said = json.dumps(attribution(fault, params.action), separators=(",", ":"))
    fail: list[Effect] = [Now(FailPost(params.status, said))]
    return fail if params.forward else [*fail, Stop("refused")]


ACTION = Action(
    HttpStatus,
    apply,
    "HTTP listener: the POST is answered `status` instead of 200/202, with an `Acp-Fault` header "
    "naming the rule and the action (JSON) unless `attribute: false`; `forward: true` still "
    "relays the message (the POST failed but the Agent acted)",
    applies=applies,
    needs_http=True,
)
