"""Stalled and slow peers: the proxy's memory stays bounded and the writer is held back.

A real proxy process sits between the test (the Client, over stdio, WebSocket or Streamable HTTP
with its SSE stream) and ``peers/flood_agent.py`` (spawned over stdio, or serving WebSocket or
Streamable HTTP). One side stops reading while the other writes :data:`FLOOD` bytes, many times
what the proxy may hold. The proxy must log ``peer stalled`` for the side that stopped (once), hold
the writer back (its writes stop completing: it has not finished when the stall is logged), keep
its resident memory within :data:`BOUND` of what it was before the flood (``VmRSS`` and the peak,
``VmHWM``, from ``/proc``), and once the reader reads again deliver every message intact, in
order, and log ``peer resumed``. Delayed messages held by the proxy's timers are bounded the same
way. A Client, or an Agent, that reads one byte at a time still gets every message intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from floods import (
    BOUND,
    COUNT,
    FLOOD_AGENT,
    SIZE,
    Setup,
    delaying_fault_file,
    ended,
    flood,
    memory,
    network_agent,
    setup,
    written,
)
from harness import TIMEOUT, ProxyProcess, log_events
from listener_client import compact
from peers.flood_agent import flood_item
from wires import Wire, client_wire

from proxy.shell.endpoint import joined


async def client_stalls(s: Setup, side: str) -> None:
    """The Agent floods; the Client reads nothing until the stall is logged, then everything."""
    before = memory(s.proxy)
    s.wire.pause()
    await s.wire.send(flood(count=COUNT, size=SIZE))
    stalled = await s.proxy.logged("peer stalled")
    held_back = written(s.agent_logs)
    grown = memory(s.proxy) - before
    assert stalled["side"] == "client"
    assert stalled["transport"] == side
    assert held_back < COUNT - 1, "the Agent wrote everything to a Client that reads nothing"
    assert grown < BOUND, f"{grown} bytes more held for a Client that reads nothing"
    for n in range(COUNT):
        assert await s.wire.receive() == flood_item(n, SIZE)
    await s.proxy.logged("peer resumed")
    assert memory(s.proxy, "VmHWM") - before < BOUND
    assert len(log_events(s.proxy.stderr, "peer stalled")) == 1


CLIENT_STALLS = [
    ("stdio", "stdio"),
    ("ws", "stdio"),
    ("http", "stdio"),
    ("stdio", "ws"),
    ("stdio", "http"),
]
"""(Client's transport, Agent's transport): each way toward a Client, each way from an Agent."""


@pytest.mark.parametrize(("downstream", "upstream"), CLIENT_STALLS)
async def test_a_client_that_stops_reading_holds_the_agent_back(
    downstream: str, upstream: str
) -> None:
    """The Agent floods a Client that reads nothing: bounded memory, the Agent held back, a log
    line; then the Client reads everything, intact and in order."""
    async with setup(downstream, upstream) as s:
        await client_stalls(s, downstream)


@pytest.mark.parametrize("downstream", ["stdio", "ws"])
async def test_delayed_messages_toward_a_client_that_stops_reading_are_bounded(
    downstream: str, tmp_path: Path
) -> None:
    """Every item delayed: what the timers hold and what they release toward a Client that
    reads nothing is bounded, as without the delay."""
    async with setup(downstream, "stdio", "--faults", delaying_fault_file(tmp_path, 50)) as s:
        await client_stalls(s, downstream)


async def test_delayed_messages_hold_the_agent_back_past_their_bound(tmp_path: Path) -> None:
    """Every item delayed for longer than the test lasts, toward a Client ready to read: once
    the timers hold more than their bound (logged) the proxy reads no more, so the Agent is held
    back and the proxy's memory stays bounded."""
    async with setup("stdio", "stdio", "--faults", delaying_fault_file(tmp_path, 600_000)) as s:
        before = memory(s.proxy)
        await s.wire.send(flood(count=COUNT, size=SIZE))
        held = await s.proxy.logged("delayed messages hold too much; reading waits for them")
        assert held["held_bytes"] > held["bound"]
        assert written(s.agent_logs) < COUNT - 1, "the Agent wrote everything into the timers"
        assert memory(s.proxy) - before < BOUND


AGENT_STALLS = [
    ("stdio", "stdio"),
    ("ws", "stdio"),
    ("http", "stdio"),
    ("stdio", "ws"),
    ("stdio", "http"),
]
"""Each way from a Client, each way toward an Agent."""


@pytest.mark.parametrize(("downstream", "upstream"), AGENT_STALLS)
async def test_an_agent_that_stops_reading_holds_the_client_back(
    downstream: str, upstream: str
) -> None:
    """The Client floods an Agent that reads nothing: bounded memory, the Client's writes stop
    completing, a log line; then the Agent reads everything, intact and in order."""
    async with setup(downstream, upstream) as s:
        before = memory(s.proxy)
        await s.wire.send(compact({"jsonrpc": "2.0", "method": "_flood/stall"}))
        await s.agent_logs.logged("agent stopped reading")

        async def write_flood() -> None:
            for n in range(COUNT):
                await s.wire.send(flood_item(n, SIZE))

        async with asyncio.TaskGroup() as tasks:
            flooding = tasks.create_task(write_flood())
            stalled = await s.proxy.logged("peer stalled")
            grown = memory(s.proxy) - before
            assert stalled["side"] == "agent"
            assert stalled["transport"] == upstream
            assert not flooding.done(), "the Client wrote everything to an Agent that reads nothing"
            assert grown < BOUND, f"{grown} bytes more held for an Agent that reads nothing"
            os.kill(s.agent_pid, signal.SIGUSR1)
        await s.wire.send(compact({"jsonrpc": "2.0", "id": "count", "method": "_flood/count"}))
        answer = json.loads(await s.wire.receive())
        assert answer["result"] == {"received": COUNT, "intact": True}
        await s.proxy.logged("peer resumed")
        assert memory(s.proxy, "VmHWM") - before < BOUND
        assert len(log_events(s.proxy.stderr, "peer stalled")) == 1


# -- a Client that reads one byte at a time -------------------------------------------------------

SIZES = [1, 90, 3000, 70_000, 5, 150_000, 40_000, 17]
"""Item sizes: a few bytes, and more than a pipe or a socket buffer takes at once."""


class ByteStdioWire:
    """The proxy's stdout read one byte per ``read`` (in a thread); its stdin as usual."""

    def __init__(self, proxy: ProxyProcess, fd: int) -> None:
        self.proxy = proxy
        loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()

        def read() -> None:
            line = bytearray()
            while byte := os.read(fd, 1):
                line += byte
                if byte == b"\n":
                    loop.call_soon_threadsafe(self._lines.put_nowait, bytes(line[:-1]))
                    line.clear()
            os.close(fd)

        threading.Thread(target=read, daemon=True).start()

    async def send(self, data: bytes) -> None:
        await self.proxy.send(data)

    async def receive(self) -> bytes:
        return await asyncio.wait_for(self._lines.get(), TIMEOUT)

    def pause(self) -> None:
        """Never paused."""

    def resume(self) -> None:
        """Never paused."""


@contextlib.contextmanager
def byte_by_byte(target: str, *, toward_target: bool = False) -> Iterator[str]:
    """A TCP relay in front of ``target`` (a URL) that reads what ``target`` sends (the proxy's
    listener), or with ``toward_target`` what is sent to it (by the proxy, to an Agent), one byte
    per ``recv``, with a small receive buffer; yields the URL to use instead."""
    scheme, rest = target.split("://", 1)
    address, path = rest.split("/", 1)
    host, port = address.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    sockets = [listener]

    def copy(source: socket.socket, destination: socket.socket, chunk: int) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(chunk):
                destination.sendall(data)
            destination.shutdown(socket.SHUT_WR)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                slow = client if toward_target else upstream
                slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                upstream.connect((host, int(port)))
                sockets.extend((client, upstream))
                up, down = (1, 1 << 16) if toward_target else (1 << 16, 1)
                for args in ((client, upstream, up), (upstream, client, down)):
                    threading.Thread(target=copy, args=args, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"{scheme}://127.0.0.1:{listener.getsockname()[1]}/{path}"
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize("downstream", ["stdio", "ws", "http"])
async def test_a_client_that_reads_one_byte_at_a_time_gets_every_message_intact(
    downstream: str,
) -> None:
    """Messages from a few bytes to more than a buffer's worth, with characters of several
    bytes and escapes, all cut at every byte on their way: each arrives whole, in order."""
    async with contextlib.AsyncExitStack() as stack:
        listen = [] if downstream == "stdio" else ["--listen", f"{downstream}://127.0.0.1:0/acp"]
        read_end, write_end = os.pipe() if downstream == "stdio" else (-1, -1)
        proxy = await ProxyProcess.start(
            FLOOD_AGENT,
            "--log-format",
            "json",
            *listen,
            stdout=write_end if downstream == "stdio" else asyncio.subprocess.PIPE,
        )
        await stack.enter_async_context(ended(proxy))
        wire: Wire
        if downstream == "stdio":
            os.close(write_end)
            wire = ByteStdioWire(proxy, read_end)
            await wire.send(compact({"jsonrpc": "2.0", "id": 0, "method": "initialize"}))
            assert json.loads(await wire.receive())["id"] == 0
        else:
            url = stack.enter_context(byte_by_byte((await proxy.logged("listening"))["url"]))
            wire = await stack.enter_async_context(client_wire(downstream, proxy, url))
        await wire.send(flood(sizes=SIZES))
        for n, size in enumerate(SIZES):
            assert await wire.receive() == flood_item(n, size)


@pytest.mark.parametrize("upstream", ["stdio", "ws", "http"])
async def test_an_agent_that_reads_one_byte_at_a_time_gets_every_message_intact(
    upstream: str,
) -> None:
    """The same toward the Agent: one that reads one byte per ``read`` (stdio), or behind a
    connection read one byte per ``recv`` (WebSocket, Streamable HTTP), gets every item whole
    and in order."""
    async with contextlib.AsyncExitStack() as stack:
        agent, options = [*FLOOD_AGENT, "--byte-reads"], []
        if upstream != "stdio":
            _remote, url = await stack.enter_async_context(network_agent(upstream))
            agent, options = (
                [],
                ["--upstream", stack.enter_context(byte_by_byte(url, toward_target=True))],
            )
        proxy = await ProxyProcess.start(agent, "--log-format", "json", *options)
        await stack.enter_async_context(ended(proxy))
        wire = await stack.enter_async_context(client_wire("stdio", proxy, ""))
        for n, size in enumerate(SIZES):
            await wire.send(flood_item(n, size))
        await wire.send(compact({"jsonrpc": "2.0", "id": "count", "method": "_flood/count"}))
        answer = json.loads(await wire.receive())
        assert answer["result"] == {"received": len(SIZES), "intact": True}


async def test_a_large_body_is_joined_while_the_event_loop_goes_on() -> None:
    """The chunks of a body of many MB are joined into one message by a thread (CPython lets go
    of the interpreter for such a copy): other links go on meanwhile. A small one is joined in
    place, where a thread's round trip would cost more than the copy."""
    chunks = [bytes([n]) * (1 << 20) for n in range(64)]
    turns = 0
    joining = True

    async def count_turns() -> None:
        nonlocal turns
        while joining:
            turns += 1
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(count_turns())
        await asyncio.sleep(0)
        turns = 0
        whole = await joined(chunks, 64 << 20)
        during_large = turns
        small = await joined([b'{"a":', b"1}"], 6)
        joining = False
    assert whole == b"".join(chunks)
    assert small == b'{"a":1}'
    assert during_large > 1, "the loop stood still while the body was joined"
