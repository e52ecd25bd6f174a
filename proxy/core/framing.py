"""Newline-delimited framing (stdio), as a sans-I/O decoder with a size limit.

Feed it chunks as they arrive; it returns whole lines and :class:`Oversized` markers. A line longer
than the limit is never buffered whole: the framer keeps at most ``limit`` bytes, discards the
rest of that line as it streams past, and reports its full size once the newline arrives. Blank
lines are skipped, as the ACP SDKs do. A last line without a newline is delivered at EOF.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LineFramer", "Oversized"]

SPLIT_AT_MOST = 1024 * 1024
"""Complete lines of at most this many bytes in all are split in one call; more (a message of
many MB) are cut one at a time, so that none is copied twice."""


@dataclass(frozen=True, slots=True)
class Oversized:
    """A message of ``size`` bytes was discarded because it exceeds ``limit``."""

    size: int
    limit: int


class LineFramer:
    """Split a byte stream into messages at ``\\n``; at most ``limit`` bytes per message."""

    __slots__ = ("_buffer", "_discarding", "_limit", "_scanned", "oversized")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the message size limit must be at least one byte")
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline
        self._discarding = 0  # > 0: size so far of an oversized line being skipped
        self.oversized = 0
        """:class:`Oversized` markers returned so far."""

    def feed(self, data: bytes) -> list[bytes | Oversized]:
        """Add ``data``; return the messages it completes, in order."""
        out: list[bytes | Oversized] = []
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                self._discarding += len(data)
                return out
            out.append(Oversized(self._discarding + newline, self._limit))
            self.oversized += 1
            self._discarding = 0
            data = data[newline + 1 :]
        buffer = self._buffer
        if not buffer and len(data) <= SPLIT_AT_MOST:  # the usual read: nothing pending before it
            buffer += self._split_read(data, out)
        else:
            buffer += data
            end = buffer.rfind(b"\n", self._scanned)
            if end >= 0:
                if buffer.find(b"\n", self._scanned) == end:  # one line: no split (a scan of it)
                    self._emit(bytes(memoryview(buffer)[:end]), out)
                elif end <= SPLIT_AT_MOST:  # many lines: copied once, split in C
                    self._emit_all(bytes(memoryview(buffer)[:end]).split(b"\n"), out)
                else:  # a large message: each line copied once from a view (a slice would copy it)
                    start = 0
                    while start <= end:
                        newline = buffer.find(b"\n", start)
                        self._emit(bytes(memoryview(buffer)[start:newline]), out)
                        start = newline + 1
                del buffer[: end + 1]
        self._scanned = len(buffer)
        if len(buffer) > self._limit:
            self._discarding = len(buffer)
            buffer.clear()
            self._scanned = 0
        return out

    def fits(self, size: int) -> bool:
        """Whether feeding ``size`` more bytes cannot mark a message too large (none is being
        discarded, and the line under way with them stays within the limit)."""
        return not self._discarding and len(self._buffer) + size <= self._limit

    def eof(self) -> list[bytes | Oversized]:
        """The stream ended: deliver what is left of an unterminated last line."""
        out: list[bytes | Oversized] = []
        if self._discarding:
            out.append(Oversized(self._discarding, self._limit))
            self.oversized += 1
            self._discarding = 0
        elif self._buffer:
            self._emit(bytes(self._buffer), out)
        self._buffer.clear()
        self._scanned = 0
        return out

    def _split_read(self, data: bytes, out: list[bytes | Oversized]) -> bytes:
        """Emit the lines ``data`` completes, split where they lie: a read with nothing pending
        before it is not copied into the buffer first (a fresh buffer of 256 KiB is new pages of
        memory: copying a read of many lines cost as much as splitting it). Return what follows
        its last newline, the start of a line."""
        end = data.rfind(b"\n")
        if end < 0:
            return data
        if data.find(b"\n") == end:  # one line: no split (a scan of it)
            self._emit(data[:end], out)
            return data[end + 1 :]
        lines = data.split(b"\n")
        rest = lines.pop()
        self._emit_all(lines, out)
        return rest

    def _emit_all(self, lines: list[bytes], out: list[bytes | Oversized]) -> None:
        """:meth:`_emit` each of ``lines``, all at once when none is too long or blank."""
        limit = self._limit
        if max(map(len, lines)) <= limit and all(lines) and not any(map(bytes.isspace, lines)):
            out += lines
            return
        for line in lines:
            self._emit(line, out)

    def _emit(self, line: bytes, out: list[bytes | Oversized]) -> None:
        if len(line) > self._limit:
            out.append(Oversized(len(line), self._limit))
            self.oversized += 1
        elif line and not line.isspace():
            out.append(line)
