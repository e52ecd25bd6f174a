"""What the bench and its Agents say to one another: the bench's methods, the bounds of one
message, the notification the Agents stream and the answer the WebSocket Agent echoes.

Standard library only, nothing else of the bench: the bench Agents import it.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = [
    "PING_METHOD",
    "READ_LIMIT",
    "STREAM_METHOD",
    "UPDATE_MARK",
    "echo_result",
    "text_frame",
    "update_frames",
    "update_line",
    "updates",
]

PING_METHOD = "_bench/ping"
"""A small request every Agent answers at once."""
STREAM_METHOD = "_bench/stream"
"""Params ``{"count": N}``: the Agent first writes N ``session/update`` notifications."""
UPDATE_MARK = b'"session/update"'
"""What every streamed notification holds, as a Client counts them."""
READ_LIMIT = 1 << 20
"""Bytes of one message any bench process reads, at most."""

_UPDATE_HEAD = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"bench-1","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk '
)


def update_line(seq: int) -> bytes:
    """The ``seq``-th notification of a stream, a line of its own."""
    return b'%s%d"}}}}\n' % (_UPDATE_HEAD, seq)


def text_frame(payload: bytes) -> bytes:
    """``payload`` as one unmasked WebSocket text frame (RFC 6455 5.2), as a server sends it."""
    size = len(payload)
    if size < 126:
        head = bytes((0x81, size))
    elif size < 1 << 16:
        head = bytes((0x81, 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((0x81, 127)) + size.to_bytes(8, "big")
    return head + payload


def echo_result(params: Any) -> dict[str, Any]:
    """The WebSocket Agent's result for a request with ``params``."""
    return {"ok": True, "echo": params}


_DISTINCT = 1000
"""Notifications of a stream numbered apart before their numbers repeat (:class:`_Cycle`)."""


class _Cycle:
    """The first N of pieces that repeat, in one block: the pieces joined once, the block
    repeated and cut (copies in C). Writing a piece built per notification made the bench
    Agents the bottleneck of ``direct`` (the stdio one at 1.5-1.8 million a second, the
    WebSocket one at about 270,000), which then hid how fast the Client reads."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._block = b"".join(pieces)
        self._starts = [0, *itertools.accumulate(map(len, pieces))]
        self._count = len(pieces)

    def first(self, count: int) -> bytes:
        """The first ``count`` pieces of the endless repetition, in one block (none for a
        count below 1)."""
        whole, rest = divmod(max(count, 0), self._count)
        return self._block * whole + self._block[: self._starts[rest]]


_LINES = _Cycle([update_line(seq) for seq in range(_DISTINCT)])
_FRAMES = _Cycle([text_frame(update_line(seq)[:-1]) for seq in range(_DISTINCT)])


def updates(count: int) -> bytes:
    """``count`` notifications of a stream, each a line of its own, in one block, numbered
    modulo :data:`_DISTINCT`."""
    return _LINES.first(count)


def update_frames(count: int) -> bytes:
    """``count`` notifications of a stream, each a WebSocket text frame of its own (unmasked,
    as a server sends them), in one block, numbered modulo :data:`_DISTINCT`."""
    return _FRAMES.first(count)
