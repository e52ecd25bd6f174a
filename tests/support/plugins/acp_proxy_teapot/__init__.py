"""A plugin action for the tests of plugin loading: ``teapot`` answers a request with the error
``-32418`` and stops it. Installed by the tests under a ``dist-info`` of its own."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Reply, Stop, Subject
from proxy.core.jsonrpc import Kind, error_response


class Teapot(ActionModel):
    """Answer a request with -32418 and ``message``."""

    action: Literal["teapot"]
    message: str = Field("I'm a teapot", description="the error's message")


def applies(_params: Teapot, subject: Subject) -> bool:
    """Only a request can be answered."""
    return subject.kind is Kind.REQUEST


def apply(params: Teapot, fault: Fault) -> list[Effect]:
    """The error under the sender's id; the request goes no further."""
    assert fault.message.id_token is not None
    return [
        Reply(error_response(fault.message.id_token, -32418, params.message)),
        Stop("answered_by_proxy"),
    ]


ACTION = Action(Teapot, apply, "a request is answered -32418 (a test plugin)", applies=applies)
