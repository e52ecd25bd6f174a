"""Peers that stall, for the proxy's timeout and shutdown tests: real loopback servers, run on the
test's own event loop.

Import it as ``from peers.stalling import ...``.

- :func:`silent_server`: accepts TCP connections and never writes a byte (a WebSocket handshake or
  an HTTP request sent to it is never answered).
- :func:`unaccepting_server`: a listening socket whose accept queue is full and never drained, so
  that a new TCP connection never completes (connect hangs until the caller gives up).
- :class:`ScriptedHttpAgent`: a Streamable HTTP Agent that answers ``initialize`` (200, with an
  ``Acp-Connection-Id``) and every other request (202, the answer on the connection stream),
  except the methods it is told to hang on; its DELETE and its streams (all, or the sessions'
  ones) can hang too, and its
  connection stream can end as soon as it is opened. It records the methods POSTed and the DELETEs received.
  It records the ``Acp-Session-Id`` of every POST and of every GET of a session's stream (which
  stays open and empty).
  It sets the cookies it is told to (on a method's POST answer, its stream, its WebSocket ``101``),
  records the ``Cookie`` header of every request, and serves the same answers over a WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from harness import TIMEOUT

__all__ = ["ScriptedHttpAgent", "silent_server", "unaccepting_server"]


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that accepts and stays silent; yields its port."""
    connections: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.read()  # until the peer gives up; nothing is ever written

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in connections:
            writer.close()
        await server.wait_closed()


@contextlib.contextmanager
def unaccepting_server() -> Iterator[int]:
    """A port on 127.0.0.1 where a TCP connect never completes: the listening socket's accept
    queue (backlog 0) is filled and never drained, so the kernel drops new SYNs."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(2):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            fillers.append(filler)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


NOT_JSON = "<not JSON>"
"""What :attr:`ScriptedHttpAgent.methods` records for a POST whose body is not JSON."""


@dataclass
class ScriptedHttpAgent:
    """A Streamable HTTP Agent on 127.0.0.1 (see the module); use as ``async with``."""

    hang_on: frozenset[str] = frozenset()
    """Methods whose POST is never answered."""
    hang_delete: bool = False
    hang_stream: bool = False
    """Never answer a GET (a stream is never opened)."""
    hang_session_streams: bool = False
    """Never answer the GET of a session's stream."""
    end_stream: bool = False
    """End the connection stream as soon as it is opened."""
    methods: list[str] = field(default_factory=list)
    """The method of every POST received, in order."""
    posted_sessions: list[str | None] = field(default_factory=list)
    """The ``Acp-Session-Id`` of every POST received, in order (``None``: none)."""
    session_streams: list[str] = field(default_factory=list)
    """The ``Acp-Session-Id`` of every GET of a session's stream, in order."""
    set_cookies: dict[str, str] = field(default_factory=dict)
    """A ``Set-Cookie`` value for the answer to a method's POST, to the connection stream's GET
    (key ``GET``) or to a WebSocket upgrade (key ``websocket``)."""
    cookies: list[str | None] = field(default_factory=list)
    """The ``Cookie`` header of every request, in order (``None``: none)."""
    post_chunks: list[int] = field(default_factory=list)
    """The HTTP chunks each POST's body came in, in order (1: not chunked)."""
    posted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever a POST is received."""
    deletes: int = 0
    url: str = ""
    _streams: dict[str, asyncio.Queue[bytes | None]] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def until_posted(self, count: int) -> None:
        """Wait until ``count`` POSTs have been received (``TIMEOUT`` at most)."""
        async with asyncio.timeout(TIMEOUT):
            while len(self.methods) < count:
                self.posted.clear()
                await self.posted.wait()

    async def __aenter__(self) -> ScriptedHttpAgent:
        app = web.Application()
        app.router.add_route("*", "/acp", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/acp"
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stopping.set()
        for queue in self._streams.values():
            queue.put_nowait(None)
        assert self._runner is not None
        await self._runner.cleanup()

    def _cookie(self, key: str | None) -> dict[str, str]:
        value = self.set_cookies.get(str(key))
        return {} if value is None else {"Set-Cookie": value}

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.cookies.append(request.headers.get("Cookie"))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        if request.method == "POST":
            return await self._post(request)
        if request.method == "GET":
            return await self._get(request)
        self.deletes += 1
        if self.hang_delete:
            await asyncio.Event().wait()
        queue = self._streams.get(request.headers.get("Acp-Connection-Id", ""))
        if queue is not None:
            queue.put_nowait(None)
        return web.Response(status=202)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        body, chunks = b"", 0
        async for data, _ in request.content.iter_chunks():
            body += data
            chunks += 1
        self.posted_sessions.append(request.headers.get("Acp-Session-Id"))
        self.post_chunks.append(chunks)
        self.posted.set()
        try:
            message: dict[str, Any] = json.loads(body)
        except ValueError:
            self.methods.append(NOT_JSON)
            return web.Response(status=400)
        method = message.get("method")
        self.methods.append(str(method))
        if method in self.hang_on:
            await asyncio.Event().wait()
        if method == "initialize":
            connection = uuid.uuid4().hex
            self._streams[connection] = asyncio.Queue()
            return web.json_response(
                _answer(message),
                headers={"Acp-Connection-Id": connection, **self._cookie(method)},
            )
        queue = self._streams.get(request.headers.get("Acp-Connection-Id", ""))
        if queue is None:
            return web.Response(status=404)
        if method is not None and "id" in message:
            queue.put_nowait(json.dumps(_answer(message)).encode())
        return web.Response(status=202, headers=self._cookie(method))

    async def _get(self, request: web.Request) -> web.StreamResponse:
        queue = self._streams.get(request.headers.get("Acp-Connection-Id", ""))
        if queue is None:
            return web.Response(status=404)
        if self.hang_stream:
            await asyncio.Event().wait()
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **self._cookie("GET")}
        )
        session = request.headers.get("Acp-Session-Id")
        if session is not None:
            self.session_streams.append(session)
            if self.hang_session_streams:
                await asyncio.Event().wait()
            await response.prepare(request)
            await self._stopping.wait()
            return response
        await response.prepare(request)
        if not self.end_stream:
            while (data := await queue.get()) is not None:
                await response.write(b"data: " + data + b"\n\n")
        await response.write_eof()
        return response

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        ws.headers.update(self._cookie("websocket"))
        await ws.prepare(request)
        async for frame in ws:
            message = json.loads(frame.data)
            if message.get("method") is not None and "id" in message:
                self.methods.append(str(message["method"]))
                await ws.send_str(json.dumps(_answer(message)))
        return ws


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request: ``initialize`` gets protocol version 2, others their method."""
    method = request.get("method")
    result = {"protocolVersion": 2} if method == "initialize" else {"method": method}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}
