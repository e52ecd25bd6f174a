"""What the relay core asks of its shell: deliver bytes, close a peer, start a timer...

Commands are named in the imperative (:class:`Send`, :class:`Close`). The core returns them
together with what it saw (:mod:`proxy.core.observations`: facts in the past tense), in the order
they must happen: :data:`Command` is either. The one interpreter of these is
:mod:`proxy.shell.link`.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.events import Side
from proxy.core.observations import Observation
from proxy.core.values import value

__all__ = [
    "Close",
    "Command",
    "DropStream",
    "FailPost",
    "ForgetTimer",
    "Restart",
    "Send",
    "SendCut",
    "SendRun",
    "Sever",
    "SignalAgent",
    "StartTimer",
]


@value
class Send:
    """Write one framed message to ``to``; with ``pieces``, in pieces of those sizes (what is
    left after them: one more), ``gap`` seconds apart, the next message to ``to`` behind the
    last piece (``slice``)."""

    to: Side
    data: bytes
    pieces: tuple[int, ...] = ()
    gap: float = 0.0


@value
class SendRun:
    """Write the messages ``data`` to ``to``, in order, each framed as :class:`Send` frames one
    (the notifications of one :class:`~proxy.core.events.BurstReceived` relayed as they came)."""

    to: Side
    data: Sequence[bytes]


@value
class SendCut:
    """Write the first ``cut`` bytes of the message ``data`` to ``to``, as its transport carries
    a message cut short (on stdio, no line end), then sever ``to``: the rest never comes."""

    to: Side
    data: bytes
    cut: int


@value
class Close:
    """Close the connection to ``side``."""

    side: Side


@value
class StartTimer:
    """Feed :class:`~proxy.core.events.TimerFired` with ``token`` after ``delay`` seconds.

    ``size``: the bytes of the messages held until then (the shell bounds what timers hold).
    ``fault``: the timer is a fault in progress (a message held, a copy spaced, a command
    delayed: the shell counts it in :class:`~proxy.core.engine.ActiveFaults`), not a deadline.
    """

    delay: float
    token: int
    size: int = 0
    fault: bool = True


@value
class ForgetTimer:
    """Timer ``token`` has nothing left to do: what it held went early (a ``reorder``
    overtaken, a ``stall`` that ended). The shell stops counting what it holds and need not
    fire it (if it fires, the relay does nothing)."""

    token: int


@value
class Sever:
    """Cut the connection to ``side`` both ways; ``flush``: write what is queued first.

    ``close_code`` is the WebSocket close code where the connection is a WebSocket.
    """

    side: Side
    flush: bool
    close_code: int = 1001


@value
class SignalAgent:
    """Send ``signal`` to the spawned Agent; ``respawn``: start a new one on the same link."""

    signal: int
    respawn: bool


@value
class Restart:
    """Restart the data plane: close connections, forget id maps, stay down ``downtime``."""

    downtime: float


@value
class FailPost:
    """Answer the POST that carried the message being handled with ``status`` (HTTP only), with
    an ``Acp-Fault`` header holding ``attribution`` (JSON) unless it is None."""

    status: int
    attribution: str | None = None


@value
class DropStream:
    """Kill the SSE stream toward ``to`` that would carry ``data``; ``data`` is lost (HTTP)."""

    to: Side
    data: bytes


Command = (
    Send
    | SendRun
    | SendCut
    | Close
    | Sever
    | StartTimer
    | ForgetTimer
    | SignalAgent
    | Restart
    | FailPost
    | DropStream
    | Observation
)
