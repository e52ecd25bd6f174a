"""What happens to a link, as data fed into the relay core: the sides, the directions, the events.

Events are named in the past tense and carry ``at``, the time the shell saw them (seconds on the
shell's monotonic clock), so the core never reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from proxy.core.jsonrpc import Batch, Invalid, Message
from proxy.core.values import value

__all__ = [
    "BurstReceived",
    "Direction",
    "Event",
    "MessageReceived",
    "OversizedReceived",
    "PeerClosed",
    "Side",
    "TimerFired",
]


class Side(enum.StrEnum):
    """A peer of a link: the Client (downstream) or the Agent (upstream)."""

    CLIENT = "client"
    AGENT = "agent"

    @property
    def other(self) -> Side:
        """The peer on the far side of the proxy."""
        return Side.AGENT if self is Side.CLIENT else Side.CLIENT

    @property
    def outbound(self) -> Direction:
        """The direction of what this peer sends."""
        return Direction.TO_AGENT if self is Side.CLIENT else Direction.TO_CLIENT


class Direction(enum.StrEnum):
    """Which way a message travels."""

    TO_AGENT = "to_agent"
    TO_CLIENT = "to_client"

    @property
    def source(self) -> Side:
        """The peer that sent a message travelling this way."""
        return Side.CLIENT if self is Direction.TO_AGENT else Side.AGENT

    @property
    def destination(self) -> Side:
        """The peer a message travelling this way is for."""
        return Side.AGENT if self is Direction.TO_AGENT else Side.CLIENT

    @property
    def reverse(self) -> Direction:
        """The opposite direction (the one a response to this message travels)."""
        return Direction.TO_CLIENT if self is Direction.TO_AGENT else Direction.TO_AGENT


@value
class MessageReceived:
    """One framed message arrived from ``side``."""

    side: Side
    data: bytes
    at: float
    parsed: Message | Batch | Invalid | None = None
    """Its parse, when the shell made it already (a large message, parsed off the event loop:
    :mod:`proxy.core.compact`); the relay parses ``data`` otherwise."""


@value
class BurstReceived:
    """Messages that arrived from ``side`` together (the lines of one read), in order.

    Fed to :meth:`~proxy.core.relay.Relay.handle_burst`, which does with them what it does with
    a :class:`MessageReceived` each, in one pass: a run of notifications no rule matches goes on
    as one send and one observation.
    """

    side: Side
    messages: Sequence[bytes]
    at: float


@value
class OversizedReceived:
    """A message of ``size`` bytes from ``side`` was discarded by framing (over ``limit``)."""

    side: Side
    size: int
    limit: int
    at: float


@value
class PeerClosed:
    """The connection to ``side`` ended (EOF, process exit, socket closed)."""

    side: Side
    at: float


@value
class TimerFired:
    """A timer the core asked for (:class:`~proxy.core.commands.StartTimer`) has expired."""

    token: int
    at: float


Event = MessageReceived | OversizedReceived | PeerClosed | TimerFired
