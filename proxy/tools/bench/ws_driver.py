"""The bench's Client over WebSocket: blocking sends and receives (``websockets.sync.client``)
in a thread of its own, so that the Client is not what the WebSocket columns measure.

:class:`BlockingWsPeer` is to a WebSocket URL what :class:`~.driver.BlockingPeer` is to a process's
pipes: the same ``call`` and ``stream``, each answer checked the same way
(:func:`~.driver.check_answer`). A round trip is timed from just before the send to just after
the answer is received; the stream's messages are received undecoded (bytes: no UTF-8 decoding
of what is only counted) and counted by a ``session/update`` mark, the answer checked after the
last. No ``Origin`` header is sent (a Client that is not a web page), no permessage-deflate
offered, no keepalive pings; every receive waits at most
:data:`~proxy.tools.bench.processes.ANSWER_TIMEOUT`, so a target that stops answering is a
:class:`~proxy.tools.bench.processes.BenchError`, never a hung bench.

``websockets`` is imported where it is used: the bench Agents import this package, and the stdio
one stays a standard-library process.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from proxy.tools.bench.driver import check_answer
from proxy.tools.bench.messages import READ_LIMIT, STREAM_METHOD, UPDATE_MARK
from proxy.tools.bench.processes import ANSWER_TIMEOUT, BenchError, request_text

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

__all__ = ["RECEIVE_QUEUE", "BlockingWsPeer"]

RECEIVE_QUEUE = 4096
"""Messages ``websockets`` may hold received and not yet taken before it stops reading (its
default, 16, would have the Client's socket pause every few messages of a stream)."""


class BlockingWsPeer:
    """One WebSocket to a target, driven as a Client with blocking I/O (see the module)."""

    def __init__(self, url: str) -> None:
        from websockets.exceptions import WebSocketException  # noqa: PLC0415 - see the module
        from websockets.sync.client import connect  # noqa: PLC0415

        self.url = url
        self._open = contextlib.ExitStack()  # connect()'s own use, as newer websockets ask
        try:
            self.connection: ClientConnection = self._open.enter_context(
                connect(
                    url,
                    compression=None,
                    max_size=READ_LIMIT,
                    max_queue=RECEIVE_QUEUE,
                    open_timeout=ANSWER_TIMEOUT,
                    ping_interval=None,
                    proxy=None,
                )
            )
        except WebSocketException as exc:
            raise BenchError(f"no WebSocket to {url}: {type(exc).__name__}: {exc}") from None
        self._next_id = 0

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
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 - see the module

        try:
            self.connection.send(data)
        except ConnectionClosed as exc:
            raise BenchError(f"{self.url} closed the WebSocket: {exc}") from None

    def _receive(self) -> bytes:
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 - see the module

        try:
            data = self.connection.recv(timeout=ANSWER_TIMEOUT, decode=False)
        except TimeoutError:
            raise BenchError(f"{self.url} did not answer in {ANSWER_TIMEOUT} s") from None
        except ConnectionClosed as exc:
            raise BenchError(f"{self.url} closed the WebSocket: {exc}") from None
        assert isinstance(data, bytes)
        return data

    def close(self) -> None:
        """Close the WebSocket (the closing handshake, at most 10 s)."""
        self._open.close()
