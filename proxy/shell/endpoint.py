"""The one interface every transport adapts its library to: a connection to one peer.

A transport knows framing and nothing of JSON-RPC or faults. Its endpoint yields whole messages
(or :class:`~proxy.core.framing.Oversized` markers) and takes whole messages to send, buffered and
in order; :meth:`Endpoint.drain` is where backpressure reaches the reader of the other peer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
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
    "RelaysInPlace",
    "Severed",
    "Signalable",
    "Sliced",
    "StreamOwner",
    "bytes_of",
    "joined",
    "pieces",
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


def pieces(data: bytes, sizes: Sequence[int], *, text: bool = False) -> list[bytes]:
    """``data`` cut in pieces of ``sizes`` bytes in turn, what is left after them as one more
    (``slice``). ``text``: no piece ends inside a UTF-8 character (a cut that would moves back to
    the character's start, or past its end when that would leave the piece empty)."""
    out: list[bytes] = []
    start, end = 0, len(data)
    for size in sizes:
        if start >= end:
            break
        cut = min(start + size, end)
        if text and cut < end:
            back = cut
            while back > start and data[back] & 0xC0 == 0x80:  # a continuation byte
                back -= 1
            if back == start:
                while cut < end and data[cut] & 0xC0 == 0x80:
                    cut += 1
            else:
                cut = back
        out.append(data[start:cut])
        start = cut
    if start < end:
        out.append(data[start:])
    return out


class Sliced:
    """A message a transport writes in pieces (``slice``): the bytes it writes for it (a line,
    an SSE event, a frame's payload, a body), their :func:`pieces`' sizes and the gap between."""

    __slots__ = ("data", "gap", "sizes")

    def __init__(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        self.data = data
        self.sizes = sizes
        self.gap = gap

    def __len__(self) -> int:
        return len(self.data)

    def parts(self, *, text: bool = False) -> list[bytes]:
        """The pieces to write (``text``: none ends inside a UTF-8 character)."""
        return pieces(self.data, self.sizes, text=text)

    async def chunks(
        self, *, text: bool = False, cut: asyncio.Event | None = None
    ) -> AsyncIterator[bytes]:
        """The pieces, each ``gap`` seconds after the one before; ``cut`` set (the connection
        was severed): no more of them, and :class:`Severed` raised."""
        for index, part in enumerate(self.parts(text=text)):
            if index and self.gap > 0:
                if cut is None:
                    await asyncio.sleep(self.gap)
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.gap):
                            await cut.wait()
            if cut is not None and cut.is_set():
                raise Severed("the connection was cut while a message was written in pieces")
            yield part

    def span(self) -> float:
        """Seconds its gaps add up to."""
        if self.gap <= 0:
            return 0.0
        count = covered = 0
        for size in self.sizes:
            if covered >= len(self.data):
                break
            covered += size
            count += 1
        count += covered < len(self.data)  # the rest, as one more piece
        return self.gap * max(count - 1, 0)


class Severed(ConnectionError):
    """A message written in pieces met the cut of its connection: the rest never comes."""


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

    def send_sliced(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        """Queue the message ``data`` to be written in pieces (:func:`pieces` of the bytes the
        transport writes for it), ``gap`` seconds apart (``slice``); what is sent after it is
        written after its last piece. The peer reads the message whole."""
        ...

    def will_flush(self) -> None:
        """The caller calls :meth:`flush` before it yields to the event loop (the link, relaying
        in a read's callback): until then what is sent waits for that flush, and no write is
        scheduled for the end of this turn of the loop (a transport whose own task writes:
        nothing to do)."""
        ...

    def flush(self) -> None:
        """Write what was sent now, without waiting (a transport whose own task writes: nothing
        to do)."""
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
class RelaysInPlace(Protocol):
    """An endpoint that can hand what arrives to the link in the read's own callback (no task
    woken: the shortest path a message can take through the proxy)."""

    def relay_in_place(
        self,
        ready: Callable[[], bool],
        relay: Callable[[list[bytes]], None],
        large: Callable[[bytes], bool],
        small: int,
    ) -> None:
        """From now on, offer ``relay`` the messages that arrive while ``ready`` says so and
        none of them is ``large`` (none under ``small`` bytes is); the others are received as
        usual."""
        ...

    def hand_over(self, messages: list[bytes]) -> None:
        """Messages given to ``relay`` that the link could not relay: received next, in order."""
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
