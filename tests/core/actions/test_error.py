"""``error``: a request answered by the proxy under its sender's id, and stopped."""

from __future__ import annotations

import json

import pytest
from action_lab import fault

from proxy.core.actions.base import Reply, Stop
from proxy.core.actions.error import ACTION, ErrorReply
from proxy.core.faultfile import FaultFileError, validate_rules


def test_the_sender_gets_the_error_under_its_own_id() -> None:
    """The answer carries the sender's exact id token and the rule's code, message and data,
    with the rule and action that injected it in ``data.acpFault``."""
    raw = b'{"jsonrpc":"2.0","id":"a-1","method":"session/prompt","params":{}}'
    params = ErrorReply(action="error", code=-32000, message="busy", data={"retry": True})
    reply, stop = ACTION.apply(params, fault(raw, rule="busy-prompts"))
    assert stop == Stop("answered_by_proxy")
    assert isinstance(reply, Reply)
    assert json.loads(reply.data) == {
        "jsonrpc": "2.0",
        "id": "a-1",
        "error": {
            "code": -32000,
            "message": "busy",
            "data": {"retry": True, "acpFault": {"rule": "busy-prompts", "action": "error"}},
        },
    }


@pytest.mark.parametrize(
    ("data", "attribute", "sent"),
    [
        (None, True, {"acpFault": {"rule": "r", "action": "error"}}),
        (None, False, None),  # imitates a real failure exactly: no data at all
        ({"retry": True}, False, {"retry": True}),
        ({"acpFault": "mine"}, True, {"acpFault": "mine"}),  # the rule's own wins
        ("a text", True, "a text"),  # no object to add to: sent as it is
        ([1, 2], True, [1, 2]),
    ],
)
def test_attribution_is_added_to_an_object_data_unless_the_rule_says_not_to(
    data: object, attribute: bool, sent: object
) -> None:
    """Envoy's users ask to tell an injected error from a real one: ``data.acpFault`` says it,
    unless ``attribute: false``; a ``data`` that is not an object is never changed."""
    params = ErrorReply(action="error", data=data, attribute=attribute)
    reply, _ = ACTION.apply(params, fault())
    assert isinstance(reply, Reply)
    assert json.loads(reply.data)["error"].get("data") == sent


def test_only_requests_can_be_answered() -> None:
    """An answer or a notification is no request: the action does not apply to it."""
    params = ErrorReply(action="error")
    assert ACTION.applies(params, fault().subject)
    notification = fault(b'{"jsonrpc":"2.0","method":"session/update","params":{}}')
    answer = fault(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert not ACTION.applies(params, notification.subject)
    assert not ACTION.applies(params, answer.subject)


def test_an_answer_json_cannot_carry_is_refused_at_load() -> None:
    """The answer is written when the rule fires: what JSON cannot write is refused at load."""
    with pytest.raises(FaultFileError, match="cannot be written as JSON"):
        validate_rules([{"name": "e", "do": {"action": "error", "data": "\ud800"}}])
