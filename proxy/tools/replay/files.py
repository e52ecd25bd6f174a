"""Reading a recording file (``.gz`` or plain JSON Lines) into a checked
:class:`~proxy.core.recording.Recording`, with bounded memory.

The file is read a piece at a time (:class:`~proxy.shell.gzipped.Inflater` for gzip, whatever the
name: the first bytes say). A line longer than :data:`MAX_LINE_BYTES` is never held whole (it is
skipped and reported with its number), and the bytes read are bounded by
:data:`MAX_RECORDING_BYTES` in all, counted decompressed as they come: a small gzip file that
inflates to gigabytes stops there at once. A gzip stream cut short (a proxy killed while it
recorded) gives its complete lines, with a warning; compressed data that cannot be read, and a
file that cannot be opened, say so; and the replays refuse a recording of no message of the Client
(:func:`load_replayable`: nothing to replay). Every problem is located
(:class:`~proxy.core.recording.RecordingError`); the commands print them and exit 2.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from proxy.core.errors import os_cause
from proxy.core.events import Direction
from proxy.core.recording import Problem, Recording, RecordingError, RecordingReader
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.gzipped import CHUNK_BYTES, GZIP_MAGIC, Inflater

__all__ = ["MAX_LINE_BYTES", "MAX_RECORDING_BYTES", "load_recording", "load_replayable"]

MAX_LINE_BYTES = DEFAULT_MAX_MESSAGE_BYTES + 64 * 1024
"""The longest line read: the largest message the proxy relays, with room for the line's own
fields."""
MAX_RECORDING_BYTES = 256 * 1024 * 1024
"""Bytes of a recording read at most (256 MiB, decompressed): each message is kept parsed, which
costs a few times its bytes, so a replay stays within a couple of GB whatever the file holds."""


def _to_stderr(text: str) -> None:
    sys.stderr.write(f"{text}\n")


def load_recording(
    path: str | Path,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_bytes: int = MAX_RECORDING_BYTES,
    warn: Callable[[str], None] = _to_stderr,
) -> Recording:
    """The recording in ``path`` (gzip-compressed or not: its first bytes say);
    :class:`~proxy.core.recording.RecordingError` naming every problem and its line. ``warn``
    hears of what was read nonetheless (a gzip stream cut short: its complete lines)."""
    source = str(path)
    reader = RecordingReader(source, max_bytes=max_bytes)
    try:
        with open(path, "rb") as plain:
            compressed = plain.read(len(GZIP_MAGIC)) == GZIP_MAGIC
            plain.seek(0)
            if not compressed:
                _read(iter(lambda: plain.read(CHUNK_BYTES), b""), reader, max_line_bytes, max_bytes)
            else:
                inflater = Inflater(plain)
                read = _read(inflater, reader, max_line_bytes, max_bytes, cut=inflater)
                if inflater.cut_short and read:
                    warn(
                        f"{source}: warning: the compressed data is cut short (a proxy killed "
                        f"while it recorded?); its {read} complete lines are read"
                    )
    except OSError as exc:
        raise RecordingError(source, [Problem(0, f"cannot be read: {os_cause(exc)}")]) from None
    except zlib.error as exc:
        raise RecordingError(source, [Problem(0, f"compressed data unreadable: {exc}")]) from None
    return reader.finish()


def load_replayable(path: str | Path) -> Recording:
    """:func:`load_recording`, and :class:`~proxy.core.recording.RecordingError` too when the
    recording holds no message of the Client (a header alone): there is nothing to replay."""
    recording = load_recording(path)
    if not any(m.direction is Direction.TO_AGENT for m in recording.messages):
        problem = Problem(0, "nothing to replay: the recording holds no message of the Client")
        raise RecordingError(str(path), [problem])
    return recording


def _read(
    chunks: Iterable[bytes],
    reader: RecordingReader,
    limit: int,
    max_bytes: int,
    *,
    cut: Inflater | None = None,
) -> int:
    """Feed ``reader`` the lines of ``chunks`` until it will read no more, or the bytes exceed
    ``max_bytes`` (a problem then); the number of lines read. A last line without its line break
    is dropped when the data was cut short (``cut`` says so) or stopped at the bound."""
    bounded = _Bounded(chunks, max_bytes)
    lines = _Lines(bounded, limit)
    number = 0
    for line in lines:
        cut_off = bounded.exceeded or (cut is not None and cut.cut_short)
        if line is not None and not line.endswith(b"\n") and cut_off:
            break
        number += 1
        if not (reader.feed(number, line) if line is not None else reader.too_long(number, limit)):
            return number
    if bounded.exceeded:
        message = f"the recording holds more than {max_bytes} bytes; not read further"
        reader.problem(number if lines.skipping else number + 1, message)
    return number


class _Bounded:
    """The chunks, until they add up to more than ``max_bytes`` (:attr:`exceeded` then)."""

    def __init__(self, chunks: Iterable[bytes], max_bytes: int) -> None:
        self._chunks = chunks
        self._left = max_bytes
        self.exceeded = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self._left -= len(chunk)
            if self._left < 0:
                self.exceeded = True
                return
            yield chunk


class _Lines:
    """Each line of ``chunks`` with its line break (the last one without, when it has none), or
    ``None`` for one longer than ``limit``, which is never held whole (iterate it)."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks = chunks
        self._limit = limit
        self.skipping = False
        """Inside a line too long (given as ``None`` already), whose end has not come."""

    def __iter__(self) -> Iterator[bytes | None]:
        buffer = bytearray()
        limit = self._limit
        for chunk in self._chunks:
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if self.skipping:
                    self.skipping = False
                else:
                    buffer += chunk[start : end + 1]
                    yield bytes(buffer) if len(buffer) <= limit + 1 else None
                    buffer.clear()
                start = end + 1
            if not self.skipping:
                buffer += chunk[start:]
                if len(buffer) > limit + 1:
                    yield None
                    buffer.clear()
                    self.skipping = True
        if buffer:
            yield bytes(buffer)
