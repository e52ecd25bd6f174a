"""``sever``: the connection to ``side`` (``client``, ``agent`` or ``both``) is cut both ways,
``before`` forwarding the message (it is lost, with what was queued) or ``after`` it.

Pending requests of a closed side are never answered. On a stdio Client, cutting the Client's
side closes the proxy's stdout: the Client sees its Agent die. ``moment`` was called ``when``
(easily read as the rule's own ``when``); the old name still loads, with a note.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)

from proxy.core.actions.base import Action, ActionModel, Cut, Effect, Fault, Stop

__all__ = ["ACTION", "CloseCode", "Sever"]


def _sendable(code: int) -> int:
    """A WebSocket close code an endpoint may send (RFC 6455 7.4: 1004-1006 and 1015 are
    reserved, 1016-2999 unassigned, below 1000 unused)."""
    if not (1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999):
        raise ValueError(
            f"{code} cannot be sent in a close frame: 1000-1003, 1007-1014 or 3000-4999"
        )
    return code


CloseCode = Annotated[
    int,
    Field(
        ge=1000,
        le=4999,
        description="WebSocket close code: 1000-1003, 1007-1014 or 3000-4999",
    ),
    AfterValidator(_sendable),
]
"""A close code a ``sever`` may send."""


class Sever(ActionModel):
    """Cut the connection to ``side`` at ``moment``: before or after forwarding the message.

    ``moment`` was called ``when`` (easily read as the rule's own ``when``); the old name is still
    accepted, and the rule's notes tell its author to use the new one.
    """

    action: Literal["sever"]
    side: Literal["client", "agent", "both"] = Field(
        "both", description="the connection cut: the Client's, the Agent's or both"
    )
    moment: Literal["before", "after"] = Field(
        "before",
        validation_alias=AliasChoices("moment", "when"),
        description="before or after forwarding the message",
    )
    close_code: CloseCode = 1001
    _old_name: bool = PrivateAttr(False)
    """The rule said ``when`` for ``moment``."""

    @model_validator(mode="wrap")
    @classmethod
    def _renamed(cls, data: Any, handler: ModelWrapValidatorHandler[Sever]) -> Sever:
        old = isinstance(data, dict) and "when" in data
        if old and "moment" in data:
            raise ValueError("give 'moment' only ('when' is its old name)")
        sever = handler(data)
        sever._old_name = old
        return sever

    @property
    def old_name(self) -> bool:
        """The rule used ``when``, the old name of ``moment``."""
        return self._old_name


def apply(params: Sever, _fault: Fault) -> list[Effect]:
    """Cut before forwarding (the message is lost) or after it."""
    cut = Cut(params.side, params.moment == "before", params.close_code)
    return [cut, Stop("severed")] if cut.before else [cut]


def notes(params: Sever) -> list[tuple[str, str]]:
    """The old name of ``moment``."""
    if params.old_name:
        return [
            (
                "do.when",
                "'when' is the old name of 'moment' (before or after forwarding); rename it",
            )
        ]
    return []


ACTION = Action(
    Sever,
    apply,
    "the connection to `side` (`client`, `agent`, `both`) is cut both ways, `before` or `after` "
    "forwarding the message (`moment`), with `close_code` on a WebSocket",
    notes=notes,
)
