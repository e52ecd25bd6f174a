"""The JSONL trace (``--trace FILE``) and the live event feed (``/api/events``).

One JSON object per line for every message (both hops: the sender's id and the id the proxy wrote
on the next hop), every fault, connection event, restart and finding. A message's ``message``
record is written when the message leaves the proxy: a held one (``delay``, a spaced ``duplicate``
copy) has a ``held`` record when it arrives and its ``message`` record, carrying the same ``hold``,
when it is sent, so the order of the records is the order on the wire. Each line is written with a
single ``write`` and flushed, so a crash loses at most the line being written. The records are
:mod:`proxy.core.records` (docs/trace.md); ``report`` reads them back with it.

The file is opened without following a symbolic link in its place and without blocking (a FIFO
planted there is refused, never waited on); it must be a regular file (``-`` is stdout instead).
A write that fails during the run (a full disk, a size limit) stops the trace, never the relay:
it is logged once, and ``on_failure`` hears it (a metric, ``/healthz``).

The trace never holds what the peers said, only its shape. A live subscriber may ask for more
(``/api/events?bodies=1``, what the dashboard shows on a click): each ``message`` and ``held``
record it gets then carries ``body``, the message's JSON text as it arrived, cut at
:data:`SHOWN_BODY` bytes (``truncated: true`` then). Bodies go to such subscribers only, never
to the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import orjson

from proxy.core.errors import StartupError, UnusableFileError, os_cause
from proxy.core.jsonrpc import Message
from proxy.core.observations import Held, Observation, Relayed, RelayedRun
from proxy.core.records import TRACE_VERSION, TraceHeader, encode, records_of
from proxy.core.sse import encode_event
from proxy.shell.descriptors import write_all
from proxy.shell.limits import DEFAULT_MAX_EVENT_SUBSCRIBERS, EVENT_BACKLOG, LimitReached
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer

__all__ = [
    "SHOWN_BODY",
    "STDOUT",
    "EventFeed",
    "Subscription",
    "TraceWriter",
    "open_trace",
    "relayed_of",
]

log = get_logger("proxy.trace")

STDOUT: Final = "-"
"""The ``--trace`` value that means the proxy's stdout."""
SHOWN_BODY: Final = 16 * 1024
"""The bytes of a message's body a live subscriber that asks for bodies gets (the rest is cut)."""


def open_trace(path: str | Path, option: str = "--trace", mode: int = 0o644) -> int:
    """A file descriptor to append the trace to; :class:`~proxy.core.errors.StartupError` (naming
    ``option``, the path and why) when ``path`` is a symbolic link, neither a regular file nor
    ``/dev/null`` (a FIFO, a socket, a terminal), or cannot be opened for writing
    (:class:`~proxy.core.errors.UnusableFileError`, a usage error, when it is a directory). ``-`` is
    stdout, whatever it is. A file made anew gets ``mode``."""
    if str(path) == STDOUT:
        return os.dup(1)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            cause = "a symbolic link; give the file itself"
        elif exc.errno == errno.EISDIR:
            raise UnusableFileError(option, str(path), "a directory; give a file") from None
        elif exc.errno == errno.ENXIO:  # a FIFO that no process reads
            cause = "not a regular file"
        else:
            cause = os_cause(exc)
        raise StartupError(option, str(path), cause) from None
    try:
        if not (stat.S_ISREG(os.fstat(fd).st_mode) or os.path.samefile(path, os.devnull)):
            raise StartupError(option, str(path), "not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class TraceWriter:
    """An observer appending each trace record as one line to a file.

    A write that fails stops the trace (logged once, ``on_failure`` called with the cause, the
    file closed) and every later record is dropped: the relay never waits on nor fails with it.
    The line being written then may be left cut short at the end of the file.
    """

    def __init__(
        self,
        path: str | Path,
        clock: Callable[[], float] = time.time,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """Open ``path`` (see :func:`open_trace`: raises :class:`~proxy.core.errors.StartupError`)
        and write the header line."""
        self.path = str(path)
        self._fd: int | None = open_trace(path)
        self._clock = clock
        self._on_failure = on_failure
        self.failure: str | None = None
        """Why the trace stopped, once it has."""
        self._write(encode(TraceHeader(time=clock(), version=TRACE_VERSION)))

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Append the observation's record (one write, unbuffered)."""
        if self._fd is None:
            return
        for record in records_of(observation, link, self._clock()):
            self._write(encode(record))

    def _write(self, line: bytes) -> None:
        if self._fd is None:
            return
        data = line + b"\n"
        try:
            write_all(self._fd, data)
        except OSError as exc:
            self._stop(os_cause(exc))

    def _stop(self, cause: str) -> None:
        self.failure = cause
        self.close()
        log.error("writing the trace failed; tracing stopped", path=self.path, error=cause)
        if self._on_failure is not None:
            self._on_failure(cause)

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


class Subscription:
    """One ``/api/events`` subscriber: the SSE events waiting to be written to it."""

    def __init__(self, backlog: int, *, bodies: bool = False) -> None:
        self.events: asyncio.Queue[bytes] = asyncio.Queue(backlog)
        self.bodies = bodies
        """Whether its ``message`` and ``held`` records carry the message's body."""
        self.dropped = asyncio.Event()
        """Set when it was dropped for falling behind; its stream ends."""


class EventFeed:
    """Trace records, as SSE events, for live subscribers (``/api/events``).

    At most ``max_subscribers`` at once (:meth:`subscribe` answers None past them). Each record is
    encoded once for them all. A subscriber with ``backlog`` events waiting when the next comes
    is dropped: its backlog is let go, :attr:`Subscription.dropped` is set, it is counted
    (``event_backlog``) and logged. So a subscriber that does not read costs the relay one
    queue's worth of memory and then nothing.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        max_subscribers: int = DEFAULT_MAX_EVENT_SUBSCRIBERS,
        backlog: int = EVENT_BACKLOG,
        observer: Observer | None = None,
    ) -> None:
        """``observer`` hears of each subscriber dropped (a :class:`LimitReached`)."""
        self._subscribers: set[Subscription] = set()
        self._clock = clock
        self.max_subscribers = max_subscribers
        self.backlog = backlog
        self._observer = observer

    def subscribe(self, *, bodies: bool = False) -> Subscription | None:
        """A new subscription (pass it to :meth:`unsubscribe` when done), with the messages'
        bodies if asked; None when there are ``max_subscribers`` already."""
        if len(self._subscribers) >= self.max_subscribers:
            return None
        subscription = Subscription(self.backlog, bodies=bodies)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop feeding ``subscription``."""
        self._subscribers.discard(subscription)

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Hand the observation's record to every subscriber (never blocks)."""
        if not self._subscribers:
            return
        behind = []
        records = records_of(observation, link, self._clock())
        lines = [encode(record) for record in records]
        plain = [encode_event(line) for line in lines]
        shown = plain
        if any(subscription.bodies for subscription in self._subscribers):
            messages = _messages(observation)
            if messages is not None and len(messages) == len(lines):
                shown = [_with_body(line, m) for line, m in zip(lines, messages, strict=True)]
        for subscription in self._subscribers:
            for event in shown if subscription.bodies else plain:
                try:
                    subscription.events.put_nowait(event)
                except asyncio.QueueFull:
                    behind.append(subscription)
                    break
        for subscription in behind:
            self._drop(subscription)

    def _drop(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
        events = subscription.events
        while not events.empty():
            events.get_nowait()
        subscription.dropped.set()
        if self._observer is not None:
            self._observer.observe(LimitReached("event_backlog", "admin"))
        log.warning("event subscriber dropped: it did not read its backlog", backlog=self.backlog)


def relayed_of(observation: Observation) -> list[Relayed]:
    """The messages an observation says left the proxy, each as its :class:`Relayed` (a run's
    one by one); none for another observation."""
    match observation:
        case Relayed():
            return [observation]
        case RelayedRun():
            return observation.each()
    return []


def _messages(observation: Observation) -> list[Message | None] | None:
    """The messages whose records :func:`~proxy.core.records.records_of` gives for
    ``observation``, in order; None for an observation of no message."""
    if isinstance(observation, Held):
        return [observation.relayed.message]
    relayed = relayed_of(observation)
    return [each.message for each in relayed] if relayed else None


def _with_body(line: bytes, message: Message | None) -> bytes:
    """The SSE event of a record's ``line`` with ``body`` (and ``truncated``) added."""
    if message is None:
        return encode_event(line)
    raw = message.raw or orjson.dumps(message.body)  # a worker's compacted message has no raw
    cut = len(raw) > SHOWN_BODY
    text = raw[:SHOWN_BODY].decode("utf-8", "replace")
    extra = b',"body":' + orjson.dumps(text) + (b',"truncated":true' if cut else b"")
    return encode_event(line[:-1] + extra + b"}")
