"""A bug costs the one message it was handling, never the link, and never goes unseen.

The relay is fuzzed (``tests/test_fuzz_*``) and no input is known to make it raise; the guard in
:meth:`proxy.shell.link.Link._feed` is there for the one nobody found yet. Here a relay that raises on
one marked message stands in for that bug, on a real link: the Client's pipes, a spawned Agent.
Likewise a background task of the HTTP upstream that dies of a bug ends its connection, loudly.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
from harness import TIMEOUT, captured, raw_agent, request
from peers.stalling import ScriptedHttpAgent

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Message
from proxy.core.relay import Relay
from proxy.shell.link import Link
from proxy.shell.log import configure_logging
from proxy.shell.observers import Fanout, Tally
from proxy.shell.transports.http_upstream import HttpUpstream
from proxy.shell.transports.stdio import open_client_stdio, spawn_agent

LIMIT = 1024 * 1024
BUG = b"_test/core-bug"


def buggy_relay() -> Relay:
    """A relay with a bug: it raises on any request naming :data:`BUG` (in the hook it asks of
    each request it forwards), and is otherwise the relay (the real one, compiled or not: the
    compiled core's classes take no stand-in)."""

    def meta_for(_direction: Direction, message: Message) -> list[tuple[str, str]]:
        if message.method == BUG.decode():
            raise RuntimeError("a bug in the core")
        return []

    return Relay(meta_for=meta_for)


async def test_a_raising_core_drops_one_message_and_the_link_goes_on(tmp_path: Path) -> None:
    log_path = tmp_path / "proxy.shell.log"
    capture = tmp_path / "agent-saw.jsonl"
    to_proxy_read, to_proxy_write = os.pipe()
    from_proxy_read, from_proxy_write = os.pipe()
    with log_path.open("w") as log_file:
        configure_logging("json", "info", log_file)
        try:
            client = await open_client_stdio(
                limit=LIMIT, stdin=to_proxy_read, stdout=from_proxy_write
            )
            os.close(to_proxy_read)
            os.close(from_proxy_write)
            agent = await spawn_agent(raw_agent(capture), limit=LIMIT)
            link = Link(
                lambda _cached: buggy_relay(),
                {Side.CLIENT: client, Side.AGENT: agent},
                Fanout([Tally()]),
            )
            running = asyncio.get_running_loop().create_task(link.run())
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_proxy_read, "rb", 0)
            )
            writer = os.fdopen(to_proxy_write, "wb", 0)
            # One write: the two arrive together, and the relay cannot say which one it failed
            # on until it is given each alone.
            writer.write(request(1, BUG.decode()) + b"\n" + request(2, "_test/after") + b"\n")
            answer = json.loads(await asyncio.wait_for(reader.readline(), TIMEOUT))
            assert answer["id"] == 2
            assert answer["result"]["method"] == "_test/after"
            assert not running.done()
            writer.close()  # the Client leaves: the link ends as usual
            await asyncio.wait_for(running, TIMEOUT)
        finally:
            configure_logging()
    seen = [json.loads(line)["method"] for line in captured(capture)]
    assert seen == ["_test/after"]  # the message the bug was on went nowhere
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    errors = [line for line in lines if line["event"].startswith("internal error")]
    assert len(errors) == 1, lines
    assert errors[0]["level"] == "error"
    assert errors[0]["event_type"] == "MessageReceived"
    assert "a bug in the core" in errors[0]["exception"]


class BuggyHttpUpstream(HttpUpstream):
    """An HTTP upstream with a bug: reading a message naming :data:`BUG` off a stream raises."""

    def _watch_sessions(self, message: Message) -> None:
        if BUG in message.raw:
            raise RuntimeError("a bug in the HTTP upstream")
        super()._watch_sessions(message)


async def test_a_failing_http_upstream_task_ends_the_connection_loudly(tmp_path: Path) -> None:
    """A background task of the HTTP upstream that dies of a bug is logged, and the connection
    ends (the link sees the Agent go) instead of leaving the relay waiting for ever."""
    log_path = tmp_path / "proxy.shell.log"
    with log_path.open("w") as log_file:
        configure_logging("json", "info", log_file)
        try:
            async with ScriptedHttpAgent() as agent:
                http = aiohttp.ClientSession()
                upstream = BuggyHttpUpstream(agent.url, http, limit=LIMIT)
                upstream.send(request(1, "initialize", {"protocolVersion": 2}))
                await upstream.drain()
                first = await asyncio.wait_for(upstream.receive(), TIMEOUT)
                assert isinstance(first, Message)
                assert json.loads(first.raw)["id"] == 1
                upstream.send(request(2, BUG.decode()))  # its answer comes on the stream
                assert await asyncio.wait_for(upstream.receive(), TIMEOUT) is None
                upstream.close()
                await asyncio.wait_for(upstream.wait_closed(), TIMEOUT)
                assert http.closed
        finally:
            configure_logging()
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    [failed] = [line for line in lines if line["event"].startswith("the connection to the agent")]
    assert failed["level"] == "error"
    assert failed["error"] == "a bug in the HTTP upstream"
