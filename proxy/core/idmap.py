"""Pending requests of one direction of a link: the proxy's own ids on the next hop.

Each peer chooses ids for its own requests, so a link keeps one :class:`IdMap` per direction
(the same id may be pending both ways at once). The proxy mints its own id for every request it
forwards and remembers the sender's exact bytes to put back on the answer. The counter that mints
ids is passed in, so that after a restart of the data plane new ids never repeat old ones (a late
answer to a forgotten request can then never be taken for the answer to a new one).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from proxy.core.jsonrpc import IdKey

__all__ = ["DuplicateGroup", "IdMap", "Pending"]


@dataclass(slots=True)
class DuplicateGroup:
    """A request and the copies the proxy injected of it: only the first answer is relayed."""

    answered: bool = False


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
    keyed: bool = False
    """Whether the request carried ``params.idempotencyKey``."""
    group: DuplicateGroup | None = field(default=None)


class IdMap:
    """Requests travelling one way, by the proxy's id and by the sender's id."""

    __slots__ = ("_by_forwarded", "_by_original", "_ids")

    def __init__(self, ids: Iterator[int] | None = None) -> None:
        self._ids = ids if ids is not None else itertools.count()
        self._by_forwarded: dict[bytes, Pending] = {}
        self._by_original: dict[IdKey, list[Pending]] = {}

    def __len__(self) -> int:
        return len(self._by_forwarded)

    def oldest(self) -> Pending | None:
        """The request pending the longest, if any."""
        return next(iter(self._by_forwarded.values()), None)

    def sibling(self) -> IdMap:
        """An empty map that mints from the same counter (no id is ever in both)."""
        return IdMap(self._ids)

    def add(
        self,
        original_id: bytes,
        original_key: IdKey,
        method: str,
        session: str | None,
        at: float,
        *,
        keyed: bool = False,
        group: DuplicateGroup | None = None,
    ) -> Pending:
        """Mint the next-hop id for a request and remember it."""
        forwarded = str(next(self._ids)).encode()
        pending = Pending(forwarded, original_id, original_key, method, session, at, keyed, group)
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
