"""One Client connection of check-agent (``proxy.tools.check_agent.conversation``), against the
scripted stdio Agent: what it has seen stays found, and a request without an answer fails the
trace naming why (the option to raise, or the connection closed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import TIMEOUT, encode, notification, raw_agent, say

from proxy.shell.transports.stdio import spawn_agent
from proxy.tools.check_agent.conversation import Conversation, answers
from proxy.tools.verdicts import Fail


@pytest.fixture
async def conversation(tmp_path: Path) -> AsyncIterator[Conversation]:
    """A conversation with the scripted Agent, which never answers ``hold``; 0.2 s of patience."""
    argv = raw_agent(tmp_path / "capture", "--no-answer", "hold")
    talk = Conversation(await spawn_agent(argv, limit=1 << 20, grace=TIMEOUT), 0.2)
    yield talk
    await talk.peer.close(grace=TIMEOUT)


async def test_a_message_seen_before_is_found_at_once(conversation: Conversation) -> None:
    """``until`` looks at what was already seen first: an answer read earlier is found."""
    first = conversation.submit("ping", {})
    second = await conversation.request("ping", {}, wait=TIMEOUT)
    assert second["id"] == first + 1
    found = await conversation.until(lambda m: answers(m, first), wait=0)
    assert found is not None
    assert found["result"] == {"method": "ping", "size": found["result"]["size"]}


async def test_no_answer_in_time_names_the_option_to_raise(conversation: Conversation) -> None:
    """The answer timeout by default, the start-up timeout when the trace gave its own wait."""
    with pytest.raises(Fail, match=r"^no answer to hold within 0\.2 s \(--answer-timeout\)$"):
        await conversation.request("hold", {})
    with pytest.raises(Fail, match=r"^no answer to hold within 0\.1 s \(--startup-timeout\)$"):
        await conversation.request("hold", {}, wait=0.1)


async def test_a_closed_connection_is_named_and_to_be_diagnosed(
    conversation: Conversation,
) -> None:
    """The Agent gone: the request fails saying the connection closed, and asks for the
    proxy's diagnosis."""
    conversation.peer.endpoint.send(notification("_test/exit", {"code": 0}))
    with pytest.raises(Fail, match=r"^no answer to hold: the connection closed$") as raised:
        await conversation.request("hold", {}, wait=TIMEOUT)
    assert raised.value.diagnose
    assert conversation.closed


async def test_user_messages_and_mentioned_keys_are_read_from_what_was_seen(
    conversation: Conversation,
) -> None:
    """The user messages of a session with a text, once each; the keys that came back."""

    def update(session: str, message_id: str, text: str) -> bytes:
        content = [{"type": "text", "text": text}]
        params = {"sessionUpdate": "user_message", "messageId": message_id, "content": content}
        return encode(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session, "update": params},
            }
        )

    conversation.peer.endpoint.send(
        say(
            update("S", "m1", "A"),
            update("S", "m1", "A"),
            update("S", "m2", "B"),
            update("T", "m3", "A"),
        )
    )
    await conversation.request("ping", {"key": "K-1"}, wait=TIMEOUT)
    assert conversation.user_messages("S", "A") == ["m1"]
    assert conversation.user_messages("S") == ["m1", "m2"]
    assert conversation.mentions(["K-1", "m3", "nowhere"]) == ["m3"]
