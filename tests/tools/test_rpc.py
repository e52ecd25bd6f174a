"""The tools' JSON-RPC client (:mod:`proxy.tools.rpc`), against real peers: the scripted stdio
Agent (which writes whatever a test tells it to) and the reference Agent over WebSocket and
Streamable HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT, captured, encode, notification, raw_agent, reference_agent, say

from proxy.shell.transports.stdio import spawn_agent
from proxy.tools.rpc import Message, NoAnswer, Peer, connect
from proxy.tools.rpc import encode as encode_message

OpenPeer = Callable[..., Awaitable[Peer]]


@pytest.fixture
async def open_peer(tmp_path: Path) -> AsyncIterator[OpenPeer]:
    """A starter of Peers on the scripted Agent (``flags`` are its own; ``limit`` bounds one
    message); every one is closed at the end."""
    peers: list[Peer] = []

    async def _open(*flags: str, limit: int = 1 << 20, **options: Any) -> Peer:
        argv = raw_agent(tmp_path / f"capture-{len(peers)}", *flags)
        peer = Peer(await spawn_agent(argv, limit=limit, grace=TIMEOUT), **options)
        peers.append(peer)
        return peer

    yield _open
    for peer in peers:
        await peer.close(grace=TIMEOUT)


def tell(peer: Peer, line: bytes) -> None:
    """Write one raw line (a ``_test/...`` notification of the scripted Agent)."""
    peer.endpoint.send(line)


async def test_answers_settle_their_own_requests_in_any_order(open_peer: OpenPeer) -> None:
    """A held request answered after a later one: each future gets its own answer."""
    peer = await open_peer("--no-answer", "hold")
    held, held_answer = peer.request("hold", {})
    prompt = await peer.call("ping", {"n": 1}, TIMEOUT)
    assert prompt["result"]["method"] == "ping"
    assert not held_answer.done()
    tell(peer, say(encode({"jsonrpc": "2.0", "id": held, "result": {"late": True}})))
    async with asyncio.timeout(TIMEOUT):
        assert (await held_answer) == {"jsonrpc": "2.0", "id": held, "result": {"late": True}}


async def test_requests_of_the_peer_are_refused_unless_the_owner_says_not(
    open_peer: OpenPeer, tmp_path: Path
) -> None:
    """-32601 by default (the tools offer no capabilities); nothing at all with
    ``refuse_requests=False`` (check-agent); either way the owner sees the request."""
    for number, refuse in enumerate((True, False)):
        seen: list[Message] = []
        peer = await open_peer(on_message=seen.append, refuse_requests=refuse)
        asked = {"jsonrpc": "2.0", "id": "agent-1", "method": "fs/read_text_file", "params": {}}
        tell(peer, say(encode(asked)))
        assert await peer.until(lambda m: m.get("method") == "fs/read_text_file", TIMEOUT)
        await peer.call("ping", {}, TIMEOUT)  # the Agent has read what was sent before it
        read = [json.loads(line) for line in captured(tmp_path / f"capture-{number}")]
        refusals = [m for m in read if m.get("id") == "agent-1"]
        if refuse:
            assert refusals == [
                {
                    "jsonrpc": "2.0",
                    "id": "agent-1",
                    "error": {"code": -32601, "message": "method not found: fs/read_text_file"},
                }
            ]
        else:
            assert refusals == []
        assert asked in seen


async def test_what_is_not_an_object_or_answers_nothing_is_skipped(open_peer: OpenPeer) -> None:
    """Garbage, a non-object, an oversized line and answers to ids never sent (``"1"``, ``1.0``,
    ``true``) are skipped; the owner sees the objects, in order; the connection goes on."""
    seen: list[Message] = []
    peer = await open_peer("--no-answer", "hold", limit=4096, on_message=seen.append)
    held, held_answer = peer.request("hold", {})
    assert held == 1
    strays: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": "1", "result": {}},
        {"jsonrpc": "2.0", "id": 1.0, "result": {}},
        {"jsonrpc": "2.0", "id": True, "result": {}},
    ]
    lines = [b"not json", b"[1, 2]", b'{"pad": "' + b"x" * 8192 + b'"}']
    tell(peer, say(*lines, *map(encode, strays)))
    answer = await peer.call("ping", {}, TIMEOUT)
    assert [m for m in seen if m is not answer] == strays
    assert not held_answer.done()


async def test_the_end_of_the_connection_answers_everything_none(open_peer: OpenPeer) -> None:
    """Pending requests get ``None``, a call raises :class:`NoAnswer` saying the connection ended,
    waiters get ``None``; a request made afterwards is answered ``None`` at once."""
    peer = await open_peer("--no-answer", "hold")
    _, pending = peer.request("hold", {})
    waiting = asyncio.get_running_loop().create_task(peer.until(lambda m: False, TIMEOUT))
    tell(peer, notification("_test/exit", {"code": 0}))
    with pytest.raises(NoAnswer, match=r"^the connection ended during hold$") as raised:
        await peer.call("hold", {}, TIMEOUT)
    assert raised.value.ended
    assert peer.ended
    async with asyncio.timeout(TIMEOUT):
        assert (await pending, await waiting) == (None, None)
    _, after = peer.request("ping", {})
    assert after.done()
    assert after.result() is None


async def test_a_call_unanswered_in_time_raises_no_answer(open_peer: OpenPeer) -> None:
    """:class:`NoAnswer` names the method and the seconds waited; the connection stays open."""
    peer = await open_peer("--no-answer", "hold")
    with pytest.raises(NoAnswer, match=r"^no answer to hold in 0\.2 s$") as raised:
        await peer.call("hold", {}, 0.2)
    assert (raised.value.ended, raised.value.waited) == (False, 0.2)
    assert (await peer.call("ping", {}, TIMEOUT))["result"]["method"] == "ping"


async def test_until_waits_for_the_next_matching_message(open_peer: OpenPeer) -> None:
    """A notification the test makes the Agent send is handed to the waiter that wants it."""
    peer = await open_peer()
    update = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "S"}}
    waiting = asyncio.get_running_loop().create_task(
        peer.until(lambda m: m.get("method") == "session/update", TIMEOUT)
    )
    tell(peer, say(encode(update)))
    async with asyncio.timeout(TIMEOUT):
        assert await waiting == update


def test_encode_puts_the_version_first() -> None:
    """Every message the tools send carries ``"jsonrpc": "2.0"``."""
    assert encode_message({"id": 1, "result": {}}) == b'{"jsonrpc":"2.0","id":1,"result":{}}'


@pytest.mark.parametrize("scheme", ["ws", "http"])
async def test_connect_reaches_an_agent_by_url(scheme: str) -> None:
    """ws:// is a WebSocket, http:// Streamable HTTP: the reference Agent answers initialize."""
    async with reference_agent(f"{scheme}://127.0.0.1:0/acp") as url:
        peer = Peer(await connect(url, limit=1 << 20))
        try:
            answer = await peer.call("initialize", {"protocolVersion": 2}, TIMEOUT)
            assert answer["result"]["protocolVersion"] == 2
        finally:
            await peer.close(grace=TIMEOUT)


async def test_connect_refuses_other_schemes() -> None:
    """Only ws://, wss://, http:// and https:// are URLs of an Agent."""
    with pytest.raises(ValueError, match="expected a ws:// or http:// URL, got 'tcp://x:1'"):
        await connect("tcp://x:1", limit=1)
