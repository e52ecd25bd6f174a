"""``error``: a request is answered at once by the proxy with a JSON-RPC error (``code``,
``message``, ``data``) under the sender's id, and never forwarded. Unless ``attribute`` is false,
``data`` carries ``acpFault: {rule, action}`` (added to an object, or the whole ``data`` when
there is none; a ``data`` of another type is sent as it is)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from proxy.core.actions.base import (
    ATTRIBUTE_DESCRIPTION,
    Action,
    ActionModel,
    Effect,
    Fault,
    Reply,
    Stop,
    Subject,
    attribution,
)
from proxy.core.jsonrpc import Kind, error_response

__all__ = ["ACTION", "ErrorReply"]


class ErrorReply(ActionModel):
    """Answer a request at once with a JSON-RPC error under the sender's id; do not forward it."""

    action: Literal["error"]
    code: int = Field(-32603, description="the JSON-RPC error code")
    message: str = Field(
        "Error injected by acp-fault-proxy", description="the JSON-RPC error message"
    )
    data: Any = Field(
        None,
        description="the error's `data`: any JSON (left out when null and not attributed)",
    )
    attribute: bool = Field(
        True, description=f"`data.acpFault`: {ATTRIBUTE_DESCRIPTION} (an object `data` only)"
    )

    @model_validator(mode="after")
    def _writable(self) -> ErrorReply:
        """The answer is written when the rule fires: refuse now what JSON cannot carry (a YAML
        set or binary, a lone surrogate, an integer beyond 64 bits)."""
        try:
            error_response(b"0", self.code, self.message, self.data)
        except TypeError as exc:  # orjson.JSONEncodeError
            raise ValueError(f"the error answer cannot be written as JSON: {exc}") from None
        return self


def applies(_params: ErrorReply, subject: Subject) -> bool:
    """Only a request can be answered with an error."""
    return subject.kind is Kind.REQUEST


def apply(params: ErrorReply, fault: Fault) -> list[Effect]:
    """The sender gets the error under its own id; the request goes no further."""
    id_token = fault.message.id_token
    assert id_token is not None  # a request (see applies)
    data = params.data
    if params.attribute and (data is None or isinstance(data, dict)):
        data = dict(data or {})
        data.setdefault("acpFault", attribution(fault, params.action))  # the rule's own wins
    return [
        Reply(error_response(id_token, params.code, params.message, data)),
        Stop("answered_by_proxy"),
    ]


def notes(params: ErrorReply) -> list[tuple[str, str]]:
    """A ``data`` that cannot carry the attribution."""
    if params.attribute and params.data is not None and not isinstance(params.data, dict):
        why = "not an object: the error is sent without data.acpFault (attribute: false says so)"
        return [("do.data", why)]
    return []


ACTION = Action(
    ErrorReply,
    apply,
    "a request is answered at once with a JSON-RPC error (`code`, `message`, `data`) under the "
    "sender's id, and not forwarded; `data.acpFault` names the rule and the action, unless "
    "`attribute: false`",
    applies=applies,
    notes=notes,
)
