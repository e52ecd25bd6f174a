"""What the relay core asks of its shell: deliver bytes, close a peer, and record what it saw.

Commands are named in the imperative (:class:`Send`, :class:`Close`); observations, also returned
by the core, are facts in the past tense for logs, counters and (later) metrics and the trace.
The one interpreter of these is :mod:`proxy.link`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.events import Direction, Side
from proxy.jsonrpc import InvalidReason, Kind

__all__ = [
    "CancelDropped",
    "Close",
    "Command",
    "Handling",
    "IdReused",
    "InvalidSeen",
    "Observation",
    "Orphaned",
    "PeerGone",
    "Relayed",
    "Send",
    "Undeliverable",
    "Unroutable",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Write one framed message to ``to``."""

    to: Side
    data: bytes


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection to ``side``."""

    side: Side


@dataclass(frozen=True, slots=True)
class Observation:
    """Base of everything the core records."""


@dataclass(frozen=True, slots=True)
class Relayed(Observation):
    """A message was forwarded (its id rewritten where it had one)."""

    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    size: int
    original_id: bytes | None = None
    forwarded_id: bytes | None = None
    duration: float | None = None
    """For a response: seconds since its request was forwarded."""


class Handling(enum.StrEnum):
    """What the proxy did with an invalid message."""

    FORWARDED = "forwarded as is"
    ANSWERED = "answered by the proxy"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class InvalidSeen(Observation):
    """A message that is not usable JSON-RPC arrived, and what was done with it."""

    direction: Direction
    reason: InvalidReason
    size: int
    detail: str
    handling: Handling


@dataclass(frozen=True, slots=True)
class Orphaned(Observation):
    """A response whose id matches no pending request was dropped."""

    direction: Direction
    id: bytes
    kind: Kind


@dataclass(frozen=True, slots=True)
class Unroutable(Observation):
    """An error with ``"id": null`` (a parse error answer) was forwarded as it was."""

    direction: Direction
    size: int


@dataclass(frozen=True, slots=True)
class CancelDropped(Observation):
    """A ``$/cancel_request`` named no pending request (unknown or answered); it was dropped."""

    direction: Direction
    request_id: bytes | None


@dataclass(frozen=True, slots=True)
class IdReused(Observation):
    """A peer sent a request whose id it still has pending; both are relayed."""

    direction: Direction
    id: bytes
    method: str


@dataclass(frozen=True, slots=True)
class Undeliverable(Observation):
    """A message arrived for a peer whose connection is already closed; it was dropped."""

    direction: Direction
    kind: Kind
    size: int


@dataclass(frozen=True, slots=True)
class PeerGone(Observation):
    """The stream from ``side`` ended; ``abandoned`` requests sent to it stay unanswered."""

    side: Side
    abandoned: int


Command = Send | Close | Observation
