"""Messages a ``hold`` rule paused (a breakpoint): their proxy-wide ids and count, what is kept
of each, and the one check of an edit. What the control API shows of them is
:mod:`proxy.shell.admin`'s (``GET /api/held``).

A held message waits at the proxy until the control API acts on it (release, drop, edit) or its
``timeout_ms`` is up (then it is released or dropped, as its rule's ``then`` says); its link's
end discards it. Nothing else ends its hold: a ``stall`` that ends or a ``reorder`` that counts
it overtaken lets it be (it is held still; released later, it goes on at once). Each gets an id
from :class:`HeldIds`, one counter for the whole proxy (the fault engine's, kept across restarts
of the data plane), so that an id names one message over the proxy's life and an id that was
issued but is held no more is told apart from one that never was; :class:`HeldBound` counts
those held now against ``--max-held``. The relay (:mod:`proxy.core.relay`) keeps the messages
its link holds; nothing here reads a clock: every time is the relay's (the shell's loop time).

An edit (:func:`edited`) replaces the message by another of the same kind (a request by a
request with the same method, a notification by a notification, an answer by a result or an
error) under the same id as its sender wrote it; the relay then rewrites that id hop by hop as
it would have rewritten the original's.
"""

from __future__ import annotations

import hashlib

from proxy.core.jsonrpc import Batch, IdKey, Invalid, Kind, Message, parse
from proxy.core.observations import HeldThen, Relayed
from proxy.core.values import value

__all__ = [
    "EditRefused",
    "HeldBound",
    "HeldIds",
    "HeldMessage",
    "digest",
    "edited",
]

_ANSWERS = (Kind.RESPONSE, Kind.ERROR)


class HeldIds:
    """The ids of held messages, proxy-wide: 1, 2, 3... in the order they were held."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 1

    def take(self) -> int:
        """A new id."""
        taken = self._next
        self._next += 1
        return taken

    def issued(self, held_id: int) -> bool:
        """Whether ``held_id`` was given to a message (held now, or once)."""
        return 0 < held_id < self._next


class HeldBound:
    """How many messages ``hold`` rules hold now across the proxy, and the cap on them
    (``--max-held``; ``None``: none). Past the cap a ``hold`` rule does not act: the message
    goes on as if the rule had not matched (:class:`~proxy.core.observations.FaultOverflowed`)."""

    __slots__ = ("count", "limit", "refused")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.count = 0
        self.refused = False
        """Whether a hold was refused for the cap yet (the first refusal is logged, no other)."""

    def full(self) -> bool:
        """Whether no message may be held now."""
        return self.limit is not None and self.count >= self.limit


@value(kw_only=True)
class HeldMessage:
    """One message a ``hold`` rule holds on a link: as it arrived (``data``, its id as its
    sender wrote it), and what will be observed when it leaves (``relayed``)."""

    id: int
    """Its proxy-wide id (:class:`HeldIds`)."""
    token: int
    """The timer of its link's relay that holds it."""
    rule: str
    relayed: Relayed
    """What will be observed when it leaves as it came: its direction, kind, method (an
    answer's: its request's), session, ids (``original_id``: the requester's, ``forwarded_id``:
    the proxy's on the Agent's hop) and size."""
    data: bytes
    """The message as it arrived, its id as its sender wrote it: the very bytes its
    ``relayed.message`` keeps (not a copy; the bytes its timer will send are its own, and each
    counts toward the bytes in flight)."""
    sent_key: IdKey | None
    """What tells the id in ``data`` from another (its type and value: ``1`` is not ``"1"``)."""
    at: float
    """When it arrived (the relay's time)."""
    timeout: float
    """Seconds it waits at most."""
    then: HeldThen

    @property
    def sent_id(self) -> bytes | None:
        """The id in ``data``, as its sender wrote it."""
        relayed = self.relayed
        return relayed.original_id if relayed.kind is Kind.REQUEST else relayed.forwarded_id

    @property
    def deadline(self) -> float:
        """When its timeout is up (the relay's time)."""
        return self.at + self.timeout


class EditRefused(ValueError):
    """An edit of a held message that cannot replace it; the message says what is wrong."""


def _kind_name(kind: Kind) -> str:
    """The kind an edit must keep: an answer's (a result or an error) is ``response``."""
    return "response" if kind in _ANSWERS else str(kind)


def edited(held: HeldMessage, data: bytes, limit: int) -> Message:
    """``data`` parsed, as the message that replaces ``held``; :class:`EditRefused` when it
    is over ``limit`` bytes (``--max-message-bytes``), not one JSON-RPC 2.0 message to the
    letter (:func:`_not_strict`), of another kind than ``held`` (a result may become an error
    and back), under another id than ``held``'s sender wrote (``1`` is not ``"1"``), or, for a
    request, of another method."""
    if len(data) > limit:
        raise EditRefused(
            f"the edited message is {len(data)} bytes, over --max-message-bytes ({limit})"
        )
    message = parse(data)
    if isinstance(message, Batch):
        raise EditRefused("the edited message is a batch; a held message is one message")
    if isinstance(message, Invalid):
        raise EditRefused(f"the edited message is not valid JSON-RPC: {message.detail}")
    if problem := _not_strict(message):
        raise EditRefused(f"the edited message is not valid JSON-RPC: {problem}")
    was, now = _kind_name(held.relayed.kind), _kind_name(message.kind)
    if was != now:
        raise EditRefused(f"the held message is a {was}; the edited message is a {now}")
    if message.id_key != held.sent_key:
        shown = "none" if held.sent_id is None else held.sent_id.decode("utf-8", "replace")
        raise EditRefused(f"the edited message must keep the held message's id ({shown})")
    method = held.relayed.method
    if message.kind is Kind.REQUEST and message.method != method:
        raise EditRefused(
            f"the edited request must keep the method {method!r} (its answer is mapped to it)"
        )
    return message


def _not_strict(message: Message) -> str | None:
    """What makes ``message`` other than a JSON-RPC 2.0 message to the letter, or ``None``.

    The relay passes on what a lenient peer would read (a message without ``"jsonrpc"``, an
    error that is a string); a message a person writes in its place is held to the
    specification, so that an edit never hands a peer what it cannot read by mistake."""
    body = message.body
    if body.get("jsonrpc") != "2.0":
        return 'its "jsonrpc" member must be "2.0"'
    if message.kind in (Kind.REQUEST, Kind.NOTIFICATION):
        params = body.get("params")
        if "params" in body and not isinstance(params, dict | list):
            return '"params" must be an object or an array'
        return None
    error = body.get("error")
    if "error" in body and not (
        isinstance(error, dict)
        and type(error.get("code")) is int
        and isinstance(error.get("message"), str)
    ):
        return '"error" must be an object with an integer "code" and a string "message"'
    return None


def digest(data: bytes) -> str:
    """A short digest of a message's bytes: what the trace says of an edit (never its text)."""
    return hashlib.sha256(data).hexdigest()[:16]
