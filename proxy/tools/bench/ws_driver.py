"""The bench's Client over WebSocket: blocking reads and writes on one socket, in the bench's
worker thread, so that the Client is not what the WebSocket columns measure.

:class:`BlockingWsPeer` is to a WebSocket URL what :class:`~.driver.BlockingPeer` is to a process's
pipes: the same ``call`` and ``stream``, each answer checked the same way
(:func:`~.driver.check_answer`). It speaks through ``websockets``' sans-I/O protocol
(``ClientProtocol``: the handshake, framing, masking, pongs) and does its own I/O: ``recv`` a MiB
at a time, every frame of a read parsed in one pass. ``websockets.sync.client`` reads on a thread
of its own and hands each message over through a lock: on a 2-core machine that carried the
Agent's stream at about half the rate of these reads, hardly twice the bare relay's, too little
headroom to see a proxy as fast as that relay. A round trip is timed from just before the send to
just after the answer is complete; the stream's messages are counted by a ``session/update`` mark
(never decoded), the answer checked after the last. No ``Origin`` header is sent (a Client that
is not a web page), no permessage-deflate offered. The socket waits at most
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

_DATA = {"TEXT", "BINARY", "CONT"}
"""The opcodes of a message's frames (by name: ``websockets`` is imported where it is used)."""


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
        self._next_id = 0
        try:
            self._protocol.send_request(self._protocol.connect())
            self._flush()
            while not self._protocol.events_received() and not self._eof():
                self._protocol.receive_data(self._recv())
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
        from websockets.frames import Frame  # noqa: PLC0415 - see the module

        while not self._messages:
            if self._eof():
                closing = self._protocol.close_rcvd
                why = "its connection ended" if closing is None else f"received {closing}"
                raise BenchError(f"{self.url} closed the WebSocket: {why}")
            self._protocol.receive_data(self._recv())
            for frame in self._protocol.events_received():
                if isinstance(frame, Frame) and frame.opcode.name in _DATA:
                    self._fragments.append(bytes(frame.data))
                    if frame.fin:
                        self._messages.append(b"".join(self._fragments))
                        self._fragments.clear()
            self._flush()
        return self._messages.popleft()

    def _eof(self) -> bool:
        """Whether the target closed the WebSocket (a close frame, or the socket's end)."""
        from websockets.protocol import State  # noqa: PLC0415 - see the module

        return self._protocol.close_rcvd is not None or self._protocol.state is State.CLOSED

    def _recv(self) -> bytes:
        try:
            data = self._socket.recv(READ_SIZE)
        except TimeoutError:
            raise BenchError(f"{self.url} did not answer in {ANSWER_TIMEOUT} s") from None
        if not data:
            self._protocol.receive_eof()
        return data

    def _flush(self) -> None:
        """Write what the protocol has to send (an empty chunk: half-close, after a close)."""
        for data in self._protocol.data_to_send():
            if data:
                self._socket.sendall(data)
            else:
                self._socket.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close the WebSocket (the closing handshake, then the socket)."""
        from websockets.protocol import State  # noqa: PLC0415 - see the module

        try:
            if self._protocol.state is State.OPEN:
                self._protocol.send_close()
                self._flush()
                while not self._eof():
                    self._protocol.receive_data(self._recv())
                    self._protocol.events_received()
                    self._flush()
        except (OSError, BenchError):
            pass  # the target is gone already: nothing more to close
        finally:
            self._socket.close()
