"""Pending requests of one direction of a link: the proxy's own ids on the next hop.

Each peer chooses ids for its own requests, so a link keeps one :class:`IdMap` per direction
(the same id may be pending both ways at once). The proxy mints its own id for every request it
forwards and remembers the sender's exact bytes to put back on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.jsonrpc import IdKey

__all__ = ["IdMap", "Pending"]


@dataclass(slots=True)
class Pending:
    """A forwarded request still waiting for its answer."""

    forwarded_id: bytes
    """The id the proxy wrote on the next hop."""
    original_id: bytes
    """The id as the sender wrote it; the answer gets exactly these bytes back."""
    original_key: IdKey
    method: str
    session: str | None
    at: float


class IdMap:
    """Requests travelling one way, by the proxy's id and by the sender's id."""

    __slots__ = ("_by_forwarded", "_by_original", "_next")

    def __init__(self, first_id: int = 0) -> None:
        self._next = first_id
        self._by_forwarded: dict[bytes, Pending] = {}
        self._by_original: dict[IdKey, list[Pending]] = {}

    def __len__(self) -> int:
        return len(self._by_forwarded)

    def add(
        self, original_id: bytes, original_key: IdKey, method: str, session: str | None, at: float
    ) -> Pending:
        """Mint the next-hop id for a request and remember it."""
        forwarded = str(self._next).encode()
        self._next += 1
        pending = Pending(forwarded, original_id, original_key, method, session, at)
        self._by_forwarded[forwarded] = pending
        self._by_original.setdefault(original_key, []).append(pending)
        return pending

    def pending_with(self, original_key: IdKey) -> list[Pending]:
        """The requests still pending under the sender's id (more than one if it reused it)."""
        return self._by_original.get(original_key, [])

    def get(self, forwarded_id: bytes) -> Pending | None:
        """The request the next hop knows as ``forwarded_id``, if still pending."""
        return self._by_forwarded.get(forwarded_id)

    def pop(self, forwarded_id: bytes) -> Pending | None:
        """Forget and return the request answered under ``forwarded_id``, if pending."""
        pending = self._by_forwarded.pop(forwarded_id, None)
        if pending is not None:
            same = self._by_original[pending.original_key]
            same.remove(pending)
            if not same:
                del self._by_original[pending.original_key]
        return pending

    def clear(self) -> list[Pending]:
        """Forget every pending request and return them."""
        pending = list(self._by_forwarded.values())
        self._by_forwarded.clear()
        self._by_original.clear()
        return pending
