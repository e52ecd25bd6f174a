"""Server-sent events as Streamable HTTP uses them (wire brief 1.2), sans-I/O, both ways.

Each event carries one compact JSON-RPC message in ``data:`` lines, with no ``id:`` or ``event:``
field; comments (``:``) are keep-alives. The decoder follows the SSE rules the SDKs follow: lines
end at CR, LF or CRLF, several ``data:`` lines of one event are joined with ``\\n``, a leading BOM
is dropped, unknown fields are ignored, and an event's data is bounded by ``limit`` bytes (a
larger one is discarded as it streams and reported by an :class:`~proxy.core.framing.Oversized`; a
line too long for any event is dropped to its end, and only a data line makes its event
oversized). The events do not depend on how the stream is cut into chunks.
"""

from __future__ import annotations

from proxy.core.framing import Oversized
from proxy.core.search import CARRIAGE_RETURN, NEWLINE

__all__ = ["KEEPALIVE", "SseDecoder", "encode_event"]

_BOM = b"\xef\xbb\xbf"

KEEPALIVE = b":\n\n"
"""A comment line: keeps idle connections (and the proxies between) from timing out."""


def encode_event(data: bytes) -> bytes:
    """One SSE event carrying ``data`` (one line of JSON: compact JSON has no raw newlines)."""
    if NEWLINE in data or CARRIAGE_RETURN in data:
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    return b"data: " + data + b"\n\n"


class SseDecoder:
    """Turn an SSE byte stream into the data of its events."""

    __slots__ = (
        "_buffer",
        "_data",
        "_data_size",
        "_discarding",
        "_limit",
        "_skipping",
        "_skipping_data",
        "_started",
    )

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._data_size = 0
        self._discarding = 0
        self._skipping = False  # the rest of an over-long line is being dropped
        self._skipping_data = False  # ... and it is a data line (its event is oversized)
        self._started = False

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """Add ``chunk``; return the data of each event it completes, in order."""
        out: list[bytes | Oversized] = []
        buffer = self._buffer
        buffer += chunk
        if not self._started:
            if len(buffer) < 3 and _BOM.startswith(buffer):
                return out  # too early to tell whether the stream starts with a BOM
            self._started = True
            if buffer.startswith(_BOM):
                del buffer[:3]
        start = 0
        while True:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == len(buffer):
                    break  # a CR at the end may be the first half of CRLF
                end, after = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            else:
                end, after = lf, lf + 1
            if self._skipping:
                self._skipping = False  # the end of a line too long to keep
            else:
                self._line(bytes(buffer[start:end]), out)
            start = after
        if start:
            del buffer[:start]
        if len(buffer) > self._limit + 16 and not buffer.endswith(b"\r"):
            # A line longer than any event may be: drop it as it streams, to its end. Only a
            # data line makes its event oversized; a comment or another field is just skipped.
            if not self._skipping:
                self._skipping = True
                self._skipping_data = buffer.partition(b":")[0] == b"data"
            if self._skipping_data:
                self._discarding += len(buffer)
            buffer.clear()
        return out

    def eof(self) -> list[bytes | Oversized]:
        """The stream ended: a CR left at the very end terminated its line.

        An event not yet ended by a blank line is incomplete and discarded, as SSE requires.
        """
        out: list[bytes | Oversized] = []
        if self._buffer.endswith(b"\r") and not self._skipping:
            self._line(bytes(self._buffer[:-1]), out)
        self._buffer.clear()
        self._skipping = False
        self._data = []
        self._data_size = 0
        self._discarding = 0
        return out

    def _line(self, line: bytes, out: list[bytes | Oversized]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line.startswith(b":"):
            return
        name, _, value = line.partition(b":")
        if name != b"data":
            return  # id, event, retry and unknown fields carry nothing for ACP
        if value.startswith(b" "):
            value = value[1:]
        self._data_size += len(value) + 1
        if self._data_size > self._limit:
            self._discarding += len(value)
            self._data.clear()
        else:
            self._data.append(value)

    def _dispatch(self, out: list[bytes | Oversized]) -> None:
        if self._discarding or self._data_size > self._limit:
            out.append(Oversized(max(self._data_size, self._discarding), self._limit))
        elif self._data:
            out.append(b"\n".join(self._data))
        self._data = []
        self._data_size = 0
        self._discarding = 0
