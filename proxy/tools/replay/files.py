"""Reading a recording file (``.gz`` or plain JSON Lines) into a checked
:class:`~proxy.core.recording.Recording`, with bounded memory.

A line longer than :data:`MAX_LINE_BYTES` is not read into memory (it is skipped in pieces and
reported with its number), the lines kept are bounded by :data:`MAX_RECORDING_BYTES` in all
(decompressed: a small gzip file that inflates to gigabytes stops there), and a file that
cannot be read, is no gzip or is cut short says so. Every problem is located
(:class:`~proxy.core.recording.RecordingError`); the commands print them and exit 2.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO

from proxy.core.errors import os_cause
from proxy.core.recording import Problem, Recording, RecordingError, RecordingReader
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["MAX_LINE_BYTES", "MAX_RECORDING_BYTES", "load_recording"]

MAX_LINE_BYTES = DEFAULT_MAX_MESSAGE_BYTES + 64 * 1024
"""The longest line read: the largest message the proxy relays, with room for the line's own
fields."""
MAX_RECORDING_BYTES = 256 * 1024 * 1024
"""Bytes of lines a replay holds in memory at most (256 MiB): each message is kept parsed, which
costs a few times its bytes, so a replay stays within a couple of GB whatever the file holds."""
_GZIP_MAGIC = b"\x1f\x8b"


def load_recording(
    path: str | Path,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_bytes: int = MAX_RECORDING_BYTES,
) -> Recording:
    """The recording in ``path`` (gzip-compressed or not: its first bytes say);
    :class:`~proxy.core.recording.RecordingError` naming every problem and its line."""
    source = str(path)
    reader = RecordingReader(source, max_bytes=max_bytes)
    try:
        with open(path, "rb") as plain:
            compressed = plain.read(2) == _GZIP_MAGIC
            plain.seek(0)
            if compressed:
                with gzip.GzipFile(fileobj=plain) as inflated:
                    _read(inflated, reader, max_line_bytes)
            else:
                _read(plain, reader, max_line_bytes)
    except OSError as exc:
        if isinstance(exc, gzip.BadGzipFile):
            cause = f"not a readable gzip file ({exc})"
        else:
            cause = os_cause(exc)
        raise RecordingError(source, [Problem(0, f"cannot be read: {cause}")]) from None
    except (EOFError, zlib.error) as exc:
        cause = "cut short" if isinstance(exc, EOFError) else str(exc)
        raise RecordingError(source, [Problem(0, f"compressed data unreadable: {cause}")]) from None
    return reader.finish()


def _read(stream: gzip.GzipFile | BinaryIO, reader: RecordingReader, limit: int) -> None:
    number = 0
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            reader.too_long(number, limit)
            while line and not line.endswith(b"\n"):  # the rest of it, a piece at a time
                line = stream.readline(limit)
            continue
        if not reader.feed(number, line):
            return
