"""WebSocket on both sides (wire brief 1.3): one JSON-RPC message per text frame.

Toward the Client the proxy accepts the upgrade in its aiohttp listener (:class:`WsServerEndpoint`,
also used on the Streamable HTTP endpoint); toward an Agent it connects with the ``websockets``
client (:class:`WsClientEndpoint`). Binary frames carry nothing in ACP: they are logged and
ignored, as both SDKs do. A message over the size limit closes the socket with 1009 (the library
enforces the limit while reading, so such a frame is never buffered whole). No subprotocol is
required. Sends go through a bounded outbox and one writer task, so order is kept and a peer that
stops reading slows down its writer instead of growing memory.

A frame from a Client that is not masked fails its connection with 1002 (RFC 6455 5.1: "The server
MUST close the connection upon receiving a frame that is not masked"), which aiohttp does not
check: :class:`MaskedOnlyWebSocketResponse` follows the frame headers ahead of aiohttp's reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol, cast

import websockets
from aiohttp import WebSocketError, WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WebSocketWriter
from aiohttp.web_request import BaseRequest
from websockets.asyncio.client import ClientConnection

from proxy.shell.defaults import CONNECT_TIMEOUT, WEBSOCKET_HIGH_WATER
from proxy.shell.endpoint import Received
from proxy.shell.log import get_logger
from proxy.shell.transports.cookies import CookieSink

__all__ = [
    "FrameHeaders",
    "MaskedOnlyWebSocketResponse",
    "WsClientEndpoint",
    "WsServerEndpoint",
    "connect_ws",
]

log = get_logger("proxy.websocket")


class _Outbox:
    """Messages queued toward one peer, written in order by one task, bounded by bytes."""

    def __init__(self) -> None:
        self._queue: deque[bytes] = deque()
        self._size = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closing = False

    def put(self, data: bytes) -> None:
        self._queue.append(data)
        self._size += len(data)
        self._ready.set()
        if self._size > WEBSOCKET_HIGH_WATER:
            self._room.clear()

    async def get(self) -> bytes | None:
        """The next message to write, or ``None`` once closing and empty."""
        while not self._queue:
            if self.closing:
                return None
            self._ready.clear()
            await self._ready.wait()
        data = self._queue.popleft()
        self._size -= len(data)
        if self._size <= WEBSOCKET_HIGH_WATER:
            self._room.set()
        return data

    def size(self) -> int:
        return self._size

    async def room(self) -> None:
        await self._room.wait()

    def finish(self, *, discard: bool) -> None:
        """No more messages; with ``discard``, drop what is still queued."""
        self.closing = True
        if discard:
            self._queue.clear()
            self._size = 0
        self._room.set()
        self._ready.set()


class _WsEndpoint:
    """What both ends share: an outbox written in order by one task, closing with a code."""

    transport = "ws"

    def __init__(self) -> None:
        self._outbox = _Outbox()
        self._close_code = 1000
        self._close_reason = ""
        self._severed = False
        self._writer = asyncio.get_running_loop().create_task(self._write())

    def send(self, data: bytes) -> None:
        """Queue one text frame."""
        if not self._outbox.closing:
            self._outbox.put(data)

    async def drain(self) -> None:
        """Wait while too much is queued toward the peer."""
        await self._outbox.room()

    def buffered(self) -> int:
        """Bytes of the frames waiting in the outbox."""
        return self._outbox.size()

    def close(self) -> None:
        """Flush, then close the socket normally (1000)."""
        self._outbox.finish(discard=False)

    def close_with(self, code: int, reason: str) -> None:
        """Flush, then close the socket with ``code`` and ``reason`` (unless already closing)."""
        if self._outbox.closing:
            return
        self._close_code = code
        self._close_reason = reason
        self._outbox.finish(discard=False)

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Close the socket with ``close_code`` (after what is queued, with ``flush``)."""
        self._severed = True
        self._close_code = close_code
        self._outbox.finish(discard=not flush)

    def receive_ready(self) -> bool:
        """Each message is written on its own: the link drains after every one."""
        return False

    def processed(self, status: int | None) -> None:
        """Nothing to settle: a WebSocket frame has no answer of its own."""

    async def wait_closed(self) -> None:
        """Wait for the close handshake to finish."""
        await asyncio.shield(self._writer)

    def _ended(self) -> None:
        """Nobody reads any more: what is queued is dropped and the writer closes the socket."""
        self._outbox.finish(discard=True)

    async def _write(self) -> None:
        try:
            while (data := await self._outbox.get()) is not None:
                await self._send_frame(data)
                del data  # sent: not kept alive while the next one is awaited
        except (ConnectionError, RuntimeError, websockets.ConnectionClosed) as exc:
            log.info("WebSocket went away while writing", error=str(exc) or type(exc).__name__)
        finally:
            with contextlib.suppress(ConnectionError, RuntimeError, websockets.ConnectionClosed):
                await self._close_socket(self._close_code, self._close_reason)

    async def _send_frame(self, data: bytes) -> None:
        raise NotImplementedError

    async def _close_socket(self, code: int, reason: str) -> None:
        raise NotImplementedError


_EXTENDED_LENGTH = {126: 2, 127: 8}
"""Bytes of the extended payload length, by the 7-bit length that announces one."""
UNMASKED = "the client sent a frame that is not masked (RFC 6455 5.1)"


class FrameHeaders:
    """Follows the frame boundaries of the bytes a Client sends after its upgrade, fed in any
    slices, and finds the first frame that is not masked (sans-I/O)."""

    def __init__(self) -> None:
        self._header = bytearray()
        """The current frame's first bytes, up to its extended payload length."""
        self._skip = 0
        """Bytes of the current frame left after those: its masking key and payload."""

    def unmasked_at(self, data: bytes) -> int | None:
        """Where in ``data`` the first frame that is not masked starts (0 when it started in an
        earlier slice); None while every frame is masked."""
        header = self._header
        position, end = 0, len(data)
        while position < end:
            if self._skip:
                step = min(self._skip, end - position)
                self._skip -= step
                position += step
                continue
            start = position - len(header)  # negative: the frame began in an earlier slice
            size = 2 if len(header) < 2 else 2 + _EXTENDED_LENGTH.get(header[1] & 0x7F, 0)
            taken = data[position : position + size - len(header)]
            header += taken
            position += len(taken)
            if len(header) < 2:
                break
            if not header[1] & 0x80:
                return max(start, 0)
            extended = _EXTENDED_LENGTH.get(header[1] & 0x7F, 0)
            if len(header) < 2 + extended:
                continue
            length = int.from_bytes(header[2:], "big") if extended else header[1] & 0x7F
            self._skip = 4 + length  # the masking key, then the payload
            header.clear()
        return None


class _MessageQueue(Protocol):
    def set_exception(self, exc: BaseException) -> None: ...


class _MaskedFramesOnly:
    """Between aiohttp's connection and its frame reader: passes the Client's bytes on up to a
    frame that is not masked, then fails the connection with 1002, as the reader fails one for
    any other protocol error (the frames before it are still delivered)."""

    def __init__(self, reader: Any, queue: _MessageQueue) -> None:
        self._reader = reader
        self._queue = queue
        self._headers = FrameHeaders()
        self._failed = False

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self._failed:
            return True, b""
        unmasked = self._headers.unmasked_at(data)
        if unmasked is None:
            return cast(tuple[bool, bytes], self._reader.feed_data(data))
        if unmasked:
            self._reader.feed_data(data[:unmasked])
        self._failed = True
        log.warning("WebSocket frame from the client not masked; closing with 1002")
        self._queue.set_exception(WebSocketError(WSCloseCode.PROTOCOL_ERROR, UNMASKED))
        return True, b""

    def feed_eof(self) -> None:
        self._reader.feed_eof()


class MaskedOnlyWebSocketResponse(web.WebSocketResponse):
    """aiohttp's server side of a WebSocket, failing every frame the Client did not mask (1002).

    aiohttp hands the bytes after the upgrade to its frame reader when the upgrade is answered
    (``_post_start``); the reader is wrapped there, and the bytes that came early (pipelined
    behind the upgrade request) go through the wrapper too, so that frame boundaries are
    followed from the first byte. This leans on aiohttp's internals (``_post_start``,
    ``_message_tail``, ``_payload_parser``: the same from 3.11 to 3.14); the tests catch a change.
    """

    def _post_start(
        self, request: BaseRequest, protocol: str | None, writer: WebSocketWriter
    ) -> None:
        handler = request.protocol
        early, handler._message_tail = handler._message_tail, b""
        super()._post_start(request, protocol, writer)
        assert self._reader is not None
        guard = _MaskedFramesOnly(handler._payload_parser, self._reader)
        handler._payload_parser = guard
        if early and guard.feed_data(early)[0]:
            handler.close()


class WsServerEndpoint(_WsEndpoint):
    """A Client connected to the proxy's listener over WebSocket (aiohttp).

    The listener connects the Agent before it answers the upgrade (the ``101`` carries the
    cookies the Agent set), so the endpoint reads and writes only once :meth:`opened` says how
    the handshake went.
    """

    def __init__(self, ws: web.WebSocketResponse, connection_id: str, max_bytes: int) -> None:
        self.ws = ws
        self.connection_id = connection_id
        self.max_bytes = max_bytes
        """The largest message taken; aiohttp's own bound (``max_msg_size``) differs by one
        between its versions, so the listener sets it one higher and this check decides."""
        self._open = asyncio.Event()
        super().__init__()

    def opened(self, ok: bool) -> None:
        """The upgrade was answered (``ok``), or the Client left first: then the endpoint ends."""
        if not ok:
            self._severed = True
            self._ended()
        self._open.set()

    async def receive(self) -> Received | None:
        """The next text frame, as bytes; ``None`` once the socket is closed."""
        if not self._open.is_set():
            await self._open.wait()
        while not self._severed:
            message = await self.ws.receive()
            if message.type is WSMsgType.TEXT:
                data = message.data
                if len(data) > self.max_bytes:
                    log.warning(
                        "the client's message was over the size limit; socket closed",
                        size=len(data),
                        limit=self.max_bytes,
                    )
                    self._close_code = 1009
                    break
                return data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
            if message.type is WSMsgType.BINARY:
                size = len(message.data)
                log.warning("binary WebSocket frame from the client ignored", size=size)
                continue
            if message.type is WSMsgType.ERROR:
                error = message.data if message.data is not None else self.ws.exception()
                log.warning("WebSocket error from the client", error=str(error))
            break  # CLOSE, CLOSING, CLOSED, ERROR
        self._ended()
        return None

    async def _send_frame(self, data: bytes) -> None:
        if not self._open.is_set():
            await self._open.wait()
        await self.ws.send_frame(data, WSMsgType.TEXT)

    async def _close_socket(self, code: int, reason: str) -> None:
        await self._open.wait()
        if self.ws.prepared:
            await self.ws.close(code=code, message=reason.encode())


class WsClientEndpoint(_WsEndpoint):
    """The proxy connected to an Agent over WebSocket (the ``websockets`` client)."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self._release_ping: asyncio.Task[None] | None = None
        super().__init__()

    async def receive(self) -> Received | None:
        """The next text frame as bytes; ``None`` once the socket is closed."""
        while not self._severed:
            try:
                data = await self.connection.recv()
            except websockets.ConnectionClosed as exc:
                if exc.sent is not None and exc.sent.code == 1009:
                    log.warning("the agent's message was over the size limit; socket closed")
                break
            if isinstance(data, bytes):
                log.warning("binary WebSocket frame from the agent ignored", size=len(data))
                continue
            if len(data) >= RELEASE_PING_BYTES and (
                self._release_ping is None or self._release_ping.done()
            ):
                self._release_ping = asyncio.get_running_loop().create_task(self._ping())
            return data.encode("utf-8", "surrogatepass")
        self._ended()
        return None

    async def _ping(self) -> None:
        """A ping whose pong is the next frame the library parses (see
        :data:`RELEASE_PING_BYTES`); in a task of its own, since sending may wait for the socket."""
        with contextlib.suppress(websockets.ConnectionClosed):
            await self.connection.ping()

    async def wait_closed(self) -> None:
        """Wait for the close handshake to finish; a ping still being sent is dropped."""
        try:
            await super().wait_closed()
        finally:
            if self._release_ping is not None:
                self._release_ping.cancel()

    async def _send_frame(self, data: bytes) -> None:
        await self.connection.send(data, text=True)

    async def _close_socket(self, code: int, reason: str) -> None:
        await self.connection.close(code=code, reason=reason)


RELEASE_PING_BYTES = 1024 * 1024
"""A message from an Agent this large or larger is followed by a ping: the ``websockets``
library's parser keeps the last frame it parsed alive (a local variable of its generator) until
the next frame arrives, up to the next keepalive 20 s later; the pong is that next frame, and an
idle link keeps no large message alive."""
WS_READ_AHEAD = 2
"""Frames the ``websockets`` client reads ahead of the relay from an Agent (its ``max_queue``;
16 by default): what it buffers is outside the proxy's count of bytes in flight, and a frame may
be ``--max-message-bytes`` long, so the link's own reader, which waits at that bound, decides."""


async def connect_ws(
    url: str,
    *,
    limit: int,
    headers: Mapping[str, str] | None = None,
    open_timeout: float = CONNECT_TIMEOUT,
    cookies: CookieSink | None = None,
) -> WsClientEndpoint:
    """Open a WebSocket to an Agent; ``limit`` bounds the size of one incoming message.

    The cookies the Agent sets on its handshake response go to ``cookies``. Raises
    ``TimeoutError`` when the TCP connection and the handshake take over ``open_timeout`` seconds.
    """
    connection = await websockets.connect(
        url,
        additional_headers=dict(headers or {}),
        max_size=limit,
        max_queue=WS_READ_AHEAD,
        open_timeout=open_timeout,
        proxy=None,
        compression=None,
    )
    log.info("connected to the agent", url=url)
    if cookies is not None and connection.response is not None:
        cookies.add(connection.response.headers.get_all("Set-Cookie"))
    return WsClientEndpoint(connection)
