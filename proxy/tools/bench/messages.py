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
    "update_line",
    "update_text",
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


def update_text(seq: int) -> str:
    """The ``seq``-th notification of a stream, a WebSocket text message of its own."""
    return update_line(seq)[:-1].decode()


def echo_result(params: Any) -> dict[str, Any]:
    """The WebSocket Agent's result for a request with ``params``."""
    return {"ok": True, "echo": params}


_DISTINCT = 1000
"""Notifications of a stream numbered apart before their numbers repeat (:func:`updates`)."""
_LINES = [update_line(seq) for seq in range(_DISTINCT)]
_CYCLE = b"".join(_LINES)
_STARTS = [0, *itertools.accumulate(map(len, _LINES))]
"""Where each line of :data:`_CYCLE` starts (and, last, where the cycle ends)."""


def updates(count: int) -> bytes:
    """``count`` notifications of a stream, each a line of its own, in one block, numbered
    modulo :data:`_DISTINCT`: the block is :data:`_CYCLE`, built once, repeated (a copy in C).
    Writing a line built per notification made the stdio Agent the bottleneck of ``direct``
    (1.5-1.8 million a second), which then hid how fast the Client reads."""
    whole, rest = divmod(count, _DISTINCT)
    return _CYCLE * whole + _CYCLE[: _STARTS[rest]]
