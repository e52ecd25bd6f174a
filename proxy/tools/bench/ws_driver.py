"""The bench's Client over WebSocket: blocking reads and writes on one socket, in the bench's
worker thread, so that the Client is not what the WebSocket columns measure.

:class:`BlockingWsPeer` is to a WebSocket URL what :class:`~.driver.BlockingPeer` is to a process's
pipes: the same ``call`` and ``stream``, each answer checked the same way
(:func:`~.driver.check_answer`). It does its own I/O, ``recv`` a MiB at a time, and speaks
through ``websockets``' sans-I/O protocol (``ClientProtocol``) for what it sends: the handshake,
its masked frames, pongs, the close. What it receives once open it parses itself (RFC 6455 5.2:
a server's frames are unmasked, and no extension is negotiated), a few slices a frame.

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

__all__ = ["BlockingWsPeer"]

_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
"""The opcodes of RFC 6455 5.2."""
_DATA = frozenset((_CONT, _TEXT, _BINARY))
"""The opcodes of a message's frames."""


def _close(payload: bytes) -> str:
    """A close frame's code and reason, as ``websockets`` says them (else its bytes)."""
    from websockets.exceptions import ProtocolError  # noqa: PLC0415 - see the module
    from websockets.frames import Close  # noqa: PLC0415

    try:
        return str(Close.parse(payload))
    except (ProtocolError, UnicodeDecodeError):
        return f"close {payload!r}"


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
        self._messages: deque[bytes] = deque()
        self._fragments: list[bytes] = []
        self._unparsed = b""
        self._closed: str | None = None
        self._next_id = 0
        try:
            self._protocol.send_request(self._protocol.connect())
            self._flush()
            while not self._protocol.events_received():
                data = self._recv()
                if not data:
                    self._protocol.receive_eof()
                    break
                self._protocol.receive_data(data)
            if self._protocol.handshake_exc is not None:
                exc = self._protocol.handshake_exc
                raise BenchError(f"no WebSocket to {url}: {type(exc).__name__}: {exc}")
        except BaseException:
            self._socket.close()
            raise

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
        while not self._messages:
            if self._closed is not None:
                raise BenchError(f"{self.url} closed the WebSocket: {self._closed}")
            self._receive_any()
        return self._messages.popleft()

    def _parse(self, data: bytes) -> None:
        """Every complete frame of ``data``: a message's to :attr:`_messages`, a ping answered,
        a close noted; the rest kept for the next read."""
        start, size = 0, len(data)
        while size - start >= 2:
            first, second = data[start], data[start + 1]
            length, head = second & 0x7F, 2
            if length == 126:
                length, head = int.from_bytes(data[start + 2 : start + 4]), 4
            elif length == 127:
                length, head = int.from_bytes(data[start + 2 : start + 10]), 10
            end = start + head + length
            if end > size:
                break
            if second & 0x80 or first & 0x70 or length > READ_LIMIT:
                raise BenchError(f"{self.url} sent a frame no server sends: {data[start:end]!r}")
            payload = data[start + head : end]
            start = end
            opcode = first & 0x0F
            if opcode in _DATA:
                if first & 0x80 and not self._fragments:
                    self._messages.append(payload)
                    continue
                self._fragments.append(payload)
                if first & 0x80:
                    self._messages.append(b"".join(self._fragments))
                    self._fragments.clear()
            elif opcode == _PING:
                self._protocol.send_pong(payload)
                self._flush()
            elif opcode == _CLOSE:
                self._closed = f"received {_close(payload)}"
                break
        self._unparsed = data[start:]

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
        """One read's frames parsed (messages left unread), or the connection's end noted."""
        data = self._recv()
        if data:
            self._parse(self._unparsed + data if self._unparsed else data)
        else:
            self._closed = "its connection ended"
