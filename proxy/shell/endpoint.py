"""The one interface every transport adapts its library to: a connection to one peer.

A transport knows framing and nothing of JSON-RPC or faults. Its endpoint yields whole messages
(or :class:`~proxy.core.framing.Oversized` markers) and takes whole messages to send, buffered and
in order; :meth:`Endpoint.drain` is where backpressure reaches the reader of the other peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from proxy.core.commands import FailPost
from proxy.core.framing import Oversized
from proxy.core.jsonrpc import Batch, Invalid, Message

__all__ = [
    "Admitting",
    "Bursting",
    "ClosesWithReason",
    "Endpoint",
    "ExitReporter",
    "Received",
    "Signalable",
    "StreamOwner",
    "bytes_of",
    "joined",
]

JOIN_ELSEWHERE_FROM = 1024 * 1024
"""CPython's own threshold: below it ``bytes.join`` copies holding the interpreter."""

Received = bytes | Oversized | Message | Batch | Invalid
"""One framed message, the marker of one that was too large to keep, or a message its endpoint
parsed already (to route it: an HTTP POST, a message of an HTTP Agent), which the relay takes as
it is, without parsing it again."""


async def joined(chunks: list[bytes], size: int) -> bytes:
    """``chunks`` as one message. From :data:`JOIN_ELSEWHERE_FROM` bytes on, a thread joins them:
    CPython lets go of the interpreter while it copies that much, so the event loop goes on
    (tens of ms for 60 MB, which every other link would otherwise wait)."""
    if size < JOIN_ELSEWHERE_FROM:
        return b"".join(chunks)
    return await asyncio.to_thread(b"".join, chunks)


def bytes_of(received: Received | None) -> bytes | None:
    """The message's bytes as the peer sent them (``None`` for the marker of one too large,
    and for the end of the connection)."""
    if received is None or isinstance(received, Oversized):
        return None
    return received if isinstance(received, bytes) else received.raw


class Endpoint(Protocol):
    """A connection to a Client or an Agent."""

    transport: str
    """The transport's name as a metrics label: ``stdio``, ``http`` or ``ws``."""

    async def receive(self) -> Received | None:
        """The next message from the peer, or ``None`` once the connection has ended."""
        ...

    def receive_ready(self) -> bool:
        """Whether :meth:`receive` holds a message that it returns without waiting.

        The link drains (and so writes) once a burst that arrived together is relayed.
        """
        ...

    def send(self, data: bytes) -> None:
        """Queue one message for the peer; order is kept. Dropped once closing."""
        ...

    def send_run(self, messages: Sequence[bytes]) -> None:
        """Queue ``messages``, in order, as :meth:`send` queues each."""
        ...

    def send_cut(self, data: bytes, cut: int) -> None:
        """Queue the first ``cut`` bytes of the message ``data`` as the transport carries a
        message cut short (``truncate``; the link severs the connection next)."""
        ...

    async def drain(self) -> None:
        """Wait until the queue toward the peer is below its high-water mark."""
        ...

    def buffered(self) -> int:
        """Bytes queued toward the peer that it has not taken yet (as far as the proxy knows)."""
        ...

    def close(self) -> None:
        """Pass an end of stream on: flush what is queued, then close. Idempotent.

        Whether reading goes on until the peer's own end is the transport's choice (an Agent
        told to stop by EOF on stdin may still answer; a closed WebSocket is closed both ways).
        """
        ...

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Cut the connection both ways now; ``receive`` returns ``None`` from here on.

        ``flush``: write what is queued first; otherwise it is discarded. ``close_code`` is the
        WebSocket close code, where the connection is a WebSocket.
        """
        ...

    def processed(self, failure: FailPost | None) -> None:
        """The relay has dealt with the last message :meth:`receive` returned.

        ``failure`` is the answer a fault asked for (``http_status``: a status, and the
        ``Acp-Fault`` header's value), else ``None``. Only an HTTP listener acts on it: it
        answers the POST that carried the message so.
        """
        ...

    async def wait_closed(self) -> None:
        """Wait until the connection has ended and its resources are released."""
        ...


@runtime_checkable
class Bursting(Protocol):
    """An endpoint that hands over the messages of one read together (a stdio pipe's lines)."""

    def receive_burst(self, below: int) -> list[bytes]:
        """The messages :meth:`Endpoint.receive` holds ready, all at once, when every one is
        a message's bytes under ``below`` bytes; else none (they are received one by one)."""
        ...

    def give_back(self, messages: list[bytes]) -> None:
        """``messages``, the last of those :meth:`receive_burst` handed over, are received
        again, first."""
        ...


@runtime_checkable
class Signalable(Protocol):
    """An endpoint that is a process the proxy spawned (``kill_agent`` needs one)."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process if it is still running."""
        ...


@runtime_checkable
class ExitReporter(Protocol):
    """An endpoint that is a process the proxy spawned, which can say why it ended."""

    async def failure(self, within: float) -> str | None:
        """Why the process ended, when it failed ("the agent exited with status 3", "the agent
        was killed by SIGKILL"); None when it exited with status 0, or is still running after
        ``within`` seconds."""
        ...


@runtime_checkable
class ClosesWithReason(Protocol):
    """An endpoint whose close carries a code and a reason (a WebSocket)."""

    def close_with(self, code: int, reason: str) -> None:
        """Like :meth:`Endpoint.close`, with the close frame's ``code`` and ``reason``; nothing
        changes once the connection is closing already."""
        ...


@runtime_checkable
class Admitting(Protocol):
    """An endpoint that admits each message against the bytes in flight before reading it (the
    HTTP listener's POSTs, refused with 503 when they do not fit): its reader never waits for
    room, and :meth:`Endpoint.receive` hands the message's reservation over to the link."""

    def admits_in_flight(self) -> bool:
        """True: this endpoint's messages are admitted before they are read."""
        ...


@runtime_checkable
class StreamOwner(Protocol):
    """An endpoint that delivers messages on SSE streams (``close_stream`` needs one)."""

    def drop_stream(self, data: bytes) -> None:
        """Kill the stream that would carry ``data``, without writing ``data``."""
        ...
