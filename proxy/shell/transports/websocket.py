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
check: :class:`MaskedOnlyWebSocketResponse` reads the Client's frame headers ahead of aiohttp's
reader (:class:`MaskedOnlyReader`). That reader also assembles data messages of 64 KiB or more,
and every fragmented one, itself: each read's share of a payload is unmasked as it comes and kept
as a piece, and the endpoint joins the pieces (a thread does from 1 MiB on). aiohttp's reader
would keep a frame's reads until its last one, then join, copy, unmask and copy it again in that
one callback: 115 ms of the event loop for 60 MB. Control frames, small whole messages and any
frame that fails the connection (reserved bits, a continuation of nothing, an unknown opcode)
still go to aiohttp's reader, which judges them as before; the sizes are checked as aiohttp checks
them (1009 at the header of the frame that goes over, before its payload is kept). UTF-8 is not
checked (the listener asks aiohttp for bytes, ``decode_text=False``, so it never was): a text
message that is not UTF-8 is relayed as it came. Binary messages are counted, not kept.

This leans on aiohttp's internals (3.14; the tests catch a change): the response's
``_post_start``, ``_reader`` (the queue), ``_parser``, ``_max_msg_size``, ``_compress`` and
``_decode_text``; the connection's ``_message_tail`` and ``_payload_parser``; the reader class
``aiohttp._websocket.reader.WebSocketReader`` (subclassed, its ``feed_data`` overridden: the queue
calls it to resume a reader it held back) and ``websocket_mask``; the queue's ``feed_data(message,
size)`` (which pauses the transport past its high-water mark), ``set_exception`` and
``_stalled_reader`` (set while aiohttp's reader holds bytes back; what comes after waits here, so
that messages keep their order); and ``ws.receive()`` returning any message it does not handle
itself as it is, so that a text message's data may be an :class:`Assembled`. Toward a Client, the
proxy builds some frames itself and writes them on the writer's transport, waiting on its
protocol's ``_drain_helper`` while the transport is paused: a message written in pieces
(``slice``: aiohttp's ``send_frame`` always sets FIN), and the messages queued together (one
write for them all, where ``send_frame`` makes one each), unless compression was negotiated.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, cast

import websockets
from aiohttp import WebSocketError, WSCloseCode, WSMessage, WSMsgType, web
from aiohttp._websocket.helpers import websocket_mask
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader
from aiohttp.http_websocket import WebSocketWriter
from aiohttp.web_request import BaseRequest
from websockets.asyncio.client import ClientConnection
from websockets.protocol import State

from proxy.core.commands import FailPost
from proxy.shell.defaults import CONNECT_TIMEOUT, WEBSOCKET_HIGH_WATER
from proxy.shell.endpoint import Received, Sliced, joined
from proxy.shell.log import get_logger
from proxy.shell.tls import log_connected
from proxy.shell.transports.cookies import CookieSink

__all__ = [
    "Assembled",
    "MaskedOnlyReader",
    "MaskedOnlyWebSocketResponse",
    "WsClientEndpoint",
    "WsServerEndpoint",
    "connect_ws",
]

log = get_logger("proxy.websocket")


class _Outbox:
    """Messages queued toward one peer, written in order by one task, bounded by bytes."""

    def __init__(self) -> None:
        self._queue: deque[bytes | Sliced] = deque()
        self._size = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closing = False

    def put(self, data: bytes | Sliced) -> None:
        self._queue.append(data)
        self._size += len(data)
        self._ready.set()
        if self._size > WEBSOCKET_HIGH_WATER:
            self._room.clear()

    async def get(self) -> bytes | Sliced | None:
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

    def take_more(self, limit: int) -> list[bytes]:
        """The whole messages queued now behind the one just taken, in order, up to about
        ``limit`` bytes (a message written in pieces waits for a turn of its own)."""
        queue, taken, total = self._queue, [], 0
        while queue and total < limit and type(queue[0]) is bytes:
            data = cast(bytes, queue.popleft())
            taken.append(data)
            total += len(data)
        if taken:
            self._size -= total
            if self._size <= WEBSOCKET_HIGH_WATER:
                self._room.set()
        return taken

    def size(self) -> int:
        return self._size

    def empty(self) -> bool:
        return not self._queue

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


_WRITE_FAILURES = (OSError, RuntimeError, websockets.ConnectionClosed)
"""What writing to a WebSocket that went away raises (:class:`ConnectionError` is an
:class:`OSError`; a transport closed under the writer, :class:`RuntimeError`)."""


def _went_away(exc: BaseException) -> None:
    log.info("WebSocket went away while writing", error=str(exc) or type(exc).__name__)


class _WsEndpoint:
    """What both ends share: an outbox written in order by one task, closing with a code."""

    transport = "ws"

    def __init__(self) -> None:
        self._outbox = _Outbox()
        self._close_code = 1000
        self._close_reason = ""
        self._severed = False
        self._cut = asyncio.Event()
        """Set when what is queued is to be dropped: a message being written in pieces stops."""
        self._writing = False
        """The writing task is sending (or waiting to send) what it took from the outbox."""
        self._pending: list[bytes] = []
        """Messages sent in this turn of the loop while nothing was queued nor being written:
        written together at its end (:meth:`_write_pending`), without waking the writing task."""
        self._pending_size = 0
        self._loop = asyncio.get_running_loop()
        self._writer = self._loop.create_task(self._write())

    def send(self, data: bytes) -> None:
        """Queue one text frame. While nothing is queued nor being written, the frames sent in
        one turn of the loop are written at its end in one write, when the socket takes them
        then (:meth:`_write_pending`): no task is woken for them."""
        outbox = self._outbox
        if outbox.closing:
            return
        pending = self._pending
        if pending or (not self._writing and outbox.empty()):
            if not pending:
                self._loop.call_soon(self._write_pending)
            pending.append(data)
            self._pending_size += len(data)
            return
        outbox.put(data)

    def _write_pending(self) -> None:
        """Write the frames sent in the turn of the loop that ended, if the socket takes them
        now; else the writing task writes them, first."""
        pending = self._pending
        if not pending:
            return  # queued meanwhile (:meth:`_spill`)
        try:
            if self._write_now(pending):
                self._pending, self._pending_size = [], 0
                return
        except _WRITE_FAILURES as exc:
            # As when the writing task fails: the socket is closed, nothing more written.
            _went_away(exc)
            self._ended()
            return
        self._spill()

    def _spill(self) -> None:
        """Queue what is pending in the outbox, in order, ahead of what comes next."""
        if self._pending:
            for data in self._pending:
                self._outbox.put(data)
            self._pending, self._pending_size = [], 0

    def send_run(self, messages: Sequence[bytes]) -> None:
        """Queue a text frame each."""
        for data in messages:
            self.send(data)

    def send_cut(self, data: bytes, cut: int) -> None:
        """A text frame holding the message cut short."""
        self.send(data[:cut])

    def send_sliced(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        """One text message in frames of those sizes (never inside a UTF-8 character), ``gap``
        seconds apart."""
        if not self._outbox.closing:
            self._spill()
            self._outbox.put(Sliced(data, sizes, gap))

    def will_flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    def flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    async def drain(self) -> None:
        """Wait while too much is queued toward the peer."""
        await self._outbox.room()

    def buffered(self) -> int:
        """Bytes of the frames not written yet."""
        return self._outbox.size() + self._pending_size

    def close(self) -> None:
        """Flush, then close the socket normally (1000)."""
        self._spill()
        self._outbox.finish(discard=False)

    def close_with(self, code: int, reason: str) -> None:
        """Flush, then close the socket with ``code`` and ``reason`` (unless already closing)."""
        if self._outbox.closing:
            return
        self._close_code = code
        self._close_reason = reason
        self._spill()
        self._outbox.finish(discard=False)

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Close the socket with ``close_code`` (after what is queued, with ``flush``)."""
        self._severed = True
        self._close_code = close_code
        if flush:
            self._spill()
        else:
            self._pending, self._pending_size = [], 0
        self._outbox.finish(discard=not flush)
        if not flush:
            self._cut.set()

    def receive_ready(self) -> bool:
        """Each message is written on its own: the link drains after every one."""
        return False

    def processed(self, failure: FailPost | None) -> None:
        """Nothing to settle: a WebSocket frame has no answer of its own."""

    async def wait_closed(self) -> None:
        """Wait for the close handshake to finish."""
        await asyncio.shield(self._writer)

    def _ended(self) -> None:
        """Nobody reads any more: what is queued is dropped and the writer closes the socket."""
        self._pending, self._pending_size = [], 0
        self._outbox.finish(discard=True)
        self._cut.set()

    def _write_now(self, messages: list[bytes]) -> bool:
        """Write a text frame each now, in one write, if the socket takes them without waiting
        (open, its buffer below its high-water mark); whether it did."""
        return False

    async def _write(self) -> None:
        try:
            while (data := await self._outbox.get()) is not None:
                self._writing = True
                if type(data) is bytes:
                    more = self._outbox.take_more(WRITE_BATCH)
                    if more:
                        await self._send_frames([data, *more])
                        del more
                    else:
                        await self._send_frame(data)
                else:
                    assert isinstance(data, Sliced)
                    await self._send_fragments(data)
                del data  # sent: not kept alive while the next one is awaited
                self._writing = False
        except _WRITE_FAILURES as exc:
            _went_away(exc)
        finally:
            with contextlib.suppress(*_WRITE_FAILURES):  # closing one that went away
                await self._close_socket(self._close_code, self._close_reason)

    async def _send_frame(self, data: bytes) -> None:
        raise NotImplementedError

    async def _send_fragments(self, sliced: Sliced) -> None:
        """One text message: a frame per piece (the first text, the others continuations, the
        last with FIN), ``gap`` seconds apart."""
        raise NotImplementedError

    async def _send_frames(self, messages: list[bytes]) -> None:
        """A text frame each, in order (as many calls to :meth:`_send_frame`, unless the
        transport has a cheaper way)."""
        for data in messages:
            await self._send_frame(data)

    async def _close_socket(self, code: int, reason: str) -> None:
        raise NotImplementedError


UNMASKED = "the client sent a frame that is not masked (RFC 6455 5.1)"
WHOLE_FRAME_BELOW = 64 * 1024
"""A data frame smaller than this that is a whole message goes to aiohttp's reader, which takes
it in one step of its compiled code, cheaper than assembling it here; any larger one, and every
fragmented message, is unmasked and kept here a read at a time."""

_HEADER_SIZE = tuple(6 if n < 126 else 8 if n == 126 else 14 for n in range(128))
"""Bytes of a masked frame's header by its 7-bit length: the length, then the masking key."""
WRITE_BATCH = 256 * 1024
"""Bytes of queued messages written in one go toward a WebSocket Client (one write: one system
call for the lot)."""
_TEXT, _BINARY = int(WSMsgType.TEXT), int(WSMsgType.BINARY)
_CONTINUATION = int(WSMsgType.CONTINUATION)
_TO_AIOHTTP, _KEEP, _DROP = 0, 1, 2
"""Where the current frame's payload goes: to aiohttp's reader, unmasked into the message being
assembled, or nowhere (a binary message: the endpoint drops it, only its size is counted)."""
_GO_ON = (False, b"")
_FAILED = (True, b"")
_feed_aiohttp = WebSocketReader.feed_data
"""aiohttp's own ``feed_data``, past the override of :class:`MaskedOnlyReader`."""


class Assembled:
    """The unmasked pieces of one data message as they came (each at most one read) and their
    size: :class:`WsServerEndpoint` joins them, in a thread from 1 MiB on (see ``joined``)."""

    __slots__ = ("chunks", "size")

    def __init__(self, chunks: list[bytes], size: int) -> None:
        self.chunks = chunks
        self.size = size


def _frame_header(opcode: int, size: int, *, fin: bool) -> bytes:
    """The header of an unmasked frame (the server's) of ``size`` bytes (RFC 6455 5.2)."""
    first = (0x80 if fin else 0) | opcode
    if size < 126:
        return bytes((first, size))
    if size < 1 << 16:
        return bytes((first, 126)) + size.to_bytes(2, "big")
    return bytes((first, 127)) + size.to_bytes(8, "big")


class _AiohttpFailed(Exception):
    """aiohttp's reader failed the connection (it told the queue already)."""


def _unmasked() -> WebSocketError:
    log.warning("WebSocket frame from the client not masked; closing with 1002")
    return WebSocketError(WSCloseCode.PROTOCOL_ERROR, UNMASKED)


class _ClientFrames:
    """Where :class:`MaskedOnlyReader` is in the Client's stream: the current frame, the data
    message being assembled, and the bytes held back while aiohttp's reader holds back."""

    def __init__(self, reader: MaskedOnlyReader, queue: Any, max_msg_size: int) -> None:
        self.reader = reader
        self.queue = queue
        self.max_msg_size = max_msg_size
        self.header = bytearray()
        """A frame's header begun in an earlier read."""
        self.left = 0
        """Bytes of the current frame's payload still to come."""
        self.to = _TO_AIOHTTP
        self.fin = False
        self.key = b""
        self.at = 0
        """Bytes of the current frame's payload unmasked so far (the masking key's phase)."""
        self.kind = 0
        """``_TEXT`` or ``_BINARY`` while a message is assembled here."""
        self.chunks: list[bytes] = []
        self.size = 0
        self.theirs = False
        """aiohttp's reader has a fragmented message under way (one that is compressed)."""
        self.held = b""
        self.failed = False

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        if self.failed:
            return _FAILED
        if type(data) is not bytes:
            data = bytes(data)
        queue = self.queue
        if self.held or queue._stalled_reader is not None:
            # aiohttp's reader stalled (its queue is full): what it holds goes first, and what
            # came after it waits here until it has gone.
            if queue._stalled_reader is not None:
                if _feed_aiohttp(self.reader, b"")[0]:
                    return self._fail(None)
                if queue._stalled_reader is not None:
                    self.held += data
                    return _GO_ON
            data, self.held = self.held + data, b""
        try:
            self._feed(data)
        except WebSocketError as exc:
            return self._fail(exc)
        except _AiohttpFailed:
            return self._fail(None)
        return _GO_ON

    def _fail(self, error: WebSocketError | None) -> tuple[bool, bytes]:
        self.failed = True
        self.chunks, self.held = [], b""
        if error is not None:
            self.queue.set_exception(error)
        return _FAILED

    def _feed(self, data: bytes) -> None:
        pos, end = 0, len(data)
        queue = self.queue
        while pos < end:
            if self.left:
                take = min(self.left, end - pos)
                if self.to == _TO_AIOHTTP:
                    self._to_aiohttp(data[pos : pos + take])
                elif self.to == _KEEP:
                    self._keep(data, pos, take)
                pos += take
                self.left -= take
                if not self.left and self.to != _TO_AIOHTTP:
                    self._frame_ended()
            else:
                start = pos
                if self.header:
                    header, pos = self._rest_of_header(data, pos)
                    if header is None:
                        return
                else:
                    if end - pos < 2:
                        self.header += data[pos:]
                        return
                    second = data[pos + 1]
                    if not second & 0x80:
                        raise _unmasked()
                    size = _HEADER_SIZE[second & 0x7F]
                    if end - pos < size:
                        self.header += data[pos:]
                        return
                    header = data[pos : pos + size]
                    pos += size
                self._begin(header)
                if self.to == _TO_AIOHTTP:
                    take = min(self.left, end - pos)
                    if start == pos - len(header):
                        self._to_aiohttp(data[start : pos + take])
                    else:  # the header began in an earlier read
                        self._to_aiohttp(header)
                        if take:
                            self._to_aiohttp(data[pos : pos + take])
                    pos += take
                    self.left -= take
                elif not self.left:
                    self._frame_ended()
            if queue._stalled_reader is not None:
                self.held = data[pos:]
                return

    def _rest_of_header(self, data: bytes, pos: int) -> tuple[bytes | None, int]:
        """The header begun in an earlier read, completed from ``data`` (None while it is not
        complete yet), and where its frame's payload starts."""
        header = self.header
        while True:
            size = 2 if len(header) < 2 else _HEADER_SIZE[header[1] & 0x7F]
            if len(header) >= 2 and not header[1] & 0x80:
                raise _unmasked()
            if len(header) >= size:
                break
            if pos == len(data):
                return None, pos
            piece = data[pos : pos + size - len(header)]
            header += piece
            pos += len(piece)
        whole = bytes(header)
        header.clear()
        return whole, pos

    def _begin(self, header: bytes) -> None:
        """Take a frame's header: where its payload goes, or why the connection fails."""
        first, length = header[0], header[1] & 0x7F
        if length == 126:
            length = int.from_bytes(header[2:4], "big")
        elif length == 127:
            length = int.from_bytes(header[2:10], "big")
        self.left = length
        fin, opcode, reserved = first & 0x80, first & 0x0F, first & 0x70
        self.to = _TO_AIOHTTP
        if opcode > _BINARY:  # a control frame, or an opcode that fails the connection there
            return
        if self.theirs:
            if fin and not opcode:
                self.theirs = False
            return
        if self.kind:
            if reserved:
                raise WebSocketError(
                    WSCloseCode.PROTOCOL_ERROR, "Received frame with non-zero reserved bits"
                )
            if opcode:
                raise WebSocketError(
                    WSCloseCode.PROTOCOL_ERROR,
                    f"The opcode in non-fin frame is expected to be zero, got {opcode!r}",
                )
        elif not opcode or reserved or (fin and length < WHOLE_FRAME_BELOW):
            # A small whole message; or one that aiohttp fails (a continuation of nothing,
            # reserved bits), or decompresses where compression was negotiated.
            self.theirs = bool(opcode) and not fin
            return
        else:
            self.kind = opcode
        if self.max_msg_size and self.size + length >= self.max_msg_size:  # as aiohttp's check
            raise WebSocketError(
                WSCloseCode.MESSAGE_TOO_BIG,
                f"Message size {self.size + length} exceeds limit {self.max_msg_size}",
            )
        self.size += length
        self.to = _KEEP if self.kind == _TEXT else _DROP
        self.fin = bool(fin)
        self.key = header[-4:]
        self.at = 0

    def _keep(self, data: bytes, pos: int, take: int) -> None:
        piece = bytearray(memoryview(data)[pos : pos + take])
        phase = self.at & 3
        websocket_mask(self.key[phase:] + self.key[:phase] if phase else self.key, piece)
        self.chunks.append(bytes(piece))
        self.at += take

    def _frame_ended(self) -> None:
        if not self.fin:
            return
        kind, chunks, size = self.kind, self.chunks, self.size
        self.kind, self.chunks, self.size = 0, [], 0
        if kind == _TEXT:
            self.queue.feed_data(WSMessage(WSMsgType.TEXT, Assembled(chunks, size), ""), size)
        else:  # nothing of it is kept
            self.queue.feed_data(WSMessage(WSMsgType.BINARY, Assembled([], size), ""), 0)

    def _to_aiohttp(self, piece: bytes) -> None:
        if _feed_aiohttp(self.reader, piece)[0]:
            raise _AiohttpFailed


class MaskedOnlyReader(WebSocketReader):
    """aiohttp's frame reader, with the Client's bytes going through :class:`_ClientFrames`
    first: it fails a frame that is not masked with 1002, and assembles data messages itself
    (large or fragmented ones) a read at a time, passing everything else on to aiohttp.

    A subclass rather than a wrapper: aiohttp's queue, once drained, resumes a reader that it
    stalled by calling that reader's ``feed_data``, which must be this one. Its own state is
    kept apart, so that no name of it shadows one of aiohttp's (the pure-Python reader keeps its
    state in instance attributes)."""

    def __init__(
        self, queue: WebSocketDataQueue, max_msg_size: int, *, compress: bool, decode_text: bool
    ) -> None:
        super().__init__(queue, max_msg_size, compress=compress, decode_text=decode_text)
        self._client_frames = _ClientFrames(self, queue, max_msg_size)

    def feed_data(self, data: bytes | bytearray | memoryview) -> tuple[bool, bytes]:
        return self._client_frames.feed(cast(bytes, data))


class MaskedOnlyWebSocketResponse(web.WebSocketResponse):
    """aiohttp's server side of a WebSocket, with :class:`MaskedOnlyReader` as its reader.

    aiohttp hands the bytes after the upgrade to its frame reader when the upgrade is answered
    (``_post_start``); the reader is replaced there, and the bytes that came early (pipelined
    behind the upgrade request) go through the new one too, so that frame boundaries are
    followed from the first byte. See the module's docstring for the internals this leans on.
    """

    def _post_start(
        self, request: BaseRequest, protocol: str | None, writer: WebSocketWriter
    ) -> None:
        handler = request.protocol
        early, handler._message_tail = handler._message_tail, b""
        super()._post_start(request, protocol, writer)
        assert self._reader is not None
        reader = MaskedOnlyReader(
            self._reader,
            self._max_msg_size,
            compress=bool(self._compress),
            decode_text=self._decode_text,
        )
        self.frame_writer = writer
        """aiohttp's writer of this socket's frames (a message in pieces is written on its
        transport)."""
        self._parser = reader  # the queue refers to a stalled reader weakly
        handler._payload_parser = reader
        if early and reader.feed_data(early)[0]:
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
                size = data.size if isinstance(data, Assembled) else len(data)
                if size > self.max_bytes:
                    log.warning(
                        "the client's message was over the size limit; socket closed",
                        size=size,
                        limit=self.max_bytes,
                    )
                    self._close_code = 1009
                    break
                if isinstance(data, Assembled):
                    return await joined(data.chunks, size)
                return data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
            if message.type is WSMsgType.BINARY:
                data = message.data
                size = data.size if isinstance(data, Assembled) else len(data)
                log.warning("binary WebSocket frame from the client ignored", size=size)
                continue
            if message.type is WSMsgType.ERROR:
                error = message.data if message.data is not None else self.ws.exception()
                log.warning("WebSocket error from the client", error=str(error))
            break  # CLOSE, CLOSING, CLOSED, ERROR
        self._ended()
        return None

    def _write_now(self, messages: list[bytes]) -> bool:
        if not self._open.is_set() or self.ws.closed:
            return False
        writer = cast(MaskedOnlyWebSocketResponse, self.ws).frame_writer
        transport = writer.transport
        if writer.compress or transport.is_closing() or writer.protocol._paused:
            return False
        transport.write(
            b"".join(_frame_header(_TEXT, len(data), fin=True) + data for data in messages)
        )
        return True

    async def _send_frame(self, data: bytes) -> None:
        if not self._open.is_set():
            await self._open.wait()
        await self.ws.send_frame(data, WSMsgType.TEXT)

    async def _send_frames(self, messages: list[bytes]) -> None:
        """The frames of all ``messages`` in one write (one system call, not one each)."""
        if not self._open.is_set():
            await self._open.wait()
        writer = cast(MaskedOnlyWebSocketResponse, self.ws).frame_writer
        transport = writer.transport
        if writer.compress or transport.is_closing() or self.ws.closed:
            await super()._send_frames(messages)  # aiohttp's own way (and its errors)
            return
        transport.write(
            b"".join(_frame_header(_TEXT, len(data), fin=True) + data for data in messages)
        )
        if writer.protocol._paused:
            await writer.protocol._drain_helper()

    async def _send_fragments(self, sliced: Sliced) -> None:
        if not self._open.is_set():
            await self._open.wait()
        writer = cast(MaskedOnlyWebSocketResponse, self.ws).frame_writer
        transport = writer.transport
        last = len(sliced.parts(text=True)) - 1
        index = 0
        async for part in sliced.chunks(text=True, cut=self._cut):
            if transport.is_closing() or self.ws.closed:
                raise ConnectionResetError("the socket closed while a message was written")
            opcode = _TEXT if index == 0 else _CONTINUATION
            transport.write(_frame_header(opcode, len(part), fin=index == last) + part)
            index += 1
            if writer.protocol._paused:
                await writer.protocol._drain_helper()

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

    def _write_now(self, messages: list[bytes]) -> bool:
        connection = self.connection
        if (
            connection.protocol.state is not State.OPEN
            or connection.send_in_progress is not None
            or connection.paused
            or connection.transport.is_closing()
        ):
            return False
        protocol = connection.protocol
        for data in messages:
            protocol.send_text(data)
        connection.transport.write(b"".join(protocol.data_to_send()))  # open: no EOF among them
        return True

    async def _send_frame(self, data: bytes) -> None:
        await self.connection.send(data, text=True)

    async def _send_fragments(self, sliced: Sliced) -> None:
        # Then an empty frame with FIN; cut short by a sever, the library fails the connection
        # (1011), the message never complete.
        await self.connection.send(sliced.chunks(text=True, cut=self._cut), text=True)

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
    tls: ssl.SSLContext | None = None,
) -> WsClientEndpoint:
    """Open a WebSocket to an Agent; ``limit`` bounds the size of one incoming message.

    The cookies the Agent sets on its handshake response go to ``cookies``; a ``wss://`` URL is
    verified by ``tls`` (default: the system's trust store). Raises ``TimeoutError`` when the TCP
    connection and the handshakes take over ``open_timeout`` seconds.
    """
    connection = await websockets.connect(
        url,
        additional_headers=dict(headers or {}),
        max_size=limit,
        max_queue=WS_READ_AHEAD,
        open_timeout=open_timeout,
        proxy=None,
        compression=None,
        ssl=(tls or True) if url.startswith("wss://") else None,
    )
    log_connected(url, tls)
    if cookies is not None and connection.response is not None:
        cookies.add(connection.response.headers.get_all("Set-Cookie"))
    return WsClientEndpoint(connection)
