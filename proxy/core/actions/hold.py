"""``hold``: a breakpoint. The message is paused at the proxy until the control API releases,
drops or edits it (``/api/held``), or until ``timeout_ms`` is up, when it is released or dropped
as ``then`` says; the messages behind it keep flowing (as past a ``delay``). Each held message
gets a proxy-wide id (:mod:`proxy.core.held`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.core.actions.base import Action, ActionModel, Breakpoint, Effect, Fault
from proxy.core.observations import HeldThen

__all__ = ["ACTION", "MAX_TIMEOUT_MS", "Hold"]

MAX_TIMEOUT_MS = 3_600_000.0
"""The longest a message may wait for someone to act on it: an hour."""


class Hold(ActionModel):
    """Pause the message until the control API acts on it, or ``timeout_ms`` is up."""

    action: Literal["hold"]
    timeout_ms: float = Field(
        60_000.0,
        gt=0,
        le=MAX_TIMEOUT_MS,
        description="milliseconds the message waits for the control API to act on it (at most "
        "an hour)",
    )
    then: HeldThen = Field(
        "release",
        description="what happens to it when `timeout_ms` is up; a request dropped (so, or over "
        "the control API) is never answered: its sender waits for an answer that never comes",
    )


def apply(params: Hold, _fault: Fault) -> list[Effect]:
    """A breakpoint of ``timeout_ms``."""
    return [Breakpoint(params.timeout_ms / 1000, params.then)]


ACTION = Action(
    Hold,
    apply,
    "a breakpoint: the message waits until the control API releases, drops or edits it "
    "(`/api/held`), at most `timeout_ms`, then is released or dropped as `then` says; others "
    "keep flowing past it",
)
