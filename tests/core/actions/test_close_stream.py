"""``close_stream``: the SSE stream that would carry the message dies with it."""

from __future__ import annotations

from action_lab import fault

from proxy.core.actions.base import KillStream
from proxy.core.actions.close_stream import ACTION, CloseStream
from proxy.core.events import Direction


def test_the_stream_is_killed() -> None:
    """One effect: the stream dies, the message with it."""
    on_http = fault(downstream="http", direction=Direction.TO_CLIENT)
    assert ACTION.apply(CloseStream(action="close_stream"), on_http) == [KillStream()]


def test_only_a_message_to_an_http_client_travels_on_a_stream() -> None:
    """It applies to messages toward a Client on Streamable HTTP; it needs HTTP."""
    params = CloseStream(action="close_stream")
    assert ACTION.needs_http
    to_client = fault(downstream="http", direction=Direction.TO_CLIENT)
    assert ACTION.applies(params, to_client.subject)
    assert not ACTION.applies(params, fault(downstream="http").subject)
    assert not ACTION.applies(params, fault(downstream="ws", direction=Direction.TO_CLIENT).subject)
