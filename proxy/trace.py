"""The JSONL trace (``--trace FILE``) and the live event feed (``/api/events``).

One JSON object per line for every message (both hops: the sender's id and the id the proxy wrote
on the next hop), every fault, connection event, restart and finding. A message's ``message``
record is written when the message leaves the proxy: a held one (``delay``, a spaced ``duplicate``
copy) has a ``held`` record when it arrives and its ``message`` record, carrying the same ``hold``,
when it is sent, so the order of the records is the order on the wire. Each line is written with a
single ``write`` and flushed, so a crash loses at most the line being written. The schema is in
the README ("Trace events"); ``report`` reads it back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from proxy.commands import (
    CancelDropped,
    Connected,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    Finding,
    Held,
    InflightRefused,
    InitializeCached,
    InitializeTimedOut,
    InvalidSeen,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Orphaned,
    Relayed,
    Restarted,
    RulesReloaded,
    Stopped,
    TooManyPending,
    Undeliverable,
    Unroutable,
)

__all__ = ["EventFeed", "TraceWriter", "trace_record"]

TRACE_VERSION = 1


def _id(token: bytes | None) -> Any:
    """An id as JSON: its value when it parses, else its text."""
    if token is None:
        return None
    try:
        return orjson.loads(token)
    except orjson.JSONDecodeError:
        return token.decode("utf-8", "replace")


def _message(relayed: Relayed) -> dict[str, Any]:
    """The fields that name a message: where it goes, what it is, its ids, its size."""
    return {
        "direction": relayed.direction.value,
        "kind": relayed.kind.value,
        "method": relayed.method,
        "session": relayed.session,
        "id": _id(relayed.original_id),
        "forwarded_id": _id(relayed.forwarded_id),
        "size": relayed.size,
    }


def trace_record(observation: Observation, link: int | None, now: float) -> dict[str, Any] | None:
    """The trace line of one observation, or ``None`` for those the trace does not keep."""
    base: dict[str, Any] = {"time": now, "link": link}
    match observation:
        case Relayed():
            record = {"event": "message", "disposition": "relayed", **_message(observation)}
            if observation.duration is not None:
                record["duration_ms"] = round(observation.duration * 1000, 3)
            if observation.copy:
                record["copy"] = True
            if observation.hold is not None:
                record["hold"] = observation.hold
        case Held(relayed=held):
            record = {
                "event": "held",
                "hold": observation.hold,
                "rules": list(observation.rules),
                "delay_ms": round(observation.delay * 1000, 3),
                **_message(held),
            }
            if held.copy:
                record["copy"] = True
        case Stopped():
            record = {
                "event": "message",
                "disposition": observation.disposition,
                "direction": observation.direction.value,
                "kind": observation.kind.value,
                "method": observation.method,
                "session": observation.session,
                "id": _id(observation.original_id),
                "forwarded_id": _id(observation.forwarded_id),
                "size": observation.size,
                "rule": observation.rule,
            }
        case InvalidSeen():
            record = {
                "event": "message",
                "disposition": "invalid",
                "direction": observation.direction.value,
                "kind": "invalid",
                "reason": observation.reason.value,
                "handling": observation.handling.value,
                "size": observation.size,
            }
        case TooManyPending():
            record = {
                "event": "message",
                "disposition": "too_many_pending",
                "direction": observation.direction.value,
                "kind": "request",
                "method": observation.method,
                "session": observation.session,
                "id": _id(observation.original_id),
                "limit": observation.limit,
            }
        case InflightRefused():
            record = {
                "event": "message",
                "disposition": "too_much_in_flight",
                "direction": observation.direction.value,
                "size": observation.size,
                "in_flight": observation.in_flight,
            }
        case Orphaned():
            record = {
                "event": "message",
                "disposition": "orphaned",
                "direction": observation.direction.value,
                "kind": observation.kind.value,
                "forwarded_id": _id(observation.id),
            }
        case Undeliverable():
            record = {
                "event": "message",
                "disposition": "undeliverable",
                "direction": observation.direction.value,
                "kind": observation.kind.value,
                "size": observation.size,
            }
            if observation.hold is not None:
                record["method"] = observation.method
                record["session"] = observation.session
                record["id"] = _id(observation.original_id)
                record["forwarded_id"] = _id(observation.forwarded_id)
                record["hold"] = observation.hold
        case Unroutable():
            record = {
                "event": "message",
                "disposition": "unroutable",
                "direction": observation.direction.value,
                "kind": "error",
                "size": observation.size,
            }
        case CancelDropped():
            record = {
                "event": "message",
                "disposition": "cancel_dropped",
                "direction": observation.direction.value,
                "kind": "notification",
                "method": "$/cancel_request",
                "id": _id(observation.request_id),
            }
        case DuplicateSwallowed():
            record = {
                "event": "message",
                "disposition": "swallowed",
                "direction": observation.direction.value,
                "kind": "response",
                "method": observation.method,
                "session": observation.session,
                "id": _id(observation.original_id),
                "forwarded_id": _id(observation.forwarded_id),
                "size": len(observation.data),
            }
        case InitializeCached():
            record = {
                "event": "message",
                "disposition": "answered_from_cache",
                "direction": "to_agent",
                "kind": "request",
                "method": "initialize",
                "id": _id(observation.id),
            }
        case InitializeTimedOut():
            record = {
                "event": "message",
                "disposition": "timed_out",
                "direction": "to_client",
                "kind": "error",
                "method": "initialize",
                "id": _id(observation.id),
                "forwarded_id": _id(observation.forwarded_id),
                "timeout_ms": round(observation.timeout * 1000, 3),
            }
        case FaultInjected():
            record = {
                "event": "fault",
                "rule": observation.rule,
                "action": observation.action,
                "direction": observation.direction.value,
                "kind": observation.kind.value,
                "method": observation.method,
                "session": observation.session,
                "id": _id(observation.id),
            }
        case Connected() | Disconnected():
            record = {
                "event": "connection",
                "state": "open" if isinstance(observation, Connected) else "closed",
                "side": observation.side.value,
                "transport": observation.transport,
            }
        case Restarted():
            record = {
                "event": "restart",
                "what": observation.what,
                "abandoned": observation.abandoned,
            }
        case Finding():
            record = {
                "event": "finding",
                "check": observation.check,
                "session": observation.session,
                "key": observation.key,
                "detail": observation.detail,
            }
        case KeyedAttempt():
            record = {
                "event": "keyed",
                "session": observation.session,
                "key": observation.key,
                "prompt": observation.prompt,
                "retry": observation.retry,
            }
        case KeyedMessage():
            record = {
                "event": "keyed_message",
                "session": observation.session,
                "key": observation.key,
                "message_id": observation.message_id,
                "via": observation.via,
            }
        case RulesReloaded():
            record = {"event": "reload", "result": observation.result, "rules": observation.rules}
        case _:
            return None
    base.update(record)
    return base


def _dumps(record: dict[str, Any]) -> bytes:
    """One trace line. A peer's method or session may hold a lone surrogate (valid JSON, not
    UTF-8): it is written as the text ``\\ud800``, as in log lines, so every reader can read it."""
    try:
        return orjson.dumps(record)
    except TypeError:  # orjson.JSONEncodeError
        return orjson.dumps(
            {
                key: value.encode("utf-8", "backslashreplace").decode()
                if isinstance(value, str)
                else value
                for key, value in record.items()
            }
        )


class TraceWriter:
    """An observer appending each trace record as one line to a file."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._file: IO[bytes] = open(path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
        self._clock = clock
        self._file.write(
            orjson.dumps({"time": clock(), "event": "trace", "version": TRACE_VERSION}) + b"\n"
        )

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Append the observation's record (one write, unbuffered)."""
        record = trace_record(observation, link, self._clock())
        if record is not None:
            self._file.write(_dumps(record) + b"\n")

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class EventFeed:
    """Trace records for live subscribers (``/api/events``); a slow one loses records, counted."""

    def __init__(self, clock: Callable[[], float] = time.time, depth: int = 1024) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._clock = clock
        self._depth = depth
        self.lost = 0

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A new queue of records; pass it to :meth:`unsubscribe` when done."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self._depth)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Stop feeding ``queue``."""
        self._subscribers.discard(queue)

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Hand the observation's record to every subscriber (never blocks)."""
        if not self._subscribers:
            return
        record = trace_record(observation, link, self._clock())
        if record is None:
            return
        for queue in self._subscribers:
            try:
                queue.put_nowait(record)
            except asyncio.QueueFull:
                self.lost += 1
