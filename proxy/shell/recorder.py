"""The recording writer (``acp-proxy run --record FILE [--redact PATTERN]``).

An observer beside the trace writer (:mod:`proxy.shell.trace`): it sees what the trace sees, and
keeps what the trace leaves out, the body of every message that left the proxy, both ways, with
its link, direction, time and ids (the format: :mod:`proxy.core.recording`). A connection
joining or leaving a link is a line too. A message a fault stopped did not cross, and is not
recorded; nor is a copy a ``duplicate`` rule injected (the proxy's, not a peer's).

The relay never waits on it: :meth:`RecordWriter.observe` puts what it saw in a bounded queue
(:data:`~proxy.shell.limits.RECORD_BACKLOG`) and a thread of its own redacts
(:mod:`proxy.core.redact`: the body, and the line's ids as the body's), writes and compresses (a
name ending in ``.gz``). When the queue is full the message is dropped from the recording: counted
(``acp_proxy_limits_reached_total {limit="record_backlog"}``), logged once, and summed up when the
recording closes. A message too large to redact (:class:`~proxy.core.splice.ScanLimit`,
:class:`~proxy.core.redact.TooDeep`) is left out too, never written as it came: logged, summed up
at the end. A write that fails stops the recording, never the relay (logged once, ``on_failure``
told: a metric, ``/healthz``). The file is opened as the trace is (no symbolic link followed, no
FIFO waited on), but made readable by its owner alone: it holds what the peers said.
A ``.gz`` file that is there already must be a complete gzip stream (each run adds a member): one
cut short (a proxy killed) or no gzip at all is refused, since a member after it would make it
unreadable.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, NamedTuple

from proxy.core.errors import UnusableFileError, os_cause
from proxy.core.events import Direction, Side
from proxy.core.observations import Connected, Disconnected, Observation
from proxy.core.recording import header_line, link_line, message_line
from proxy.core.redact import Redactor
from proxy.shell.gzipped import incomplete
from proxy.shell.limits import RECORD_BACKLOG, LimitReached
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer
from proxy.shell.trace import open_trace, relayed_of

__all__ = ["RecordWriter"]

log = get_logger("proxy.record")


class _Message(NamedTuple):
    direction: Direction
    pair: tuple[bytes | None, bytes | None]
    raw: bytes


_Line = tuple[str, float, int | None, Side | _Message | None]
"""What waits in the queue: what it is, its time, its link, and what to write of it."""
_STOP: _Line = ("stop", 0.0, None, None)


def _refuse_to_spoil(path: str, fd: int) -> None:
    """Close ``fd`` and raise :class:`~proxy.core.errors.UnusableFileError` when the regular
    file at ``path`` holds something that is not a complete gzip stream: a member appended after
    it would make it unreadable, even by ``zcat``."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_size == 0:
        return
    why = incomplete(path)
    if why is not None:
        os.close(fd)
        cause = (
            f"{why}: appending would make it unreadable; move it away, or record to another file"
        )
        raise UnusableFileError("--record", path, cause)


class RecordWriter:
    """An observer writing every message that crosses the proxy to a recording (see the module)."""

    def __init__(
        self,
        path: str | Path,
        redactor: Redactor | None = None,
        *,
        clock: Callable[[], float] = time.time,
        backlog: int = RECORD_BACKLOG,
        observer: Observer | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """Open ``path`` (:class:`~proxy.core.errors.StartupError` naming ``--record`` when it
        cannot be), write the header and start the writing thread. ``observer`` hears of each
        message dropped for a full queue (a :class:`~proxy.shell.limits.LimitReached`)."""
        self.path = str(path)
        self._redactor = redactor if redactor is not None else Redactor([])
        fd = open_trace(path, "--record", 0o600)  # bodies: readable by their owner alone
        if self.path.endswith(".gz"):
            _refuse_to_spoil(self.path, fd)
        raw: IO[bytes] = os.fdopen(fd, "wb")
        self._file: IO[bytes] = raw
        if self.path.endswith(".gz"):
            self._file = gzip.GzipFile(filename="", mode="wb", fileobj=raw)  # type: ignore[assignment]
        self._raw = raw
        self._clock = clock
        self._observer = observer
        self._on_failure = on_failure
        self._queue: queue.Queue[_Line] = queue.Queue(backlog)
        self.dropped = 0
        """Messages left out of the recording because the queue was full."""
        self.unredactable = 0
        """Messages left out of the recording because they were too large to redact (never
        written as they came: they may hold what was to be redacted)."""
        self.written = 0
        """Lines written (the header included)."""
        self.failure: str | None = None
        """Why the recording stopped, once it has."""
        self._closed = False
        self._write(header_line(clock(), [p.describe() for p in self._redactor.patterns]))
        self._thread = threading.Thread(target=self._run, name="acp-proxy-record", daemon=True)
        self._thread.start()

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Queue what ``observation`` says crossed (never blocks; a full queue drops it)."""
        if self._closed:
            return
        if isinstance(observation, Connected | Disconnected):
            event = "open" if isinstance(observation, Connected) else "close"
            self._put((event, self._clock(), link, observation.side))
            return
        for relayed in relayed_of(observation):
            message = relayed.message
            if relayed.copy or message is None or not message.raw:
                continue
            pair = (relayed.original_id, relayed.forwarded_id)
            what = _Message(relayed.direction, pair, message.raw)
            self._put(("message", self._clock(), link, what))

    def _put(self, item: _Line) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self._observer is not None:
                self._observer.observe(LimitReached("record_backlog", "link"))
            if self.dropped == 1:
                log.warning(
                    "the recording falls behind; messages left out of it",
                    path=self.path,
                    backlog=self._queue.maxsize,
                )

    def close(self) -> None:
        """Write what is queued, then close the file (the relay has ended: this may wait)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        with contextlib.suppress(OSError):
            self._file.close()
            if self._file is not self._raw:
                self._raw.close()
        if self.dropped:
            log.warning("messages left out of the recording", path=self.path, dropped=self.dropped)
        if self.unredactable:
            log.warning(
                "messages too large to redact left out of the recording",
                path=self.path,
                left_out=self.unredactable,
            )

    # -- the writing thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._flush()
                return
            line = self._line(item)
            if line is not None:
                self._write(line)
            if self._queue.empty():
                self._flush()

    def _line(self, item: _Line) -> bytes | None:
        kind, at, link, what = item
        link_number = link if link is not None else 0
        if isinstance(what, _Message):
            try:
                body, redacted = self._redactor.redact(what.raw)
            except ValueError as exc:  # too large to walk (ScanLimit, TooDeep): never unredacted
                self.unredactable += 1
                if self.unredactable == 1:
                    log.warning(
                        "a message too large to redact is left out of the recording",
                        path=self.path,
                        error=str(exc),
                    )
                return None
            pair = (self._redactor.redact_id(what.pair[0]), self._redactor.redact_id(what.pair[1]))
            return message_line(at, link_number, what.direction, pair, body, redacted=redacted)
        assert isinstance(what, Side)
        return link_line(at, link_number, "open" if kind == "open" else "close", what)

    def _write(self, line: bytes) -> None:
        if self.failure is not None:
            return
        try:
            self._file.write(line + b"\n")
            self.written += 1
        except OSError as exc:
            self._stop(os_cause(exc))

    def _flush(self) -> None:
        if self.failure is not None:
            return
        try:
            self._file.flush()
            if self._file is not self._raw:
                self._raw.flush()
        except OSError as exc:
            self._stop(os_cause(exc))

    def _stop(self, cause: str) -> None:
        self.failure = cause
        log.error("writing the recording failed; recording stopped", path=self.path, error=cause)
        if self._on_failure is not None:
            self._on_failure(cause)
