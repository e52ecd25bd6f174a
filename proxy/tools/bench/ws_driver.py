"""The bench's Client over WebSocket: blocking reads and writes on one socket, in the bench's
worker thread, so that the Client is not what the WebSocket columns measure.

:class:`BlockingWsPeer` is to a WebSocket URL what :class:`~.driver.BlockingPeer` is to a process's
pipes: the same ``call`` and ``stream``, each answer checked the same way
(:func:`~.driver.check_answer`). It does its own I/O, ``recv`` a MiB at a time, and speaks
through ``websockets``' sans-I/O protocol (``ClientProtocol``) for what it sends: the handshake,
its masked frames, pongs, the close. What it receives once open it parses itself
(:class:`ServerFrames`, sans I/O: a server's frames are unmasked, and no extension is
negotiated), a few slices a frame.

Both are for headroom. ``websockets.sync.client`` reads on a thread of its own and hands each
message over through a lock: on a 2-core machine that carried the Agent's stream at about half
the rate of the sans-I/O protocol's reads. Those in turn cost about 6 us a frame (a generator
and a ``Frame`` each), which capped ``direct`` near 2.3 times the proxy's stream, under the
3 times that shows the Client is not what is measured.

A round trip is timed from just before the send to just after the answer is complete; the
stream's messages are counted by a ``session/update`` mark (never decoded), the answer checked
after the last. No ``Origin`` header is sent (a Client that is not a web page), no
permessage-deflate offered. The socket waits at most
:data:`~proxy.tools.bench.processes.ANSWER_TIMEOUT` for any read or write, so a target that stops
answering is a :class:`~proxy.tools.bench.processes.BenchError`, never a hung bench.

``websockets`` is imported where it is used: the bench Agents import this package, and the stdio
one stays a standard-library process.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from proxy.tools.bench.driver import READ_SIZE, check_answer
from proxy.tools.bench.messages import READ_LIMIT, STREAM_METHOD, UPDATE_MARK
from proxy.tools.bench.processes import ANSWER_TIMEOUT, BenchError, request_text

if TYPE_CHECKING:
    from websockets.client import ClientProtocol

__all__ = ["BlockingWsPeer", "ServerFrames"]

_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
"""The opcodes of RFC 6455 5.2 (the others are reserved: no server sends them)."""
_OPCODES = frozenset((_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG))
_FIN, _RSV, _MASKED, _CONTROL, _CONTROL_MOST = 0x80, 0x70, 0x80, 0x8, 125
"""A header's bits (FIN, the three RSV, MASK), the first control opcode, and the most bytes a
control frame carries (RFC 6455 5.5)."""


def _close(payload: bytes) -> str:
    """A close frame's code and reason, as ``websockets`` says them (else its bytes)."""
    from websockets.exceptions import ProtocolError  # noqa: PLC0415 - see the module
    from websockets.frames import Close  # noqa: PLC0415

    try:
        return str(Close.parse(payload))
    except (ProtocolError, UnicodeDecodeError):
        return f"close {payload!r}"


class ServerFrames:
    """The frames a server sends, parsed as their bytes come (RFC 6455 5.2; no extension
    negotiated), sans I/O: :meth:`feed` takes each read; complete messages go to
    :attr:`messages`, pings' payloads to :attr:`pings` (to be answered), a close's payload to
    :attr:`close` (nothing after it is parsed). A frame no server sends (masked, RSV bits set,
    a reserved opcode, a control frame fragmented or over 125 bytes, a continuation out of
    place, a frame or a message over ``limit`` bytes) is a :class:`ValueError` as soon as its
    header is read."""

    def __init__(self, limit: int) -> None:
        self.messages: deque[bytes] = deque()
        self.pings: list[bytes] = []
        self.close: bytes | None = None
        self._limit = limit
        self._unparsed = b""
        self._fragments: list[bytes] = []
        self._fragmented = 0
        """Bytes of :attr:`_fragments`, bounded as a message is."""

    def feed(self, data: bytes) -> None:
        """Parse every complete frame of what came so far; keep the rest for the next read."""
        if self.close is not None:
            return
        if self._unparsed:
            data = self._unparsed + data
        start, size = 0, len(data)
        messages, limit = self.messages, self._limit
        while size - start >= 2:
            first, second = data[start], data[start + 1]
            length, head = second & 0x7F, 2
            if length == 126:
                if size - start < 4:
                    break
                length, head = int.from_bytes(data[start + 2 : start + 4]), 4
            elif length == 127:
                if size - start < 10:
                    break
                length, head = int.from_bytes(data[start + 2 : start + 10]), 10
            opcode = first & 0x0F
            if (
                second & _MASKED
                or first & _RSV
                or opcode not in _OPCODES
                or length > limit
                or (opcode >= _CONTROL and (length > _CONTROL_MOST or not first & _FIN))
            ):
                raise ValueError(f"a frame no server sends (header {data[start : start + head]!r})")
            end = start + head + length
            if end > size:
                break
            payload = data[start + head : end]
            start = end
            if opcode == _TEXT and first & _FIN and not self._fragments:
                messages.append(payload)  # the usual frame: a whole message
            else:
                self.frame(opcode, bool(first & _FIN), payload)
                if self.close is not None:
                    break
        self._unparsed = data[start:]

    def frame(self, opcode: int, fin: bool, payload: bytes) -> None:
        """Take one frame (parsed here, or by ``websockets`` with the handshake's answer)."""
        if opcode == _PING:
            self.pings.append(payload)
        elif opcode == _CLOSE:
            self.close = payload
        elif opcode != _PONG:
            fragments = self._fragments
            if opcode == _CONT and not fragments:
                raise ValueError("a continuation frame with no message begun")
            if opcode != _CONT and fragments:
                raise ValueError("a new message amid a fragmented one")
            if fin and not fragments:
                self.messages.append(payload)
                return
            fragments.append(payload)
            self._fragmented += len(payload)
            if self._fragmented > self._limit:
                raise ValueError(f"a message over {self._limit} bytes")
            if fin:
                self.messages.append(b"".join(fragments))
                fragments.clear()
                self._fragmented = 0


class BlockingWsPeer:
    """One WebSocket to a target, driven as a Client with blocking I/O (see the module)."""

    def __init__(self, url: str) -> None:
        from websockets.client import ClientProtocol  # noqa: PLC0415 - see the module
        from websockets.uri import parse_uri  # noqa: PLC0415

        self.url = url
        uri = parse_uri(url)
        self._socket = socket.create_connection((uri.host, uri.port), timeout=ANSWER_TIMEOUT)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._protocol: ClientProtocol = ClientProtocol(uri, max_size=READ_LIMIT)
        self._frames = ServerFrames(READ_LIMIT)
        self._closed: str | None = None
        self._next_id = 0
        try:
            self._handshake()
        except BaseException:
            self._socket.close()
            raise

    def _handshake(self) -> None:
        """The opening handshake through ``websockets``; the frames that came with its answer
        are taken as any other (a frame cut by the end of that read would be lost: no bench
        target speaks before it is asked)."""
        from websockets.frames import Frame  # noqa: PLC0415 - see the module

        self._protocol.send_request(self._protocol.connect())
        self._flush()
        events: list[object] = []
        while not events:
            data = self._recv()
            if not data:
                self._protocol.receive_eof()
                break
            self._protocol.receive_data(data)
            events = list(self._protocol.events_received())
        if self._protocol.handshake_exc is not None:
            exc = self._protocol.handshake_exc
            raise BenchError(f"no WebSocket to {self.url}: {type(exc).__name__}: {exc}")
        try:
            for event in events:
                if isinstance(event, Frame):
                    self._frames.frame(event.opcode.value, event.fin, bytes(event.data))
        except ValueError as exc:
            raise BenchError(f"{self.url} sent {exc}") from None
        self._answer()

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, str]:
        """A request with the next id, as the message to send; its id."""
        self._next_id += 1
        return self._next_id, request_text(self._next_id, method, params)

    def call(self, method: str, params: dict[str, Any]) -> float:
        """One round trip; its duration in seconds (the message encoded before the clock starts)."""
        request_id, data = self.request(method, params)
        start = time.perf_counter()
        self._send(data)
        answer = self._receive()
        elapsed = time.perf_counter() - start
        check_answer(answer, request_id)
        return elapsed

    def stream(self, count: int) -> tuple[int, float]:
        """Ask for ``count`` notifications; the count received and the seconds until the answer
        that follows them was received (the messages are counted as they come, checked after)."""
        request_id, data = self.request(STREAM_METHOD, {"count": count})
        start = time.perf_counter()
        self._send(data)
        received = 0
        for _ in range(count):
            received += UPDATE_MARK in self._receive()
        answer = self._receive()
        elapsed = time.perf_counter() - start
        check_answer(answer, request_id)
        if received != count:
            raise BenchError(f"asked for {count} notifications, got {received}")
        return received, elapsed

    def _send(self, data: str) -> None:
        self._protocol.send_text(data.encode())
        self._flush()

    def _receive(self) -> bytes:
        """The next message, read as far as needed (pongs to pings are sent on the way)."""
        messages = self._frames.messages
        while not messages:
            if self._closed is not None:
                raise BenchError(f"{self.url} closed the WebSocket: {self._closed}")
            self._receive_any()
        return messages.popleft()

    def _recv(self) -> bytes:
        try:
            return self._socket.recv(READ_SIZE)
        except TimeoutError:
            raise BenchError(f"{self.url} did not answer in {ANSWER_TIMEOUT} s") from None

    def _flush(self) -> None:
        """Write what the protocol has to send (an empty chunk: half-close, after a close)."""
        for data in self._protocol.data_to_send():
            if data:
                self._socket.sendall(data)
            else:
                self._socket.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close the WebSocket (a close frame, the target's read up to its own, then the
        socket)."""
        from websockets.protocol import State  # noqa: PLC0415 - see the module

        try:
            if self._protocol.state is State.OPEN and self._closed is None:
                self._protocol.send_close()
                self._flush()
                while self._closed is None:
                    self._receive_any()
        except (OSError, BenchError):
            pass  # the target is gone already: nothing more to close
        finally:
            self._socket.close()

    def _receive_any(self) -> None:
        """One read's frames parsed (messages left unread, pings and a close answered), or the
        connection's end noted."""
        data = self._recv()
        if not data:
            self._closed = "its connection ended"
            return
        try:
            self._frames.feed(data)
        except ValueError as exc:
            raise BenchError(f"{self.url} sent {exc}") from None
        self._answer()

    def _answer(self) -> None:
        """Pong each ping parsed; answer a close (RFC 6455 5.5.1) unless it answers ours."""
        frames = self._frames
        if not frames.pings and frames.close is None:
            return  # the usual read: nothing to answer, nothing to write
        from websockets.protocol import State  # noqa: PLC0415 - see the module

        for payload in frames.pings:
            self._protocol.send_pong(payload)
        frames.pings.clear()
        if frames.close is not None and self._closed is None:
            self._closed = f"received {_close(frames.close)}"
            if self._protocol.state is State.OPEN:
                self._protocol.send_close()
        self._flush()
