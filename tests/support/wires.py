"""A test Client's wire to the proxy, the same on every transport: one JSON-RPC line in, one out.

``client_wire`` opens one over stdio (a proxy process spawned with the Agent behind it), WebSocket
or Streamable HTTP (the listener's URL); every ``Wire`` sends and receives whole messages as
compact JSON lines, so that a test is written once and run on each transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
from harness import TIMEOUT, ProxyProcess
from listener_client import Http, SseStream, compact, small_receive_buffer
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect


class Wire(Protocol):
    """Whole messages to and from the proxy."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    def pause(self) -> None:
        """Read nothing more from the proxy until :meth:`resume` (or :meth:`receive`)."""

    def resume(self) -> None: ...


@dataclass
class StdioWire:
    """The proxy's stdin and stdout (lines of any length, whatever the reader's limit)."""

    proxy: ProxyProcess
    _buffer: bytearray = field(default_factory=bytearray)

    async def send(self, data: bytes) -> None:
        await self.proxy.send(data)

    async def receive(self) -> bytes:
        stdout = self.proxy.process.stdout
        assert stdout is not None
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            chunk = await asyncio.wait_for(stdout.read(1 << 16), TIMEOUT)
            assert chunk, f"stdout ended; stderr: {self.proxy.stderr}"
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def pause(self) -> None:
        """Nothing to do: the pipe is read only in :meth:`receive`."""

    def resume(self) -> None:
        """Nothing to do."""


@dataclass
class WsWire:
    """A WebSocket: one message per text frame."""

    ws: ClientConnection

    async def send(self, data: bytes) -> None:
        await self.ws.send(data.decode())

    async def receive(self) -> bytes:
        frame = await asyncio.wait_for(self.ws.recv(), TIMEOUT)
        assert isinstance(frame, str)
        return frame.encode()

    def pause(self) -> None:
        """Nothing to do: past its queue of frames the client reads only in :meth:`receive`."""

    def resume(self) -> None:
        """Nothing to do."""


@dataclass
class HttpWire:
    """Streamable HTTP: a POST per message (in order, each taken before the next), one SSE stream."""

    http: Http
    connection: str
    stream: SseStream

    async def send(self, data: bytes) -> None:
        reply = await self.http.post(data, connection=self.connection)
        assert reply.status == 202, reply

    async def receive(self) -> bytes:
        self.resume()
        return await self.stream.next()

    def pause(self) -> None:
        """The stream's reading task stops reading the socket."""
        self.stream.reading.clear()

    def resume(self) -> None:
        self.stream.reading.set()


INITIALIZE = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}}


@contextlib.asynccontextmanager
async def client_wire(
    transport: str, proxy: ProxyProcess, url: str, *, small_buffers: bool = False
) -> AsyncIterator[Wire]:
    """The Client's connection over ``transport``, past ``initialize``.

    ``small_buffers``: a socket receive buffer of 64 KiB (no autotuning) and a WebSocket queue of
    one frame, so that a Client that does not read soon holds the proxy back.
    """
    if transport == "stdio":
        wire = StdioWire(proxy)
        await wire.send(compact(INITIALIZE))
        assert json.loads(await wire.receive())["id"] == "init"
        yield wire
    elif transport == "ws":
        sock = await small_socket(url) if small_buffers else None
        queue = 1 if small_buffers else 16
        async with ws_connect(
            url, sock=sock, proxy=None, max_size=None, max_queue=queue, compression=None
        ) as ws:
            ws_wire = WsWire(ws)
            await ws_wire.send(compact(INITIALIZE))
            assert json.loads(await ws_wire.receive())["id"] == "init"
            yield ws_wire
    else:
        connector = aiohttp.TCPConnector(
            socket_factory=small_receive_buffer if small_buffers else None
        )
        async with aiohttp.ClientSession(connector=connector) as session:
            http = Http(session, url)
            connection = await http.initialize()
            async with http.stream(connection) as stream:
                yield HttpWire(http, connection, stream)


async def small_socket(url: str) -> socket.socket:
    """A socket connected to ``url``'s host and port, with a small fixed receive buffer."""
    host, port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, (host, int(port))), TIMEOUT
        )
    except BaseException:
        sock.close()
        raise
    return sock
