"""Prompts rebuilt from merged traces: each ``session/prompt`` attempt, its outcome, its retries.

The trace has no payloads, so a prompt is rebuilt from its records:

* an *attempt* is a ``session/prompt`` request the Client sent: a relayed request, or a fault on
  a request that never got relayed (``drop``, ``error``, ``sever`` before it). The records the
  proxy writes for one message follow each other in its file (faults first, then the message or
  its ``held`` record, then the copies of a ``duplicate`` or their ``held`` records; a
  ``finding`` may come between), which is how a fault and the request it hit are joined (``drop``
  and ``error`` never forward, so a relayed request after one of them is the Client's resend, a
  new attempt); a held request is relayed later, joined to its attempt by its ``hold``;
* its answer is the ``to_client`` response or error with the same node, link and
  ``forwarded_id`` (a fault on the answer carries that ``forwarded_id`` as its ``id``); answers
  to injected copies that the proxy swallowed are counted with it;
* its *outcome*: ``answered``, ``error`` (the Agent's), ``injected_error`` (a rule's ``error``),
  ``lost`` (no answer reached the Client, and the trace shows why: a fault that loses messages on
  the request or its answer, a restart, a connection closed or the proxy process starting again
  while it was pending) or ``unanswered`` (no answer and no known cause: the trace ended first).

Keys come from the ledger's ``keyed`` record just before the request it names, so a keyed
attempt carries its key and a **retry** is exact: a keyed attempt retries the latest earlier
attempt with its session and key, on any node (a session is the Agent's, ``across_nodes``); an
unkeyed attempt is taken for a retry when it is the first ``session/prompt`` on its session after
a prompt of that session was lost (the trace cannot tell a resend from a new prompt then). A
retry is measured from the loss (``delay_ms``; from the attempt it retries when the trace shows
no loss) and marked ``same_size`` when its size, less its id, equals the retried one's (an
identical resend, key included, is the same size).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from proxy.core import acp
from proxy.core.actions import ActionName
from proxy.core.events import Direction
from proxy.core.jsonrpc import Kind
from proxy.core.ledger import LOSING_ACTIONS
from proxy.core.records import (
    ConnectionRecord,
    Disposition,
    FaultRecord,
    FindingRecord,
    HeldEndedRecord,
    HeldRecord,
    JsonValue,
    KeyedMessageRecord,
    KeyedRecord,
    MessageRecord,
    RestartRecord,
    TraceHeader,
)
from proxy.tools.report.load import Entry
from proxy.tools.report.model import AttemptFault, AttemptView, Outcome, RetryView

__all__ = [
    "LEDGER_RECORDS",
    "Attempt",
    "Prompts",
    "hold_key",
    "rules_text",
    "since",
    "wire_text",
]

LEDGER_RECORDS = (KeyedRecord, KeyedMessageRecord, FindingRecord)
"""Records the ledger writes, in the middle of the message that caused them."""
STOPPING_ACTIONS = frozenset({ActionName.DROP, ActionName.ERROR})
"""Faults after which a request is never forwarded (so a relayed request after one is another)."""
ANSWER_LOSING_ACTIONS = frozenset(
    {ActionName.CLOSE_STREAM, ActionName.CORRUPT, ActionName.TRUNCATE}
)
"""Faults after which an answer recorded as relayed still never reached the Client intact."""
_ANSWERS = (Kind.RESPONSE, Kind.ERROR)
_Named = HeldRecord | MessageRecord | FaultRecord
"""The records that name a message: its link, session and id."""

HoldKey = tuple[str, int, int | None, int | None]
"""What names one hold: the node, the proxy run in its file, the link, the ``hold``."""
PendingKey = tuple[str, int, int | None, str]
"""What names a request awaiting its answer: node, run, link, its ``forwarded_id`` (as text)."""
_Waiting = TypeVar("_Waiting", HoldKey, PendingKey)
"""The key of a table of attempts awaiting something: a hold's delivery, or an answer."""


def wire_text(value: JsonValue) -> str:
    """A JSON value (an id) as compact text, as it would appear on the wire."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def hold_key(entry: Entry, record: HeldRecord | MessageRecord | HeldEndedRecord) -> HoldKey:
    """What names one hold: a ``held`` record, the ``message`` record of its delivery and a
    ``hold`` rule's ``held_ended`` record share it (the node, the proxy run in its file, the
    link, the ``hold``)."""
    return (entry.node, entry.run, record.link, record.hold)


def rules_text(rules: tuple[str, ...]) -> str:
    """The rules of a ``held`` record as one text (``a, b``)."""
    return ", ".join(rules)


def since(at: float | None, start: float | None) -> float | None:
    """Seconds from ``start`` to ``at`` (rounded to the microsecond), if both are known."""
    if at is None or start is None:
        return None
    return round(at - start, 6)


@dataclass(frozen=True, slots=True)
class _Fault:
    """A fault on a prompt's request or on its answer."""

    rule: str
    action: ActionName | str
    node: str
    time: float
    on: Literal["request", "answer"]

    def name(self) -> str:
        return f"{self.action} (rule {self.rule})"

    def view(self) -> AttemptFault:
        return {"rule": self.rule, "action": self.action, "node": self.node, "on": self.on}


@dataclass(kw_only=True)
class Attempt:
    """One ``session/prompt`` the Client sent, as the trace shows it."""

    node: str
    run: int
    link: int | None
    session: str | None
    id: JsonValue
    time: float
    forwarded_id: JsonValue = None
    relayed: bool = False
    size: int | None = None
    copies: int = 0
    swallowed: int = 0
    holds: int = 0
    """Its ``held`` records (a delay, spaced copies): it, or its copies, left later."""
    faults: list[_Fault] = field(default_factory=list)
    answer: Literal["answered", "error", "injected_error"] | None = None
    duration_ms: float | None = None
    cut_at: float | None = None
    cut_by: str | None = None
    key: str | None = None
    """The idempotency key, from the ledger's ``keyed`` record just before the request's."""
    retry_of: Attempt | None = None

    def loss(self) -> tuple[float, str] | None:
        """When and how this attempt's answer was lost to the Client, if it was."""
        for fault in self.faults:
            if fault.action in ANSWER_LOSING_ACTIONS and fault.on == "answer":
                return fault.time, fault.name()
        if self.answer is not None:
            return None
        for fault in self.faults:
            if fault.action in LOSING_ACTIONS:
                return fault.time, fault.name()
        if self.cut_at is not None and self.cut_by is not None:
            return self.cut_at, self.cut_by
        return None

    def outcome(self) -> Outcome:
        """``answered``, ``error``, ``injected_error``, ``lost`` or ``unanswered``."""
        if self.loss() is not None:
            return "lost"
        if self.answer is not None:
            return self.answer
        return "unanswered"

    def body_size(self) -> int | None:
        """The request's size less its id's, to compare a retry with the prompt it resends."""
        if self.size is None:
            return None
        return self.size - len(wire_text(self.id))

    def view(self, start: float | None) -> AttemptView:
        loss = self.loss()
        return {
            "node": self.node,
            "link": self.link,
            "session": self.session,
            "id": self.id,
            "forwarded_id": self.forwarded_id,
            "time": self.time,
            "at_s": since(self.time, start),
            "size": self.size,
            "relayed": self.relayed,
            "copies": self.copies,
            "swallowed_answers": self.swallowed,
            "faults": [fault.view() for fault in self.faults],
            "outcome": self.outcome(),
            "duration_ms": self.duration_ms,
            "lost_by": None if loss is None else loss[1],
            "key": self.key,
            "retry": self.retry_of is not None,
        }


class Prompts:
    """Joins the records of ``session/prompt`` requests, their faults and their answers."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self._pending: dict[PendingKey, Attempt] = {}
        self._last: dict[str, tuple[int, Attempt]] = {}
        """Per node: the attempt the node's previous record (findings aside) belonged to."""
        self._position: Counter[str] = Counter()
        self._keyed: dict[str, tuple[int, KeyedRecord]] = {}
        """Per node: the last ``keyed`` record, and the position of the record before it."""
        self._held: dict[HoldKey, Attempt] = {}
        """Prompt requests held by the proxy (:func:`hold_key`), until they are sent."""

    def step(self, entry: Entry) -> None:
        """Take the next record (the ledger's records never separate a message from its faults)."""
        node, record = entry.node, entry.record
        if isinstance(record, KeyedRecord):
            self._keyed[node] = (self._position[node], record)
        if isinstance(record, LEDGER_RECORDS):
            return
        self._position[node] += 1
        match record:
            case TraceHeader():
                if entry.run > 1 or self._position[node] > 1:
                    self._cut_all(node, record.time, "the proxy process started again")
            case MessageRecord(method=acp.PROMPT):
                self._message(entry, record)
            case HeldRecord(method=acp.PROMPT):
                self._hold(entry, record)
            case FaultRecord(method=acp.PROMPT):
                self._fault(entry, record)
            case RestartRecord():
                why = f"restart ({record.what})"
                self._cut_link(entry, record.link, why, forget=True, overrides=True)
            case ConnectionRecord(state="closed"):
                why = f"{record.side} connection closed"
                self._cut_link(entry, record.link, why, forget=False)

    def _previous(
        self, node: str, record: HeldRecord | MessageRecord | FaultRecord
    ) -> Attempt | None:
        """The attempt of this node's previous record, if it is the same request."""
        last = self._last.get(node)
        if last is None or last[0] != self._position[node] - 1:
            return None
        attempt = last[1]
        if attempt.link == record.link and attempt.id == record.id:
            return attempt
        return None

    def _new(self, entry: Entry, record: _Named) -> Attempt:
        attempt = Attempt(
            node=entry.node,
            run=entry.run,
            link=record.link,
            session=record.session,
            id=record.id,
            time=record.time,
        )
        self.attempts.append(attempt)
        return attempt

    def _key_of(self, node: str, record: MessageRecord) -> str | None:
        """A relayed request's idempotency key: the ``keyed`` record just before it names it."""
        keyed = self._keyed.pop(node, None)
        if keyed is None or keyed[0] != self._position[node] - 1:
            return None
        return keyed[1].key if keyed[1].link == record.link else None

    @staticmethod
    def _key(entry: Entry, link: int | None, forwarded_id: JsonValue) -> PendingKey:
        return (entry.node, entry.run, link, wire_text(forwarded_id))

    def _hold(self, entry: Entry, record: HeldRecord) -> None:
        """A prompt request held by the proxy: the attempt its faults (or its original, for a
        spaced copy) began, found again by its hold when it is sent."""
        if record.direction is not Direction.TO_AGENT or record.kind is not Kind.REQUEST:
            return
        attempt = self._previous(entry.node, record) or self._new(entry, record)
        attempt.holds += 1
        self._held[hold_key(entry, record)] = attempt
        self._last[entry.node] = (self._position[entry.node], attempt)

    def _message(self, entry: Entry, record: MessageRecord) -> None:
        node, direction, kind = entry.node, record.direction, record.kind
        disposition = record.disposition
        held: Attempt | None = None
        if record.hold is not None and direction is Direction.TO_AGENT and kind is Kind.REQUEST:
            held = self._held.pop(hold_key(entry, record), None)
            if held is not None and held.cut_at is None:
                if disposition is Disposition.UNDELIVERABLE:
                    held.cut_at = record.time
                    held.cut_by = "undeliverable (the agent's connection had closed)"
                elif disposition is Disposition.DROPPED:  # a hold rule's message dropped
                    held.cut_at = record.time
                    held.cut_by = f"dropped while held ({record.rule})"
        if (
            direction is Direction.TO_AGENT
            and kind is Kind.REQUEST
            and disposition is Disposition.RELAYED
        ):
            attempt = held or self._previous(node, record)
            if (
                held is None
                and attempt is not None
                and (attempt.holds or any(f.action in STOPPING_ACTIONS for f in attempt.faults))
            ):
                attempt = None  # that request was never forwarded, or only when released
            if held is not None and held.relayed:
                held.copies += 1  # a spaced copy, sent after its original
            elif attempt is not None and attempt.relayed:
                if not any(f.action == ActionName.DUPLICATE for f in attempt.faults):
                    attempt = None
                else:
                    attempt.copies += 1  # an injected copy of the request
            if attempt is None:
                attempt = self._new(entry, record)
            if not attempt.relayed:
                attempt.relayed = True
                attempt.key = self._key_of(node, record)
                attempt.forwarded_id = record.forwarded_id
                attempt.size = record.size
            self._pending[self._key(entry, record.link, record.forwarded_id)] = attempt
            self._last[node] = (self._position[node], attempt)
        elif direction is Direction.TO_CLIENT and kind in _ANSWERS:
            found = self._pending.pop(self._key(entry, record.link, record.forwarded_id), None)
            if found is None:
                return
            if disposition is Disposition.SWALLOWED:
                found.swallowed += 1
            elif disposition is Disposition.DROPPED and found.cut_at is None:
                # a hold rule's answer dropped (a drop rule's fault came first and says so)
                found.cut_at = record.time
                found.cut_by = f"answer dropped while held ({record.rule})"
            elif disposition is Disposition.RELAYED and found.answer is None:
                found.answer = "answered" if kind is Kind.RESPONSE else "error"
                found.duration_ms = record.duration_ms

    def _fault(self, entry: Entry, record: FaultRecord) -> None:
        node = entry.node
        if record.direction is Direction.TO_AGENT and record.kind is Kind.REQUEST:
            attempt = self._previous(node, record)
            if attempt is None or attempt.relayed:
                attempt = self._new(entry, record)
            attempt.faults.append(_Fault(record.rule, record.action, node, record.time, "request"))
            if record.action == ActionName.ERROR:
                attempt.answer = "injected_error"
            self._last[node] = (self._position[node], attempt)
        elif record.direction is Direction.TO_CLIENT and record.kind in _ANSWERS:
            found = self._pending.get(self._key(entry, record.link, record.id))
            if found is not None:
                found.faults.append(_Fault(record.rule, record.action, node, record.time, "answer"))

    def _cut_link(
        self, entry: Entry, link: int | None, why: str, *, forget: bool, overrides: bool = False
    ) -> None:
        """Requests pending on the link will not be answered now.

        A restart names the cause even when the Agent's closed connection was recorded first.
        """
        scope, at = (entry.node, entry.run, link), entry.time
        _cut_on_link(self._pending, scope, at, why, forget=forget, overrides=overrides)
        _cut_on_link(self._held, scope, at, why, forget=forget, overrides=overrides)

    def _cut_all(self, node: str, at: float, why: str) -> None:
        _cut_on_node(self._pending, node, at, why)
        _cut_on_node(self._held, node, at, why)

    def retries(self, start: float | None) -> list[RetryView]:
        """Mark and list the retries.

        A keyed attempt retries the latest earlier attempt with its session and key, on any node;
        an unkeyed one is a retry when it is the first prompt on its session after one of its
        losses (the trace cannot tell a resend from a new prompt then).
        """
        losses: dict[str | None, list[tuple[float, Attempt, str]]] = defaultdict(list)
        for attempt in self.attempts:
            loss = attempt.loss()
            if loss is not None:
                losses[attempt.session].append((loss[0], attempt, loss[1]))
        found: list[RetryView] = []
        previous: dict[str | None, float] = {}
        keyed: dict[tuple[str, str], Attempt] = {}
        for attempt in sorted(self.attempts, key=lambda a: a.time):
            before = previous.get(attempt.session)
            previous[attempt.session] = attempt.time
            if attempt.session is None:
                continue
            if attempt.key is not None:
                lost = keyed.get((attempt.session, attempt.key))
                keyed[attempt.session, attempt.key] = attempt
                if lost is None:
                    continue
                loss = lost.loss()
                if loss is None or loss[0] > attempt.time:  # a loss after the resend is no cause
                    loss = (lost.time, "no loss the trace shows")
                at, how = loss
            else:
                candidates = [
                    loss
                    for loss in losses.get(attempt.session, ())
                    if loss[1] is not attempt
                    and before is not None
                    and before <= loss[0] <= attempt.time
                ]
                if not candidates:
                    continue
                at, lost, how = max(candidates, key=lambda loss: loss[0])
            attempt.retry_of = lost
            mine, theirs = attempt.body_size(), lost.body_size()
            found.append(
                {
                    "session": attempt.session,
                    "key": attempt.key,
                    "node": attempt.node,
                    "link": attempt.link,
                    "id": attempt.id,
                    "time": attempt.time,
                    "at_s": since(attempt.time, start),
                    "outcome": attempt.outcome(),
                    "after": how,
                    "lost_node": lost.node,
                    "lost_link": lost.link,
                    "lost_id": lost.id,
                    "lost_time": lost.time,
                    "delay_ms": round((attempt.time - at) * 1000, 3),
                    "across_nodes": lost.node != attempt.node,
                    "same_size": None if mine is None or theirs is None else mine == theirs,
                }
            )
        return found


def _cut_on_link(
    table: dict[_Waiting, Attempt],
    scope: tuple[str, int, int | None],
    at: float,
    why: str,
    *,
    forget: bool,
    overrides: bool,
) -> None:
    """The attempts of ``table`` on one link (``scope``: node, run, link) were cut ``at``, ``why``
    (``overrides``: even when a cause is known); ``forget`` takes them out of the table."""
    for key, attempt in list(table.items()):
        if key[:3] == scope:
            if attempt.cut_at is None:
                attempt.cut_at = at
            if attempt.cut_by is None or overrides:
                attempt.cut_by = why
            if forget:
                del table[key]


def _cut_on_node(table: dict[_Waiting, Attempt], node: str, at: float, why: str) -> None:
    """The attempts of ``table`` on ``node`` were cut ``at``, ``why``, unless they were already;
    they leave the table."""
    for key, attempt in list(table.items()):
        if key[0] == node:
            if attempt.cut_at is None:
                attempt.cut_at, attempt.cut_by = at, why
            del table[key]
