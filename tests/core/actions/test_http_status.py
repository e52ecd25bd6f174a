"""``http_status``: the POST answered with a status; the message refused unless forwarded."""

from __future__ import annotations

from action_lab import fault

from proxy.core.actions.base import Now, Stop
from proxy.core.actions.http_status import ACTION, HttpStatus
from proxy.core.commands import FailPost
from proxy.core.events import Direction

SAID = '{"rule":"r","action":"http_status"}'


def test_the_post_fails_and_the_message_is_refused_or_forwarded() -> None:
    """Without ``forward`` the message stops (refused); with it, it goes on all the same. The
    answer says which rule made it (the ``Acp-Fault`` header), unless ``attribute: false``."""
    on_http = fault(downstream="http")
    refused = HttpStatus(action="http_status", status=503)
    assert ACTION.apply(refused, on_http) == [Now(FailPost(503, SAID)), Stop("refused")]
    forwarded = HttpStatus(action="http_status", status=502, forward=True)
    assert ACTION.apply(forwarded, on_http) == [Now(FailPost(502, SAID))]
    unattributed = HttpStatus(action="http_status", status=502, attribute=False)
    assert ACTION.apply(unattributed, on_http) == [Now(FailPost(502)), Stop("refused")]


def test_the_attribution_is_one_ascii_line_whatever_the_rule_is_called() -> None:
    """A header value: a rule named with non-ASCII text or a line break is escaped (JSON)."""
    params = HttpStatus(action="http_status", status=503)
    [now, _] = ACTION.apply(params, fault(downstream="http", rule="é\r\nX-Evil: 1"))
    assert isinstance(now, Now)
    assert isinstance(now.command, FailPost)
    said = now.command.attribution
    assert said == '{"rule":"\\u00e9\\r\\nX-Evil: 1","action":"http_status"}'
    assert said.isascii()


def test_only_a_post_from_an_http_client_can_fail() -> None:
    """It applies to messages from a Client on Streamable HTTP, nothing else; it needs HTTP."""
    params = HttpStatus(action="http_status", status=500)
    assert ACTION.needs_http
    assert ACTION.applies(params, fault(downstream="http").subject)
    assert not ACTION.applies(params, fault(downstream="stdio").subject)
    assert not ACTION.applies(params, fault(downstream="ws").subject)
    to_client = fault(downstream="http", direction=Direction.TO_CLIENT)
    assert not ACTION.applies(params, to_client.subject)
