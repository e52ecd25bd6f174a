"""The relay core: one link's state machine, events in, commands out (DESIGN 5).

:meth:`Relay.handle` takes an :mod:`~proxy.events` event and returns the :mod:`~proxy.commands`
that follow from it, in the order they must happen. It never blocks, reads a clock, logs or
touches a socket; the shell in :mod:`proxy.link` does all of that.

The relay rules, each pinned down by ``tests/test_relay.py``:

1. Request ids are rewritten per link and per direction: the proxy mints its own id for the next
   hop and puts the sender's exact id bytes back on the answer.
2. Apart from ids, a forwarded message is byte-identical: ids are spliced into the original bytes.
3. ``$/cancel_request.params.requestId`` (also inside a ``proxy/successor`` envelope) is translated
   to the next hop's id; a cancel for an unknown or answered request is dropped and recorded.
   ``elicitation/create.params.requestId`` is mapped back to the Client's id.
   ``mcp/message`` and every entity id (session, message, tool call...) are never touched.
4. Batches are relayed element by element; the proxy never creates a batch.
5. Notifications are never answered; per direction, order is kept.
6. A response whose id is unknown (or not a valid id) is dropped and recorded, never forwarded
   blindly. An error with ``"id": null`` (a parse-error answer) cannot be routed and is forwarded
   as it is.
7. Invalid input is forwarded untouched (the peer answers it as it would without a proxy), or in
   ``strict`` mode answered by the proxy; an oversized message is always answered, never forwarded.
"""

from __future__ import annotations

from proxy.commands import (
    CancelDropped,
    Close,
    Command,
    Handling,
    IdReused,
    InvalidSeen,
    Orphaned,
    PeerGone,
    Relayed,
    Send,
    Undeliverable,
    Unroutable,
)
from proxy.events import (
    Direction,
    Event,
    MessageReceived,
    OversizedReceived,
    PeerClosed,
    Side,
)
from proxy.idmap import IdMap
from proxy.jsonrpc import (
    Batch,
    ErrorCode,
    Invalid,
    InvalidReason,
    Kind,
    Message,
    error_response,
    id_key,
    parse,
    token_at,
)
from proxy.splice import Span, splice

__all__ = ["CANCEL_METHOD", "SUCCESSOR_METHODS", "Relay"]

CANCEL_METHOD = "$/cancel_request"
ELICITATION_METHOD = "elicitation/create"
SUCCESSOR_METHODS = frozenset({"proxy/successor", "_proxy/successor"})
_REQUEST_ID_PATH = ("params", "requestId")


class Relay:
    """The state of one link: pending requests both ways and which peers are still connected."""

    __slots__ = ("_closing", "_ended", "_maps", "_strict")

    def __init__(self, *, strict: bool = False) -> None:
        self._strict = strict
        self._maps = {Direction.TO_AGENT: IdMap(), Direction.TO_CLIENT: IdMap()}
        self._ended: set[Side] = set()
        """Peers whose stream to the proxy has ended (nothing more will come from them)."""
        self._closing: set[Side] = set()
        """Peers the proxy has closed its connection to (nothing more will be sent to them)."""

    def pending(self, direction: Direction) -> int:
        """How many requests travelling ``direction`` await their answer."""
        return len(self._maps[direction])

    def has_ended(self, side: Side) -> bool:
        """Whether the stream from ``side`` has ended."""
        return side in self._ended

    def handle(self, event: Event) -> list[Command]:
        """Feed one event; return what must happen, in order."""
        match event:
            case MessageReceived(side=side, data=data, at=at):
                return self._received(side.outbound, data, at)
            case OversizedReceived(side=side, size=size, limit=limit):
                return self._oversized(side.outbound, size, limit)
            case PeerClosed(side=side):
                return self._peer_closed(side)

    # -- messages -------------------------------------------------------------------------------

    def _received(self, direction: Direction, data: bytes, at: float) -> list[Command]:
        out: list[Command] = []
        parsed = parse(data)
        destination = direction.destination
        if destination in self._closing:
            out.append(Undeliverable(direction, parsed.kind, len(data)))
            return out
        if isinstance(parsed, Invalid):
            self._invalid(direction, parsed, out)
        elif isinstance(parsed, Batch):
            kept: list[bytes] = []
            for element in parsed.elements:
                if isinstance(element, Invalid):
                    # An invalid entry stays in place; the receiver answers it with its own -32600.
                    if self._invalid_element(direction, element, out):
                        kept.append(element.raw)
                else:
                    rewritten = self._translate(direction, element, at, out)
                    if rewritten is not None:
                        kept.append(rewritten)
            if kept:
                out.append(Send(destination, b"[" + b",".join(kept) + b"]"))
        else:
            rewritten = self._translate(direction, parsed, at, out)
            if rewritten is not None:
                out.append(Send(destination, rewritten))
        return out

    def _translate(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> bytes | None:
        """The bytes to forward for ``message`` (ids rewritten), or ``None`` to drop it."""
        if message.kind is Kind.REQUEST:
            return self._request(direction, message, at, out)
        if message.kind is Kind.NOTIFICATION:
            return self._notification(direction, message, out)
        return self._response(direction, message, at, out)

    def _request(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> bytes:
        assert message.method is not None
        assert message.id_token is not None
        assert message.id_key is not None
        requests = self._maps[direction]
        if requests.pending_with(message.id_key):
            out.append(IdReused(direction, message.id_token, message.method))
        pending = requests.add(
            message.id_token, message.id_key, message.method, message.session, at
        )
        edits: list[tuple[Span, bytes]] = [
            (span, pending.forwarded_id) for span in message.id_spans
        ]
        if message.method == ELICITATION_METHOD and direction is Direction.TO_CLIENT:
            # The Agent names the Client's request it is tied to by the id the Agent knows.
            found = token_at(message.raw, _REQUEST_ID_PATH)
            if found is not None:
                span, token = found
                tied = self._maps[Direction.TO_AGENT].get(token)
                if tied is not None:
                    edits.append((span, tied.original_id))
        out.append(
            Relayed(
                direction,
                Kind.REQUEST,
                message.method,
                pending.session,
                len(message.raw),
                message.id_token,
                pending.forwarded_id,
            )
        )
        return splice(message.raw, edits)

    def _notification(
        self, direction: Direction, message: Message, out: list[Command]
    ) -> bytes | None:
        data = message.raw
        method = message.method
        params = message.params
        inner = params.get("method") if isinstance(params, dict) else None
        if method == CANCEL_METHOD or (method in SUCCESSOR_METHODS and inner == CANCEL_METHOD):
            translated = self._cancel(direction, message, out)
            if translated is None:
                return None
            data = translated
        out.append(Relayed(direction, Kind.NOTIFICATION, method, message.session, len(message.raw)))
        return data

    def _cancel(self, direction: Direction, message: Message, out: list[Command]) -> bytes | None:
        """Translate a cancel of the sender's own request to the next hop's id, or drop it."""
        found = token_at(message.raw, _REQUEST_ID_PATH)
        if found is not None:
            span, token = found
            params = message.params
            key = id_key(token, params.get("requestId") if isinstance(params, dict) else None)
            if key is not None:
                pending = self._maps[direction].pending_with(key)
                if pending:
                    return splice(message.raw, [(span, pending[-1].forwarded_id)])
        out.append(CancelDropped(direction, None if found is None else found[1]))
        return None

    def _response(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> bytes | None:
        assert message.id_token is not None
        if message.kind is Kind.ERROR and message.id_key == ("null", None):
            out.append(Unroutable(direction, len(message.raw)))
            return message.raw
        pending = self._maps[direction.reverse].pop(message.id_token)
        if pending is None:
            out.append(Orphaned(direction, message.id_token, message.kind))
            return None
        out.append(
            Relayed(
                direction,
                message.kind,
                pending.method,
                pending.session,
                len(message.raw),
                pending.original_id,
                message.id_token,
                at - pending.at,
            )
        )
        return splice(message.raw, [(span, pending.original_id) for span in message.id_spans])

    # -- bad input ------------------------------------------------------------------------------

    def _invalid(self, direction: Direction, invalid: Invalid, out: list[Command]) -> None:
        if invalid.response:
            handling = Handling.DROPPED
        elif self._strict:
            handling = Handling.ANSWERED
            code = invalid.reason.error_code
            text = f"{code.name.replace('_', ' ').capitalize()}: {invalid.detail}"
            out.append(Send(direction.source, error_response(b"null", code, text)))
        else:
            handling = Handling.FORWARDED
            out.append(Send(direction.destination, invalid.raw))
        out.append(
            InvalidSeen(direction, invalid.reason, len(invalid.raw), invalid.detail, handling)
        )

    def _invalid_element(self, direction: Direction, invalid: Invalid, out: list[Command]) -> bool:
        """Record an invalid batch entry; whether it stays in the batch for the peer to answer."""
        handling = Handling.DROPPED if invalid.response else Handling.FORWARDED
        out.append(
            InvalidSeen(direction, invalid.reason, len(invalid.raw), invalid.detail, handling)
        )
        return handling is Handling.FORWARDED

    def _oversized(self, direction: Direction, size: int, limit: int) -> list[Command]:
        detail = f"message of {size} bytes exceeds the proxy's limit of {limit} bytes"
        return [
            InvalidSeen(direction, InvalidReason.TOO_LARGE, size, detail, Handling.ANSWERED),
            Send(
                direction.source,
                error_response(b"null", ErrorCode.INVALID_REQUEST, f"Invalid request: {detail}"),
            ),
        ]

    # -- connections ----------------------------------------------------------------------------

    def _peer_closed(self, side: Side) -> list[Command]:
        """The stream from ``side`` ended: pass the end on to the other peer (a half-close).

        Requests sent to ``side`` can never be answered now; nothing answers them falsely.
        What the other peer still sends toward ``side`` is delivered while that connection is
        open (a Client that closed stdin may still read the Agent's last answers).
        """
        if side in self._ended:
            return []
        self._ended.add(side)
        abandoned = self._maps[side.other.outbound].clear()
        out: list[Command] = [PeerGone(side, len(abandoned))]
        if side.other not in self._closing:
            self._closing.add(side.other)
            out.append(Close(side.other))
        return out
