"""The WebSocket columns' parts (``proxy.tools.bench.ws_relay``, ``ws_driver``, ``ws_targets``)
on real loopback sockets: the bare ``websockets`` relay copies every message both ways, the
blocking Client reads whole streams and checks every answer, and a target that misbehaves is a
``BenchError``, never a hang. No figure is compared to a limit."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from harness import TIMEOUT
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from proxy.tools.bench import BenchOptions
from proxy.tools.bench.processes import BenchError, Server, listening_url
from proxy.tools.bench.ws_driver import BlockingWsPeer
from proxy.tools.bench.ws_targets import ws_agent_argv, ws_target_argv

WS_RELAY = [sys.executable, "-m", "proxy.tools.bench.ws_relay"]


@pytest.fixture
async def agent() -> AsyncIterator[Server]:
    """The WebSocket bench Agent, listening."""
    server = await Server.start(ws_agent_argv(sys.executable))
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def relay(agent: Server) -> AsyncIterator[Server]:
    """The bare ``websockets`` relay, in front of the Agent."""
    server = await Server.start([*WS_RELAY, agent.url])
    try:
        yield server
    finally:
        await server.stop()


async def test_the_relay_copies_every_message_both_ways_on_its_own_upstream(
    relay: Server,
) -> None:
    """Two Clients through one relay, each on an upstream connection of its own: a notification
    gets nothing, a stream's updates come before its answer, every answer is its request's."""
    async with asyncio.timeout(TIMEOUT):
        async with connect(relay.url) as one, connect(relay.url) as two:
            await one.send('{"jsonrpc":"2.0","method":"_bench/noise","params":{}}')
            for number, link in enumerate((one, two)):
                ping = {"jsonrpc": "2.0", "id": 5, "method": "_bench/ping", "params": {"n": number}}
                await link.send(json.dumps(ping))
                answer = await link.recv()
                assert isinstance(answer, str)  # text stays text
                assert json.loads(answer)["result"] == {"ok": True, "echo": {"n": number}}
            stream = {"jsonrpc": "2.0", "id": 6, "method": "_bench/stream", "params": {"count": 3}}
            await two.send(json.dumps(stream))
            received = [json.loads(await two.recv()) for _ in range(4)]
    texts = [m["params"]["update"]["content"]["text"] for m in received[:3]]
    assert texts == ["chunk 0", "chunk 1", "chunk 2"]
    assert received[3] == {"jsonrpc": "2.0", "id": 6, "result": {"sent": 3}}


async def test_the_blocking_client_reads_whole_streams_through_the_relay(relay: Server) -> None:
    """Pings, 64 KiB prompts and streams of 0, 1 and 5,000 notifications, one after another on
    one WebSocket: each answer is its request's, nothing is left over for the next."""

    def drive() -> None:
        peer = BlockingWsPeer(relay.url)
        try:
            assert peer.call("_bench/ping", {}) > 0
            for count in (0, 1, 5000, 3):
                received, seconds = peer.stream(count)
                assert (received, seconds > 0) == (count, True)
            assert peer.call("session/prompt", {"text": "x" * 65536}) > 0
        finally:
            peer.close()

    await asyncio.wait_for(asyncio.to_thread(drive), TIMEOUT)


Handler = Callable[[ServerConnection], Awaitable[None]]


async def _wrong_id(connection: ServerConnection) -> None:
    await connection.recv()
    await connection.send('{"jsonrpc":"2.0","id":7,"result":{}}')
    await connection.wait_closed()


async def _failed(connection: ServerConnection) -> None:
    await connection.recv()
    await connection.send('{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}')
    await connection.wait_closed()


async def _closes(connection: ServerConnection) -> None:
    await connection.recv()
    await connection.close(1011, "agent broke")


async def _too_few(connection: ServerConnection) -> None:
    await connection.recv()
    await connection.send('{"jsonrpc":"2.0","method":"other"}')
    await connection.send('{"jsonrpc":"2.0","id":1,"result":{}}')
    await connection.wait_closed()


@pytest.mark.parametrize(
    ("handler", "stream", "error"),
    [
        (_wrong_id, False, "expected the answer to 1"),
        (_failed, False, "request 1 failed"),
        (_closes, False, "closed the WebSocket: received 1011 .* agent broke"),
        (_too_few, True, "asked for 1 notifications, got 0"),
    ],
    ids=["wrong id", "error", "closed", "too few updates"],
)
async def test_a_websocket_target_that_misbehaves_is_a_bench_error(
    handler: Handler, stream: bool, error: str
) -> None:
    """The Client on its thread, a scripted server on the test's event loop."""
    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]

        def drive() -> None:
            peer = BlockingWsPeer(f"ws://127.0.0.1:{port}/acp")
            workload = (
                (lambda: peer.stream(1)) if stream else (lambda: peer.call("_bench/ping", {}))
            )
            try:
                with pytest.raises(BenchError, match=error):
                    workload()
            finally:
                peer.close()

        await asyncio.wait_for(asyncio.to_thread(drive), TIMEOUT)


async def test_the_client_answers_pings_and_joins_fragments() -> None:
    """A server that pings the Client before answering, and sends the answer in three
    fragments: the ping is answered (else the server never answers), the fragments are one
    answer, and a stream of one notification after it is counted."""

    async def pings_then_fragments(connection: ServerConnection) -> None:
        await connection.recv()
        await asyncio.wait_for(await connection.ping(b"are you there"), TIMEOUT)
        await connection.send(['{"jsonrpc":"2.0",', '"id":1,', '"result":{}}'])
        await connection.recv()
        await connection.send('{"jsonrpc":"2.0","method":"session/update","params":{}}')
        await connection.send('{"jsonrpc":"2.0","id":2,"result":{"sent":1}}')
        await connection.wait_closed()

    async with serve(pings_then_fragments, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]

        def drive() -> None:
            peer = BlockingWsPeer(f"ws://127.0.0.1:{port}/acp")
            try:
                assert peer.call("_bench/ping", {}) > 0
                assert peer.stream(1)[0] == 1
            finally:
                peer.close()

        await asyncio.wait_for(asyncio.to_thread(drive), TIMEOUT)


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"\x81\x82abcd\x1a\x1b", "sent a frame no server sends"),  # masked
        (b"\xc1\x01x", "sent a frame no server sends"),  # RSV1 without an extension
        (b"\x88\x02\x03\xe8", r"closed the WebSocket: received 1000 \(OK\)"),
        (b"\x88\x02\x00\x01", r"closed the WebSocket: received close b'\\x00\\x01'"),
    ],
    ids=["masked", "rsv1", "close", "close with a code no one sends"],
)
async def test_a_frame_no_server_sends_or_a_close_is_a_bench_error(
    frame: bytes, error: str
) -> None:
    """Frames written raw on the server's transport, where the answer should be."""

    async def raw(connection: ServerConnection) -> None:
        await connection.recv()
        connection.transport.write(frame)
        await connection.wait_closed()

    async with serve(raw, "127.0.0.1", 0, close_timeout=1) as server:
        port = next(iter(server.sockets)).getsockname()[1]

        def drive() -> None:
            peer = BlockingWsPeer(f"ws://127.0.0.1:{port}/acp")
            try:
                with pytest.raises(BenchError, match=error):
                    peer.call("_bench/ping", {})
            finally:
                peer.close()

        await asyncio.wait_for(asyncio.to_thread(drive), TIMEOUT)


def test_no_websocket_there_is_an_error_the_run_reports() -> None:
    """A refused connection is an ``OSError``, which the run reports as the target's error."""
    with pytest.raises(ConnectionRefusedError):
        BlockingWsPeer("ws://127.0.0.1:1/acp")


async def test_a_refused_handshake_is_a_bench_error() -> None:
    """An HTTP server that answers the upgrade with 403 (as the proxy answers a foreign
    ``Origin``): the handshake's failure, said."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(BenchError, match=r"no WebSocket to .*: InvalidStatus: .*403"):
            await asyncio.wait_for(
                asyncio.to_thread(BlockingWsPeer, f"ws://127.0.0.1:{port}/acp"), TIMEOUT
            )


def test_mitmproxy_runs_in_reverse_mode_on_loopback_and_says_where() -> None:
    """The mitmproxy column's command, and the URL read from mitmproxy's listening line."""
    options = BenchOptions(python="py", mitmdump="/opt/mitmdump")
    argv = ws_target_argv("mitmproxy", options, "ws://127.0.0.1:4321/acp")
    assert argv is not None
    assert argv[:3] == ["/opt/mitmdump", "--mode", "reverse:http://127.0.0.1:4321"]
    assert argv[argv.index("--listen-host") + 1] == "127.0.0.1"
    line = b"[12:00:00.000] Reverse proxy to http://127.0.0.1:4321 listening at 127.0.0.1:5678.\n"
    assert listening_url(line) == "ws://127.0.0.1:5678/acp"
    assert ws_target_argv("direct", options, "ws://x") is None
    assert ws_target_argv("websockets", options, "ws://x")[-2:] == [  # type: ignore[index]
        "proxy.tools.bench.ws_relay",
        "ws://x",
    ]
