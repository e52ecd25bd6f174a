"""A test Client of the proxy's network listener: Streamable HTTP and WebSocket spoken by hand.

``Http`` and ``SseStream`` speak Streamable HTTP with a bare ``aiohttp.ClientSession`` (every header
under the test's control), ``ws_initialize``/``ws_probe`` the WebSocket side, ``serving`` starts a
proxy process listening on loopback with the scripted raw Agent behind it; the JSON-RPC builders
(``request``, ``notification``, ``say``, ``compact``) write the messages.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from harness import SDK_AGENT, TIMEOUT, ProxyProcess, captured, raw_agent
from peers.sdk_remote_client import listening_proxy
from websockets.asyncio.client import ClientConnection

HTTP_LISTEN = "http://127.0.0.1:0/acp"
WS_LISTEN = "ws://127.0.0.1:0/acp"
CONNECTION_ID = "Acp-Connection-Id"
SESSION_ID = "Acp-Session-Id"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"
SESSION_SCOPED = [
    "session/prompt",
    "session/cancel",
    "session/close",
    "session/set_config_option",
    "session/set_mode",
]
NOTIFICATIONS = {"session/cancel"}
SILENCE = 1.0
"""Seconds a test watches for a message that must *not* come (backpressure only)."""


def compact(message: Any) -> bytes:
    """``message`` serialised compactly, as the SDKs write it."""
    return json.dumps(message, separators=(",", ":")).encode()


def request(id_: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-RPC request."""
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-RPC notification."""
    return {"jsonrpc": "2.0", "method": method, "params": params or {}}


def say(*lines: bytes) -> dict[str, Any]:
    """The raw Agent's ``_test/say``: it writes each of ``lines`` to its stdout as given."""
    return notification("_test/say", {"b64": [base64.b64encode(line).decode() for line in lines]})


def padded(message: dict[str, Any], size: int) -> bytes:
    """``message`` with a ``params.pad`` string that makes it exactly ``size`` bytes long."""
    message = {**message, "params": {**message["params"], "pad": ""}}
    message["params"]["pad"] = "x" * (size - len(compact(message)))
    data = compact(message)
    assert len(data) == size
    return data


@dataclass
class Reply:
    """What the proxy answered to one plain HTTP request."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)


class SseStream:
    """One GET's event stream, read by a task; checks the framing of every event it sees.

    ``reading`` gates the task (clear it and the stream is no longer read, so the proxy's writes
    to it back up); ``received`` counts the bytes read so far.
    """

    def __init__(self, response: aiohttp.ClientResponse, *, reading: bool = True) -> None:
        self.response = response
        self.reading = asyncio.Event()
        if reading:
            self.reading.set()
        self.received = 0
        self.raw = bytearray()
        self.keep_raw = True
        self._events: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        buffer = bytearray()
        try:
            while True:
                await self.reading.wait()
                chunk = await self.response.content.readany()
                if not chunk:
                    break
                self.received += len(chunk)
                if self.keep_raw:
                    self.raw += chunk
                searched = max(0, len(buffer) - 1)
                buffer += chunk
                start = 0
                while (end := buffer.find(b"\n\n", max(start, searched))) >= 0:
                    block = bytes(buffer[start:end])
                    start = end + 2
                    if not block.startswith(b":"):  # a comment: keep-alive
                        self._events.put_nowait(block)
                del buffer[:start]
        except aiohttp.ClientError:
            pass
        finally:
            self._events.put_nowait(None)

    async def next(self) -> bytes:
        """The data of the next event: exactly one ``data: `` line, no other field."""
        block = await asyncio.wait_for(self._events.get(), TIMEOUT)
        assert block is not None, "the stream ended"
        assert block.startswith(b"data: "), block[:200]
        assert b"\n" not in block, block[:200]
        assert b"\r" not in block, block[:200]
        return block.removeprefix(b"data: ")

    async def next_json(self) -> Any:
        """The next event's message, parsed."""
        return json.loads(await self.next())

    async def ended(self) -> None:
        """Wait until the proxy ends the stream (no event may come before)."""
        block = await asyncio.wait_for(self._events.get(), TIMEOUT)
        assert block is None, f"an event instead of the end: {block[:200]!r}"

    async def close(self) -> None:
        """Stop reading and drop the connection."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.response.close()


class Http:
    """Raw Streamable HTTP requests to the proxy's endpoint."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def post(
        self,
        body: bytes | dict[str, Any] | list[Any],
        *,
        connection: str | None = None,
        session: str | None = None,
        content_type: str | None = JSON,
        extra: dict[str, str] | None = None,
    ) -> Reply:
        """POST ``body`` (a dict is serialised) with the given ACP headers (and ``extra``)."""
        data = body if isinstance(body, bytes) else compact(body)
        headers = {**self._headers(connection, session), **(extra or {})}
        skip = []
        if content_type is None:
            skip.append("Content-Type")
        else:
            headers["Content-Type"] = content_type
        async with asyncio.timeout(TIMEOUT):
            async with self.session.post(
                self.url, data=data, headers=headers, skip_auto_headers=skip
            ) as response:
                return Reply(response.status, dict(response.headers), await response.read())

    async def initialize(self, id_: Any = "init") -> str:
        """Open a connection with ``initialize``; its ``Acp-Connection-Id``."""
        reply = await self.post(request(id_, "initialize", {"protocolVersion": 1}))
        assert reply.status == 200, reply
        return reply.headers[CONNECTION_ID]

    async def get(
        self,
        *,
        connection: str | None,
        session: str | None = None,
        accept: str | None = EVENT_STREAM,
    ) -> Reply:
        """A GET that is expected to be refused (its whole body is read)."""
        headers = self._headers(connection, session)
        if accept is not None:
            headers["Accept"] = accept
        skip = [] if accept is not None else ["Accept"]
        async with asyncio.timeout(TIMEOUT):
            async with self.session.get(
                self.url, headers=headers, skip_auto_headers=skip
            ) as response:
                return Reply(response.status, dict(response.headers), await response.read())

    async def delete(self, *, connection: str | None) -> Reply:
        """DELETE the connection."""
        async with asyncio.timeout(TIMEOUT):
            async with self.session.delete(
                self.url, headers=self._headers(connection, None)
            ) as response:
                return Reply(response.status, dict(response.headers), await response.read())

    @contextlib.asynccontextmanager
    async def stream(
        self,
        connection: str,
        session: str | None = None,
        *,
        reading: bool = True,
        client: aiohttp.ClientSession | None = None,
    ) -> AsyncIterator[SseStream]:
        """An open SSE stream (the GET answered 200); closed on exit."""
        headers = self._headers(connection, session)
        headers["Accept"] = EVENT_STREAM
        async with asyncio.timeout(TIMEOUT):
            response = await (client or self.session).get(self.url, headers=headers)
        stream = SseStream(response, reading=reading)
        try:
            assert response.status == 200, (response.status, await response.read())
            yield stream
        finally:
            await stream.close()

    @staticmethod
    def _headers(connection: str | None, session: str | None) -> dict[str, str]:
        headers = {}
        if connection is not None:
            headers[CONNECTION_ID] = connection
        if session is not None:
            headers[SESSION_ID] = session
        return headers


@dataclass
class Setup:
    """A running proxy, its URL, an HTTP client for it, and the raw Agent's capture file."""

    proxy: ProxyProcess
    url: str
    http: Http
    capture: Path

    def ws_url(self) -> str:
        """The same endpoint with the ``ws`` scheme."""
        return "ws" + self.url.removeprefix("http")


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, *options: str, listen: str = HTTP_LISTEN, sdk: bool = False
) -> AsyncIterator[Setup]:
    """A proxy on ``listen`` with the raw Agent (or the SDK Agent) behind it, and a client."""
    capture = tmp_path / "capture"
    agent = SDK_AGENT if sdk else raw_agent(capture)
    async with (
        listening_proxy(listen, *options, agent=agent) as (proxy, url),
        aiohttp.ClientSession() as session,
    ):
        yield Setup(proxy, url, Http(session, url), capture)


async def roundtrip(http: Http, stream: SseStream, connection: str, id_: Any) -> dict[str, Any]:
    """POST a request and wait for its answer, the next event on ``stream``.

    The raw Agent records every line before it answers, so once the answer is here everything
    POSTed earlier on this connection is in the capture file.
    """
    reply = await http.post(request(id_, "_test/probe"), connection=connection)
    assert reply.status == 202, reply
    answer = await stream.next_json()
    assert answer["id"] == id_, answer
    return dict(answer)


def captured_methods(capture: Path) -> list[str]:
    """The methods (``None`` for a response) of the lines the raw Agent read, in order."""
    return [json.loads(line).get("method") for line in captured(capture)]


async def ws_initialize(ws: ClientConnection) -> dict[str, Any]:
    """Send initialize over ``ws``; its answer."""
    await ws.send(compact(request("init", "initialize", {"protocolVersion": 1})).decode())
    answer = await ws_recv(ws)
    assert answer["id"] == "init"
    return answer


async def ws_recv(ws: ClientConnection) -> dict[str, Any]:
    """The next frame: it must be a text frame holding one JSON-RPC message."""
    frame = await asyncio.wait_for(ws.recv(), TIMEOUT)
    assert isinstance(frame, str), frame[:100]
    message = json.loads(frame)
    assert isinstance(message, dict)
    return message


async def ws_probe(ws: ClientConnection, id_: Any) -> None:
    """A request over ``ws`` answered by the raw Agent: the socket is alive and relayed."""
    await ws.send(compact(request(id_, "_test/probe")).decode())
    assert (await ws_recv(ws))["id"] == id_


def small_receive_buffer(addr_info: Any) -> socket.socket:
    """A client socket with a small fixed receive buffer (no autotuning up to 32 MiB)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock
