"""The trace's records: one type per ``event``, declared once, written and read back with it.

The proxy writes one record per line of its trace (``--trace``; :mod:`proxy.shell.trace`) and
sends the same records to ``/api/events``; ``acp-proxy report`` reads them back into these types
(:mod:`proxy.tools.report.load`). :func:`record_of` is the one place where an observation
(:mod:`proxy.core.observations`) becomes its record, :func:`encode` writes a record as a line and
:func:`decode` reads one.

A line is ``time`` (Unix seconds), ``link`` (the link's number or null; not on the ``trace``
header), ``event``, then the record's fields in the order they are declared here. A field marked
optional (:data:`WHEN_SET`) is written only when it has a value (``copy`` when true). A
``message`` record's fields depend on its ``disposition`` (:data:`MESSAGE_FIELDS`).

Reading is strict about the shape of what this version writes and lenient about what a newer
writer may add: a record of a known event that lacks a field, or whose field holds another type
(a ``time`` that is no finite number, a ``direction`` that is no direction), is no record
(``report`` counts the line as unreadable); a field it does not know is ignored; an event it does
not know is an :class:`UnknownRecord`; and the vocabularies that grow (a ``disposition``, an
invalid message's ``reason``, a finding's ``check``, a fault's ``action``: a built-in action's
:class:`~proxy.core.actions.ActionName`, or the name of another registered one) take a value this
version does not know as its text (:data:`Open`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

import orjson
from pydantic import AllowInfNan, Discriminator, Field, Tag, TypeAdapter, ValidationError

from proxy.core import acp
from proxy.core.actions import ActionName
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import InvalidReason, Kind
from proxy.core.observations import (
    CancelDropped,
    Check,
    Connected,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    FaultOverflowed,
    Finding,
    Handling,
    Held,
    HeldEnded,
    HeldOutcome,
    HeldThen,
    IdReused,
    InflightRefused,
    InitializeCached,
    InitializeTimedOut,
    InvalidSeen,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Orphaned,
    PeerGone,
    Relayed,
    RelayedRun,
    ReloadResult,
    Restarted,
    RestartWhat,
    RulesCounted,
    RulesReloaded,
    StallEnded,
    Stopped,
    TooManyPending,
    Undeliverable,
    Unroutable,
    Via,
)

__all__ = [
    "MESSAGE_FIELDS",
    "TRACE_VERSION",
    "UNTRACED",
    "WHEN_SET",
    "ConnectionRecord",
    "Disposition",
    "FaultRecord",
    "FindingRecord",
    "HeldEndedRecord",
    "HeldRecord",
    "JsonValue",
    "KeyedMessageRecord",
    "KeyedRecord",
    "MessageRecord",
    "Open",
    "Record",
    "ReloadRecord",
    "RestartRecord",
    "TraceHeader",
    "TraceRecord",
    "UnknownRecord",
    "as_json",
    "decode",
    "encode",
    "event_of",
    "record_of",
    "records_of",
]

TRACE_VERSION = 1
"""The version of the trace format (the ``trace`` header's ``version``)."""

JsonValue: TypeAlias = object
"""Any JSON value (an id as its sender wrote it)."""

Time = Annotated[float, AllowInfNan(False)]
"""Unix seconds (a finite number)."""

WHEN_SET: Mapping[str, bool] = {"optional": True}
"""The metadata of a field written only when it has a value (not None, not false)."""

Open = Field(union_mode="left_to_right")
"""A field of a vocabulary that grows: a value this version knows is its member, another its
text (``Annotated[Disposition | str, Open]``)."""


class Disposition(enum.StrEnum):
    """What became of a message (a ``message`` record's ``disposition``)."""

    RELAYED = "relayed"
    DROPPED = "dropped"
    """A ``drop`` rule stopped it."""
    ANSWERED_BY_PROXY = "answered_by_proxy"
    """An ``error`` rule answered it in the peer's place."""
    SEVERED = "severed"
    """A ``sever`` rule cut the connection before forwarding it."""
    REFUSED = "refused"
    """An ``http_status`` rule without ``forward`` refused its POST."""
    INVALID = "invalid"
    ORPHANED = "orphaned"
    """An answer whose id names no pending request (dropped)."""
    UNDELIVERABLE = "undeliverable"
    """Its peer had closed (dropped)."""
    UNROUTABLE = "unroutable"
    """An error with ``"id": null``, forwarded as it was."""
    CANCEL_DROPPED = "cancel_dropped"
    SWALLOWED = "swallowed"
    """The answer to an injected copy (not forwarded)."""
    ANSWERED_FROM_CACHE = "answered_from_cache"
    TIMED_OUT = "timed_out"
    """``initialize`` unanswered within ``--initialize-timeout``: the proxy answered an error."""
    TOO_MANY_PENDING = "too_many_pending"
    """A request refused for ``--max-pending``: its sender got an error, nothing went on."""
    TOO_MUCH_IN_FLIGHT = "too_much_in_flight"
    """A POST refused (503) before it was read, for ``--max-inflight-bytes`` (no kind: unread)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRecord:
    """What every record has: its ``time``. Each subclass is one ``event``."""

    EVENT: ClassVar[str] = ""
    time: Time


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceHeader(TraceRecord):
    """The first line a proxy run writes: the format's ``version``."""

    EVENT: ClassVar[str] = "trace"
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _OnLink(TraceRecord):
    """A record of something that happened on a link (``link``: null for none)."""

    link: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageRecord(_OnLink):
    """A message, written when it left the proxy or was stopped (:data:`MESSAGE_FIELDS`: the
    fields each disposition has)."""

    EVENT: ClassVar[str] = "message"
    disposition: Annotated[Disposition | str, Open] = Disposition.RELAYED
    direction: Direction
    kind: Kind | None = None
    """None only for a message refused unread (``too_much_in_flight``)."""
    method: str | None = None
    session: str | None = None
    id: JsonValue = None
    """The sender's id (for an answer: its requester's)."""
    forwarded_id: JsonValue = None
    """The id the proxy wrote on the next hop (a request and its answer carry the same pair)."""
    size: int | None = None
    duration_ms: float | None = field(default=None, metadata=WHEN_SET)
    """An answer's: from its request's arrival at the proxy to its own delivery."""
    copy: bool = field(default=False, metadata=WHEN_SET)
    """A copy a ``duplicate`` rule injected."""
    hold: int | None = field(default=None, metadata=WHEN_SET)
    """The :class:`HeldRecord` it was released from."""
    rule: str | None = None
    """The rule that stopped it."""
    reason: Annotated[InvalidReason | str | None, Open] = None
    handling: Handling | None = None
    timeout_ms: float | None = None
    limit: int | None = None
    """``too_many_pending``: the bound (``--max-pending``)."""
    in_flight: int | None = None
    """``too_much_in_flight``: the bytes the proxy held when it refused this one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldRecord(_OnLink):
    """A message a rule holds behind a timer, written when it arrived; its :class:`MessageRecord`
    carries the same ``hold`` when it leaves."""

    EVENT: ClassVar[str] = "held"
    hold: int
    rules: tuple[str, ...]
    delay_ms: float
    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    id: JsonValue
    forwarded_id: JsonValue
    size: int
    copy: bool = field(default=False, metadata=WHEN_SET)
    held_id: int | None = field(default=None, metadata=WHEN_SET)
    """A ``hold`` rule's message: its proxy-wide id (the control API's ``/api/held/{id}``);
    ``delay_ms`` is then its timeout."""
    then: HeldThen | None = field(default=None, metadata=WHEN_SET)
    """A ``hold`` rule's message: what its timeout does to it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldEndedRecord(_OnLink):
    """A message a ``hold`` rule held is held no more (``outcome``); its :class:`HeldRecord`
    (the same ``held_id`` and ``hold``) names the message, and its ``message`` record follows
    when it is relayed or dropped (none when its link ended). An ``edit`` names both versions by
    a digest, never by their text."""

    EVENT: ClassVar[str] = "held_ended"
    held_id: int
    hold: int
    """The ``hold`` of its :class:`HeldRecord`."""
    outcome: Annotated[HeldOutcome | str, Open]
    rule: str
    digest: str | None = field(default=None, metadata=WHEN_SET)
    edited_digest: str | None = field(default=None, metadata=WHEN_SET)


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRecord(_OnLink):
    """A rule fired (``id``: the id as it is on the wire where the fault strikes)."""

    EVENT: ClassVar[str] = "fault"
    rule: str
    action: Annotated[ActionName | str, Open]
    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    id: JsonValue


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionRecord(_OnLink):
    """A connection joined (``open``) or left (``closed``) its link."""

    EVENT: ClassVar[str] = "connection"
    state: Literal["open", "closed"]
    side: Side
    transport: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartRecord(_OnLink):
    """The data plane or an Agent was restarted; ``abandoned`` requests left unanswered."""

    EVENT: ClassVar[str] = "restart"
    what: RestartWhat
    abandoned: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadRecord(_OnLink):
    """The fault files were reloaded."""

    EVENT: ClassVar[str] = "reload"
    result: ReloadResult
    rules: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingRecord(_OnLink):
    """The ledger saw a rule of the idempotency RFD broken."""

    EVENT: ClassVar[str] = "finding"
    check: Annotated[Check | str, Open]
    session: str | None
    key: str | None
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedRecord(_OnLink):
    """A keyed ``session/prompt`` the ledger recorded (``retry``: its key was known)."""

    EVENT: ClassVar[str] = "keyed"
    session: str
    key: str
    prompt: str
    retry: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedMessageRecord(_OnLink):
    """A ``messageId`` the Agent named for a key, the first time this proxy saw it."""

    EVENT: ClassVar[str] = "keyed_message"
    session: str
    key: str
    message_id: str
    via: Via


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownRecord(_OnLink):
    """A record of an event this version does not know (a newer writer's): read, not judged."""

    event: str


Record = (
    TraceHeader
    | MessageRecord
    | HeldRecord
    | HeldEndedRecord
    | FaultRecord
    | ConnectionRecord
    | RestartRecord
    | ReloadRecord
    | FindingRecord
    | KeyedRecord
    | KeyedMessageRecord
    | UnknownRecord
)
"""Every record :func:`decode` can return."""

_KNOWN: tuple[type[TraceRecord], ...] = (
    TraceHeader,
    MessageRecord,
    HeldRecord,
    HeldEndedRecord,
    FaultRecord,
    ConnectionRecord,
    RestartRecord,
    ReloadRecord,
    FindingRecord,
    KeyedRecord,
    KeyedMessageRecord,
)
_BY_EVENT = {kind.EVENT: kind for kind in _KNOWN}

_NAMED = ("direction", "kind", "method", "session", "id", "forwarded_id", "size")
_STOPPED = (*_NAMED, "rule")
MESSAGE_FIELDS: Mapping[str, tuple[str, ...]] = {
    Disposition.RELAYED: (*_NAMED, "duration_ms", "copy", "hold"),
    Disposition.DROPPED: _STOPPED,
    Disposition.ANSWERED_BY_PROXY: _STOPPED,
    Disposition.SEVERED: _STOPPED,
    Disposition.REFUSED: _STOPPED,
    Disposition.INVALID: ("direction", "kind", "reason", "handling", "size"),
    Disposition.ORPHANED: ("direction", "kind", "forwarded_id"),
    Disposition.UNDELIVERABLE: (
        "direction",
        "kind",
        "size",
        "method",
        "session",
        "id",
        "forwarded_id",
        "hold",
    ),
    Disposition.UNROUTABLE: ("direction", "kind", "size"),
    Disposition.CANCEL_DROPPED: ("direction", "kind", "method", "id"),
    Disposition.SWALLOWED: _NAMED,
    Disposition.ANSWERED_FROM_CACHE: ("direction", "kind", "method", "id"),
    Disposition.TIMED_OUT: ("direction", "kind", "method", "id", "forwarded_id", "timeout_ms"),
    Disposition.TOO_MANY_PENDING: ("direction", "kind", "method", "session", "id", "limit"),
    Disposition.TOO_MUCH_IN_FLIGHT: ("direction", "size", "in_flight"),
}
"""The fields of a ``message`` record (after ``disposition``), by disposition, in order. An
``undeliverable`` message is named (``method`` to ``hold``) only when it was held; a
disposition this version does not know has them all."""

UNTRACED: tuple[type[Observation], ...] = (
    FaultOverflowed,
    IdReused,
    PeerGone,
    RulesCounted,
    StallEnded,
)
"""The observations of the core that have no record (logged and counted only)."""


# -- observations to records ---------------------------------------------------------------------


def _id(token: bytes | None) -> JsonValue:
    """An id as JSON: its value when it parses, else its text."""
    if token is None:
        return None
    try:
        value: JsonValue = orjson.loads(token)
    except orjson.JSONDecodeError:
        return token.decode("utf-8", "replace")
    return value


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _named(relayed: Relayed) -> dict[str, Any]:
    """The fields that name a message, as its :class:`Relayed` says them (``direction`` to
    ``size``, in the order the records declare them)."""
    return {
        "direction": relayed.direction,
        "kind": relayed.kind,
        "method": relayed.method,
        "session": relayed.session,
        "id": _id(relayed.original_id),
        "forwarded_id": _id(relayed.forwarded_id),
        "size": relayed.size,
    }


def records_of(observation: Observation, link: int | None, time: float) -> list[Record]:
    """The records of one observation: a :class:`~proxy.core.observations.RelayedRun` gives a
    record per message (as each relayed alone would), any other at most one
    (:func:`record_of`)."""
    if isinstance(observation, RelayedRun):
        told = [record_of(relayed, link, time) for relayed in observation.each()]
    else:
        told = [record_of(observation, link, time)]
    return [record for record in told if record is not None]


def record_of(observation: Observation, link: int | None, time: float) -> Record | None:
    """The record of one observation (of link ``link``, at ``time``), or ``None`` for those the
    trace does not keep (:data:`UNTRACED`, and the shell's own)."""
    match observation:
        case Relayed():
            return MessageRecord(
                time=time,
                link=link,
                **_named(observation),
                duration_ms=None if observation.duration is None else _ms(observation.duration),
                copy=observation.copy,
                hold=observation.hold,
            )
        case Held(relayed=held):
            return HeldRecord(
                time=time,
                link=link,
                hold=observation.hold,
                rules=observation.rules,
                delay_ms=_ms(observation.delay),
                **_named(held),
                copy=held.copy,
                held_id=observation.held_id,
                then=observation.then,
            )
        case HeldEnded():
            return HeldEndedRecord(
                time=time,
                link=link,
                held_id=observation.held_id,
                hold=observation.hold,
                outcome=observation.outcome,
                rule=observation.rule,
                digest=observation.digest,
                edited_digest=observation.edited_digest,
            )
        case Stopped():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition(observation.disposition),
                direction=observation.direction,
                kind=observation.kind,
                method=observation.method,
                session=observation.session,
                id=_id(observation.original_id),
                forwarded_id=_id(observation.forwarded_id),
                size=observation.size,
                rule=observation.rule,
            )
        case InvalidSeen():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.INVALID,
                direction=observation.direction,
                kind=Kind.INVALID,
                reason=observation.reason,
                handling=observation.handling,
                size=observation.size,
            )
        case Orphaned():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.ORPHANED,
                direction=observation.direction,
                kind=observation.kind,
                forwarded_id=_id(observation.id),
            )
        case Undeliverable():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.UNDELIVERABLE,
                direction=observation.direction,
                kind=observation.kind,
                size=observation.size,
                method=observation.method,
                session=observation.session,
                id=_id(observation.original_id),
                forwarded_id=_id(observation.forwarded_id),
                hold=observation.hold,
            )
        case Unroutable():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.UNROUTABLE,
                direction=observation.direction,
                kind=Kind.ERROR,
                size=observation.size,
            )
        case CancelDropped():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.CANCEL_DROPPED,
                direction=observation.direction,
                kind=Kind.NOTIFICATION,
                method=acp.CANCEL_REQUEST,
                id=_id(observation.request_id),
            )
        case DuplicateSwallowed():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.SWALLOWED,
                direction=observation.direction,
                kind=Kind.RESPONSE,
                method=observation.method,
                session=observation.session,
                id=_id(observation.original_id),
                forwarded_id=_id(observation.forwarded_id),
                size=len(observation.data),
            )
        case InitializeCached():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.ANSWERED_FROM_CACHE,
                direction=Direction.TO_AGENT,
                kind=Kind.REQUEST,
                method=acp.INITIALIZE,
                id=_id(observation.id),
            )
        case InitializeTimedOut():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.TIMED_OUT,
                direction=Direction.TO_CLIENT,
                kind=Kind.ERROR,
                method=acp.INITIALIZE,
                id=_id(observation.id),
                forwarded_id=_id(observation.forwarded_id),
                timeout_ms=_ms(observation.timeout),
            )
        case TooManyPending():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.TOO_MANY_PENDING,
                direction=observation.direction,
                kind=Kind.REQUEST,
                method=observation.method,
                session=observation.session,
                id=_id(observation.original_id),
                limit=observation.limit,
            )
        case InflightRefused():
            return MessageRecord(
                time=time,
                link=link,
                disposition=Disposition.TOO_MUCH_IN_FLIGHT,
                direction=observation.direction,
                size=observation.size,
                in_flight=observation.in_flight,
            )
        case FaultInjected():
            return FaultRecord(
                time=time,
                link=link,
                rule=observation.rule,
                action=observation.action,
                direction=observation.direction,
                kind=observation.kind,
                method=observation.method,
                session=observation.session,
                id=_id(observation.id),
            )
        case Connected() | Disconnected():
            return ConnectionRecord(
                time=time,
                link=link,
                state="open" if isinstance(observation, Connected) else "closed",
                side=observation.side,
                transport=observation.transport,
            )
        case Restarted():
            return RestartRecord(
                time=time, link=link, what=observation.what, abandoned=observation.abandoned
            )
        case RulesReloaded():
            return ReloadRecord(
                time=time, link=link, result=observation.result, rules=observation.rules
            )
        case Finding():
            return FindingRecord(
                time=time,
                link=link,
                check=observation.check,
                session=observation.session,
                key=observation.key,
                detail=observation.detail,
            )
        case KeyedAttempt():
            return KeyedRecord(
                time=time,
                link=link,
                session=observation.session,
                key=observation.key,
                prompt=observation.prompt,
                retry=observation.retry,
            )
        case KeyedMessage():
            return KeyedMessageRecord(
                time=time,
                link=link,
                session=observation.session,
                key=observation.key,
                message_id=observation.message_id,
                via=observation.via,
            )
    return None


# -- writing -------------------------------------------------------------------------------------


def event_of(record: TraceRecord) -> str:
    """The ``event`` a record is written under."""
    return record.event if isinstance(record, UnknownRecord) else record.EVENT


def _fields(kind: type[TraceRecord]) -> tuple[str, ...]:
    """The fields of a record type after ``time`` and ``link``, in order."""
    return tuple(
        item.name for item in dataclasses.fields(kind) if item.name not in ("time", "link")
    )


_FIELDS = {kind: _fields(kind) for kind in _KNOWN}
_OPTIONAL = {
    kind: frozenset(item.name for item in dataclasses.fields(kind) if item.metadata.get("optional"))
    for kind in _KNOWN
}


def _names(record: TraceRecord) -> Iterable[str]:
    """The fields written for ``record``, in order."""
    if isinstance(record, MessageRecord):
        names = MESSAGE_FIELDS.get(record.disposition, _FIELDS[MessageRecord][1:])
        if record.disposition is Disposition.UNDELIVERABLE and record.hold is None:
            names = names[:3]
        return ("disposition", *names)
    return _FIELDS.get(type(record), ())


def as_json(record: TraceRecord) -> dict[str, Any]:
    """The record as the JSON object of its line (keys in order, optional fields left out when
    unset)."""
    out: dict[str, Any] = {"time": record.time}
    if isinstance(record, _OnLink):
        out["link"] = record.link
    out["event"] = event_of(record)
    optional = _OPTIONAL.get(type(record), frozenset())
    for name in _names(record):
        value = getattr(record, name)
        if name in optional and (value is None or value is False):
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def encode(record: TraceRecord) -> bytes:
    """The record as one line of JSON (no newline). A peer's method or session may hold a lone
    surrogate (valid JSON, not UTF-8): it is written as the text ``\\ud800``, as in log lines,
    so every reader can read it."""
    data = as_json(record)
    try:
        return orjson.dumps(data)
    except TypeError:  # orjson.JSONEncodeError
        return orjson.dumps(
            {
                key: value.encode("utf-8", "backslashreplace").decode()
                if isinstance(value, str)
                else value
                for key, value in data.items()
            }
        )


# -- reading -------------------------------------------------------------------------------------


def _tag(value: Any) -> str:
    event = value.get("event") if isinstance(value, dict) else None
    return event if isinstance(event, str) and event in _BY_EVENT else ""


_Tagged = Annotated[
    Annotated[TraceHeader, Tag(TraceHeader.EVENT)]
    | Annotated[MessageRecord, Tag(MessageRecord.EVENT)]
    | Annotated[HeldRecord, Tag(HeldRecord.EVENT)]
    | Annotated[HeldEndedRecord, Tag(HeldEndedRecord.EVENT)]
    | Annotated[FaultRecord, Tag(FaultRecord.EVENT)]
    | Annotated[ConnectionRecord, Tag(ConnectionRecord.EVENT)]
    | Annotated[RestartRecord, Tag(RestartRecord.EVENT)]
    | Annotated[ReloadRecord, Tag(ReloadRecord.EVENT)]
    | Annotated[FindingRecord, Tag(FindingRecord.EVENT)]
    | Annotated[KeyedRecord, Tag(KeyedRecord.EVENT)]
    | Annotated[KeyedMessageRecord, Tag(KeyedMessageRecord.EVENT)]
    | Annotated[UnknownRecord, Tag("")],
    Discriminator(_tag),
]
"""Every record, told apart by its ``event`` (one this version does not know: ``""``)."""


@functools.cache
def _reader() -> TypeAdapter[Record]:
    """Reads a line into its record type (built once, when first needed)."""
    return TypeAdapter(_Tagged)


def decode(line: bytes | str) -> Record | None:
    """The record of one line, or ``None`` when it is none: not a JSON object with a finite
    ``time`` and a string ``event``, or a known event whose fields do not fit its type."""
    try:
        return _reader().validate_json(line, strict=True)
    except ValidationError:
        return None
