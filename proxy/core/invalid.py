"""Invalid input: what the relay does with a message it cannot take for valid JSON-RPC (rule 7 of
:mod:`~proxy.core.relay`).

The rules, each pinned down by ``tests/core/test_relay.py``:

* Invalid input is forwarded untouched, so that the peer answers it as it would without a proxy;
  with ``--strict`` the proxy answers it itself (under ``null``) and never forwards it.
* One where a lenient peer could still read a request id (bad UTF-8, nesting deeper than parsers
  go, a leading BOM, ``1.0``) has that id rewritten hop by hop like a valid request's, so that
  the peer's answer goes back to its sender instead of being taken for another request's. Such
  requests are remembered apart, boundedly (the last ``MAX_INVALID_PENDING``, 64, per
  direction): most peers cannot read them and answer under ``null``, so they count as pending
  nowhere and no cancel reaches them.
* An invalid answer goes back to its sender only when its readable id names a pending request
  (never in ``--strict`` mode); any other is dropped, as it could answer the wrong request.
* A message too complex to scan for its id is never forwarded: a request is refused (answered
  under ``null``), an answer, which cannot be routed, is dropped.
* An oversized message is always answered, never forwarded.
* Bytes that cannot be scanned at all (a batch that is not UTF-8, JSON cut short) are forwarded
  untouched.

Pure code, like the rest of the core: the relay owns an :class:`InvalidInput` and hands it what
it shares (its pending requests, through a callable that pops the request an answer names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from proxy.core.commands import Command, Send
from proxy.core.events import Direction
from proxy.core.idmap import IdMap, Pending
from proxy.core.jsonrpc import ErrorCode, Invalid, InvalidReason, error_response
from proxy.core.observations import Handling, InvalidSeen, Relayed
from proxy.core.splice import splice

__all__ = ["MAX_INVALID_PENDING", "Answered", "InvalidInput"]

MAX_INVALID_PENDING = 64
"""Invalid requests per direction whose answer the relay still expects (most are never answered
under their id: the peer cannot read them; the oldest is forgotten, its late answer an orphan)."""

Answered = Callable[[Direction, bytes], Pending | None]
"""Pops the request an answer travelling a direction names by its forwarded id (None: none)."""


def _refusal(detail: str) -> bytes:
    """The proxy's answer to a message it will not relay (its sender's id unknown: ``null``)."""
    return error_response(b"null", ErrorCode.INVALID_REQUEST, f"Invalid request: {detail}")


class InvalidInput:
    """One link's handling of invalid input, and the invalid requests it still expects answered."""

    __slots__ = ("_maps", "_strict")

    def __init__(self, maps: Mapping[Direction, IdMap], *, strict: bool = False) -> None:
        """``maps``: the relay's pending requests per direction, whose ids the invalid requests'
        share (each gets a sibling map). ``strict``: answer invalid input instead of forwarding it.
        """
        self._strict = strict
        self._maps = {direction: maps[direction].sibling() for direction in Direction}
        """Invalid requests whose id a lenient peer could read, kept apart (the latest
        ``MAX_INVALID_PENDING``): the peer most likely cannot read them, so they count as pending
        nowhere and take no part in cancels."""

    def message(
        self,
        direction: Direction,
        invalid: Invalid,
        at: float,
        out: list[Command],
        answered: Answered,
    ) -> None:
        """An invalid message travelling ``direction``: what follows from it goes into ``out``."""
        if invalid.reason is InvalidReason.TOO_COMPLEX:
            handling = self._refuse(direction, invalid, out)
        elif invalid.response:  # strict: never forwarded (the sender cannot be answered)
            answer = None if self._strict else self._answer(direction, invalid, at, out, answered)
            handling = Handling.DROPPED if answer is None else Handling.FORWARDED
            if answer is not None:
                out.append(Send(direction.destination, answer))
        elif self._strict:
            handling = Handling.ANSWERED
            code = invalid.reason.error_code
            text = f"{code.name.replace('_', ' ').capitalize()}: {invalid.detail}"
            out.append(Send(direction.source, error_response(b"null", code, text)))
        else:
            handling = Handling.FORWARDED
            out.append(Send(direction.destination, self._forward(direction, invalid, at)))
        out.append(_seen(direction, invalid, handling))

    def element(
        self,
        direction: Direction,
        invalid: Invalid,
        at: float,
        out: list[Command],
        answered: Answered,
    ) -> bytes | None:
        """Record an invalid batch entry; what stays in the batch for the peer to answer."""
        forward = None
        if invalid.reason is InvalidReason.TOO_COMPLEX:
            handling = self._refuse(direction, invalid, out)
        else:
            if invalid.response:
                forward = (
                    None if self._strict else self._answer(direction, invalid, at, out, answered)
                )
            else:
                forward = self._forward(direction, invalid, at)
            handling = Handling.DROPPED if forward is None else Handling.FORWARDED
        out.append(_seen(direction, invalid, handling))
        return forward

    def oversized(self, direction: Direction, size: int, limit: int) -> list[Command]:
        """A message over the size limit: answered by the proxy, never forwarded."""
        detail = f"message of {size} bytes exceeds the proxy's limit of {limit} bytes"
        return [
            InvalidSeen(
                direction=direction,
                reason=InvalidReason.TOO_LARGE,
                size=size,
                detail=detail,
                handling=Handling.ANSWERED,
            ),
            Send(direction.source, _refusal(detail)),
        ]

    def answered(self, direction: Direction, forwarded_id: bytes) -> Pending | None:
        """The invalid request an answer travelling ``direction`` names, now answered
        (forgotten)."""
        return self._maps[direction.reverse].pop(forwarded_id)

    def forget(self, direction: Direction) -> None:
        """Forget the invalid requests travelling ``direction`` (their peer is gone)."""
        self._maps[direction].clear()

    def _forward(self, direction: Direction, invalid: Invalid, at: float) -> bytes:
        """The bytes of an invalid message to forward: a request id a peer could read is
        rewritten, and remembered (boundedly) to route the answer back."""
        if invalid.id_token is None or invalid.id_key is None:
            return invalid.raw
        requests = self._maps[direction]
        pending = requests.add(invalid.id_token, invalid.id_key, invalid.method or "", None, at)
        oldest = requests.oldest()
        if len(requests) > MAX_INVALID_PENDING and oldest is not None:
            requests.pop(oldest.forwarded_id)
        return splice(invalid.raw, [(span, pending.forwarded_id) for span in invalid.id_spans])

    def _answer(
        self,
        direction: Direction,
        invalid: Invalid,
        at: float,
        out: list[Command],
        answered: Answered,
    ) -> bytes | None:
        """An invalid answer whose id names a pending request goes to that request's sender
        under its id, as it would without a proxy; any other is dropped (it could answer the
        wrong request)."""
        if invalid.id_token is None or invalid.reads_as is None:
            return None
        pending = answered(direction, invalid.id_token)
        if pending is None:
            return None
        if pending.group is not None:
            if pending.group.answered:
                return None
            pending.group.answered = True
        out.append(
            Relayed(
                direction=direction,
                kind=invalid.reads_as,
                method=pending.method,
                session=pending.session,
                size=len(invalid.raw),
                original_id=pending.original_id,
                forwarded_id=invalid.id_token,
                duration=at - pending.at,
            )
        )
        return splice(invalid.raw, [(span, pending.original_id) for span in invalid.id_spans])

    def _refuse(self, direction: Direction, invalid: Invalid, out: list[Command]) -> Handling:
        """A message the proxy cannot relay (its id cannot be located within the scanner's
        bounds) is never forwarded: a request is answered, as one too large is; an answer,
        which the proxy cannot route, is dropped."""
        if invalid.response:
            return Handling.DROPPED
        out.append(Send(direction.source, _refusal(invalid.detail)))
        return Handling.ANSWERED


def _seen(direction: Direction, invalid: Invalid, handling: Handling) -> InvalidSeen:
    """What is reported of ``invalid``, seen in ``direction`` and handled so."""
    return InvalidSeen(
        direction=direction,
        reason=invalid.reason,
        size=len(invalid.raw),
        detail=invalid.detail,
        handling=handling,
    )
