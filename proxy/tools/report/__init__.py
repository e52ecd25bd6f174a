"""``acp-proxy report``: what a run showed, read back from one or more JSONL traces.

Several proxies (one per node, DESIGN 14) each write their own trace; :func:`load_traces` reads
them all, tags every record with the file it came from (``node``, the path as given) and its line
number (``line``), and merges them by ``time``. The merge keeps each file's own order (a clock that
steps back never reorders one proxy's records) and, at equal times, the order of the files as
given. A line that is not a JSON object with a numeric ``time`` and a string ``event`` is skipped
and counted, never fatal: a proxy that crashed may have left a partial last line. A file that
cannot be read, or whose complete lines hold no record at all (not a trace), is an error.

:func:`summarize` turns the records into one JSON-ready summary; :func:`render_text` prints it for
people; :func:`report_main` is the command (text and exit status). The columns and rows of each
summary table (:func:`totals_rows`, :func:`faults_table` and the other ``*_table`` functions) are
defined here once, for the text and for the page of :mod:`proxy.tools.report.html`.

What the trace contains, and so what the summary can say
--------------------------------------------------------
The trace has no payloads: a ``message`` record carries direction, kind, method, session, the
sender's ``id``, the ``forwarded_id`` the proxy wrote on the next hop, its size and disposition,
but never ``params``. It is written when the message left the proxy: a message a rule held
(``delay``, a ``duplicate`` copy spaced by ``gap_ms``) has a ``held`` record when it arrived and
its ``message`` record, with the same ``hold``, when it was sent (or found its peer gone). So the
report counts messages (by direction, kind and method; every disposition other than ``relayed``
apart: dropped, answered by the proxy, severed, undeliverable..., and the held messages never
sent, discarded by a restart or still held when the run or the trace ended), held messages (by
rule, sent or not, and how long), faults (by rule and action), connections, restarts and reloads
exactly, and it reconstructs **prompts** (``session/prompt`` requests) from their records:

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

Keys and ``messageId`` s come from the ledger's own records (``keyed`` just before the request
it names, ``keyed_message``), so a keyed attempt carries its key and a **retry** is exact: a keyed
attempt retries the latest earlier attempt with its session and key, on any node (a session is the
Agent's, ``across_nodes``); an unkeyed attempt is taken for a retry when it is the first
``session/prompt`` on its session after a prompt of that session was lost (the trace cannot tell a
resend from a new prompt then). A retry is measured from the loss (``delay_ms``; from the attempt
it retries when the trace shows no loss) and marked ``same_size`` when its size, less its id,
equals the retried one's (an identical resend, key included, is the same size). Per-key judgement
is first the ledgers': each proxy writes its findings (``finding`` records: check, session, key,
detail) to its trace, and the report lists them all. A ledger judges only what crossed its own
proxy, so :mod:`proxy.tools.report.keys` judges each key again over every node and run and adds the
findings only the merged traces show (``by: report``, with the ``nodes`` involved).

Exit status of :func:`report_main`: 0, or 1 when there is a finding other than ``unkeyed_resend``
(a warning: an unsafe retry of the Client), so that CI can fail on it; 2 when a file is missing,
unreadable or not a trace.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.core.ledger import LOSING_ACTIONS
from proxy.tools.report.keys import KEY_EVENTS, Keys

__all__ = [
    "LEDGER_EVENTS",
    "PROMPT",
    "WARNING_CHECKS",
    "Table",
    "TraceReadError",
    "TraceRecords",
    "connections_table",
    "faults_table",
    "findings_phrase",
    "findings_table",
    "held_table",
    "hold_key",
    "keys_note",
    "keys_table",
    "load_traces",
    "not_relayed_table",
    "parse_record",
    "plural",
    "prompts_note",
    "prompts_table",
    "relayed_table",
    "render_text",
    "report_main",
    "retries_table",
    "rules_text",
    "short_names",
    "summarize",
    "totals_rows",
    "wire_text",
]

REPORT_VERSION = 1
TRACE_VERSION = 1
"""The trace version this report is written for (``proxy.shell.trace``)."""
PROMPT = "session/prompt"
LEDGER_EVENTS = KEY_EVENTS | {"finding"}
"""Records the ledger writes, in the middle of the message that caused them."""
WARNING_CHECKS = frozenset({"unkeyed_resend"})
"""Findings that are warnings: they do not make ``report`` exit 1."""
STOPPING_ACTIONS = frozenset({"drop", "error"})
"""Faults after which a request is never forwarded (so a relayed request after one is another)."""
ANSWER_LOSING_ACTIONS = frozenset({"close_stream", "corrupt"})
"""Faults after which an answer recorded as relayed still never reached the Client intact."""
_KEEP_LINES = 20
"""How many unreadable line numbers are kept per file (all are counted)."""


class TraceReadError(Exception):
    """A trace file is missing, unreadable or not a trace; the message names the file."""


@dataclass
class _FileInfo:
    node: str
    records: int = 0
    skipped: int = 0
    unreadable: list[int] = field(default_factory=list)
    partial_last_line: bool = False
    runs: int = 0
    versions: list[Any] = field(default_factory=list)
    first: float | None = None
    last: float | None = None


class TraceRecords(list[dict[str, Any]]):
    """The merged records of :func:`load_traces` (a list), with what was learnt of each file."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        super().__init__(records)
        self.files: list[_FileInfo] = []
        self.notes: list[str] = []


def parse_record(line: bytes) -> dict[str, Any] | None:
    """A trace record parsed from one line (a JSON object with ``time`` and ``event``), or
    ``None`` when the line is not one."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("event"), str):
        return None
    at = value.get("time")
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        return None
    return value


def _read_file(path: Path) -> tuple[list[dict[str, Any]], _FileInfo]:
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceReadError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TraceReadError(f"{name}: is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceReadError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    info = _FileInfo(name)
    records: list[dict[str, Any]] = []
    lines = data.split(b"\n")
    complete = len(lines) - 1  # the text after the last newline is a partial line (or empty)
    complete_unreadable = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = parse_record(line)
        if record is None:
            info.skipped += 1
            if len(info.unreadable) < _KEEP_LINES:
                info.unreadable.append(number)
            if number > complete:
                info.partial_last_line = True
            else:
                complete_unreadable += 1
            continue
        record["node"] = name
        record["line"] = number
        records.append(record)
        if record["event"] == "trace":
            info.runs += 1
            info.versions.append(record.get("version"))
    if not records and complete_unreadable:
        raise TraceReadError(
            f"{name}: no trace records (line {info.unreadable[0]} is not a JSON object with "
            "time and event); is it a trace file?"
        )
    info.records = len(records)
    if records:
        info.first = min(float(r["time"]) for r in records)
        info.last = max(float(r["time"]) for r in records)
    return records, info


def load_traces(paths: Sequence[Path]) -> TraceRecords:
    """Every record of every file, tagged with ``node`` and ``line``, merged by ``time``.

    Unreadable lines are skipped and counted (see :attr:`TraceRecords.files`); a file given twice
    is read once. Raises :class:`TraceReadError` for a missing or unreadable file, or one whose
    complete lines hold no record.
    """
    streams: list[list[dict[str, Any]]] = []
    infos: list[_FileInfo] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        resolved = path.resolve()
        if resolved in seen:
            notes.append(f"{path} was given more than once; read once")
            continue
        seen.add(resolved)
        records, info = _read_file(path)
        streams.append(records)
        infos.append(info)
    merged = TraceRecords(heapq.merge(*streams, key=lambda record: float(record["time"])))
    merged.files = infos
    merged.notes = notes
    return merged


# -- prompts -------------------------------------------------------------------------------------


@dataclass
class _Attempt:
    """One ``session/prompt`` the Client sent, as the trace shows it."""

    node: str
    run: int
    link: Any
    session: str | None
    id: Any
    time: float
    forwarded_id: Any = None
    relayed: bool = False
    size: int | None = None
    copies: int = 0
    swallowed: int = 0
    holds: int = 0
    """Its ``held`` records (a delay, spaced copies): it, or its copies, left later."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    answered_at: float | None = None
    duration_ms: float | None = None
    cut_at: float | None = None
    cut_by: str | None = None
    key: str | None = None
    """The idempotency key, from the ledger's ``keyed`` record just before the request's."""
    retry_of: _Attempt | None = None

    def loss(self) -> tuple[float, str] | None:
        """When and how this attempt's answer was lost to the Client, if it was."""
        for fault in self.faults:
            if fault["action"] in ANSWER_LOSING_ACTIONS and fault["on"] == "answer":
                return fault["time"], _fault_name(fault)
        if self.answer is not None:
            return None
        for fault in self.faults:
            if fault["action"] in LOSING_ACTIONS:
                return fault["time"], _fault_name(fault)
        if self.cut_at is not None and self.cut_by is not None:
            return self.cut_at, self.cut_by
        return None

    def outcome(self) -> str:
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

    def view(self, start: float | None) -> dict[str, Any]:
        loss = self.loss()
        return {
            "node": self.node,
            "link": self.link,
            "session": self.session,
            "id": self.id,
            "forwarded_id": self.forwarded_id,
            "time": self.time,
            "at_s": _since(self.time, start),
            "size": self.size,
            "relayed": self.relayed,
            "copies": self.copies,
            "swallowed_answers": self.swallowed,
            "faults": [{k: v for k, v in f.items() if k != "time"} for f in self.faults],
            "outcome": self.outcome(),
            "duration_ms": self.duration_ms,
            "lost_by": None if loss is None else loss[1],
            "key": self.key,
            "retry": self.retry_of is not None,
        }


def wire_text(value: Any) -> str:
    """A JSON value (an id) as compact text, as it would appear on the wire."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def hold_key(node: str, run: int, record: dict[str, Any]) -> tuple[str, int, str, str]:
    """What names one hold: a ``held`` record and the ``message`` record of its delivery share
    it (the node, the proxy run in its file, the link, the ``hold``)."""
    return (node, run, wire_text(record.get("link")), wire_text(record.get("hold")))


def rules_text(rules: Any) -> str:
    """The rules of a ``held`` record as one text (``a, b``)."""
    if isinstance(rules, list):
        return ", ".join(str(rule) for rule in rules)
    return "-" if rules is None else str(rules)


def _fault_name(fault: dict[str, Any]) -> str:
    return f"{fault['action']} (rule {fault['rule']})"


def _since(at: float | None, start: float | None) -> float | None:
    if at is None or start is None:
        return None
    return round(at - start, 6)


class _Prompts:
    """Joins the records of ``session/prompt`` requests, their faults and their answers."""

    def __init__(self) -> None:
        self.attempts: list[_Attempt] = []
        self._pending: dict[tuple[str, int, str, str], _Attempt] = {}
        self._last: dict[str, tuple[int, _Attempt]] = {}
        """Per node: the attempt the node's previous record (findings aside) belonged to."""
        self._position: Counter[str] = Counter()
        self._run: Counter[str] = Counter()
        self._keyed: dict[str, tuple[int, dict[str, Any]]] = {}
        """Per node: the last ``keyed`` record, and the position of the record before it."""
        self._held: dict[tuple[str, int, str, str], _Attempt] = {}
        """Prompt requests held by the proxy (:func:`hold_key`), until they are sent."""

    def step(self, record: dict[str, Any]) -> None:
        """Take the next record (the ledger's records never separate a message from its faults)."""
        node = str(record.get("node") or "-")
        event = record["event"]
        if event == "keyed":
            self._keyed[node] = (self._position[node], record)
        if event in LEDGER_EVENTS:
            return
        self._position[node] += 1
        if event == "trace":
            if self._run[node] or self._position[node] > 1:
                self._cut_all(node, float(record["time"]), "the proxy process started again")
            self._run[node] += 1
        elif event == "message" and record.get("method") == PROMPT:
            self._message(node, record)
        elif event == "held" and record.get("method") == PROMPT:
            self._hold(node, record)
        elif event == "fault" and record.get("method") == PROMPT:
            self._fault(node, record)
        elif event == "restart":
            what = record.get("what") or "proxy"
            self._cut_link(node, record, f"restart ({what})", forget=True, overrides=True)
        elif event == "connection" and record.get("state") == "closed":
            self._cut_link(node, record, f"{record.get('side')} connection closed", forget=False)

    def _previous(self, node: str, record: dict[str, Any]) -> _Attempt | None:
        """The attempt of this node's previous record, if it is the same request."""
        last = self._last.get(node)
        if last is None or last[0] != self._position[node] - 1:
            return None
        attempt = last[1]
        if attempt.link == record.get("link") and attempt.id == record.get("id"):
            return attempt
        return None

    def _new(self, node: str, record: dict[str, Any]) -> _Attempt:
        session = record.get("session")
        attempt = _Attempt(
            node,
            self._run[node],
            record.get("link"),
            session if isinstance(session, str) else None,
            record.get("id"),
            float(record["time"]),
        )
        self.attempts.append(attempt)
        return attempt

    def _key_of(self, node: str, record: dict[str, Any]) -> str | None:
        """A relayed request's idempotency key: the ``keyed`` record just before it names it."""
        keyed = self._keyed.pop(node, None)
        if keyed is None or keyed[0] != self._position[node] - 1:
            return None
        key = keyed[1].get("key")
        same = keyed[1].get("link") == record.get("link")
        return key if same and isinstance(key, str) else None

    def _key(
        self, node: str, record: dict[str, Any], forwarded_id: Any
    ) -> tuple[str, int, str, str]:
        return (node, self._run[node], wire_text(record.get("link")), wire_text(forwarded_id))

    def _hold(self, node: str, record: dict[str, Any]) -> None:
        """A prompt request held by the proxy: the attempt its faults (or its original, for a
        spaced copy) began, found again by its hold when it is sent."""
        if record.get("direction") != "to_agent" or record.get("kind") != "request":
            return
        attempt = self._previous(node, record) or self._new(node, record)
        attempt.holds += 1
        self._held[hold_key(node, self._run[node], record)] = attempt
        self._last[node] = (self._position[node], attempt)

    def _message(self, node: str, record: dict[str, Any]) -> None:
        direction, kind = record.get("direction"), record.get("kind")
        disposition = record.get("disposition", "relayed")
        held: _Attempt | None = None
        if "hold" in record and direction == "to_agent" and kind == "request":
            held = self._held.pop(hold_key(node, self._run[node], record), None)
            if held is not None and disposition == "undeliverable" and held.cut_at is None:
                held.cut_at = float(record["time"])
                held.cut_by = "undeliverable (the agent's connection had closed)"
        if direction == "to_agent" and kind == "request" and disposition == "relayed":
            attempt = held or self._previous(node, record)
            forwarded = record.get("forwarded_id")
            if (
                held is None
                and attempt is not None
                and (attempt.holds or any(f["action"] in STOPPING_ACTIONS for f in attempt.faults))
            ):
                attempt = None  # that request was never forwarded, or only when released
            if held is not None and held.relayed:
                held.copies += 1  # a spaced copy, sent after its original
            elif attempt is not None and attempt.relayed:
                if not any(f["action"] == "duplicate" for f in attempt.faults):
                    attempt = None
                else:
                    attempt.copies += 1  # an injected copy of the request
            if attempt is None:
                attempt = self._new(node, record)
            if not attempt.relayed:
                attempt.relayed = True
                attempt.key = self._key_of(node, record)
                attempt.forwarded_id = forwarded
                size = record.get("size")
                attempt.size = size if isinstance(size, int) else None
            self._pending[self._key(node, record, forwarded)] = attempt
            self._last[node] = (self._position[node], attempt)
        elif direction == "to_client" and kind in ("response", "error"):
            found = self._pending.pop(self._key(node, record, record.get("forwarded_id")), None)
            if found is None:
                return
            if disposition == "swallowed":
                found.swallowed += 1
            elif disposition == "relayed" and found.answer is None:
                found.answer = "answered" if kind == "response" else "error"
                found.answered_at = float(record["time"])
                duration = record.get("duration_ms")
                found.duration_ms = duration if isinstance(duration, int | float) else None

    def _fault(self, node: str, record: dict[str, Any]) -> None:
        fault = {
            "rule": record.get("rule"),
            "action": record.get("action"),
            "node": node,
            "time": float(record["time"]),
        }
        direction, kind = record.get("direction"), record.get("kind")
        if direction == "to_agent" and kind == "request":
            attempt = self._previous(node, record)
            if attempt is None or attempt.relayed:
                attempt = self._new(node, record)
            attempt.faults.append({**fault, "on": "request"})
            if fault["action"] == "error":
                attempt.answer = "injected_error"
            self._last[node] = (self._position[node], attempt)
        elif direction == "to_client" and kind in ("response", "error"):
            found = self._pending.get(self._key(node, record, record.get("id")))
            if found is not None:
                found.faults.append({**fault, "on": "answer"})

    def _cut_link(
        self, node: str, record: dict[str, Any], why: str, *, forget: bool, overrides: bool = False
    ) -> None:
        """Requests pending on the link will not be answered now.

        A restart names the cause even when the Agent's closed connection was recorded first.
        """
        run, link, at = self._run[node], wire_text(record.get("link")), float(record["time"])
        for table in (self._pending, self._held):
            for key, attempt in list(table.items()):
                if key[:3] == (node, run, link):
                    if attempt.cut_at is None:
                        attempt.cut_at = at
                    if attempt.cut_by is None or overrides:
                        attempt.cut_by = why
                    if forget:
                        del table[key]

    def _cut_all(self, node: str, at: float, why: str) -> None:
        for table in (self._pending, self._held):
            for key, attempt in list(table.items()):
                if key[0] == node:
                    if attempt.cut_at is None:
                        attempt.cut_at, attempt.cut_by = at, why
                    del table[key]

    def retries(self, start: float | None) -> list[dict[str, Any]]:
        """Mark and list the retries.

        A keyed attempt retries the latest earlier attempt with its session and key, on any node;
        an unkeyed one is a retry when it is the first prompt on its session after one of its
        losses (the trace cannot tell a resend from a new prompt then).
        """
        losses: dict[str | None, list[tuple[float, _Attempt, str]]] = defaultdict(list)
        for attempt in self.attempts:
            loss = attempt.loss()
            if loss is not None:
                losses[attempt.session].append((loss[0], attempt, loss[1]))
        found = []
        previous: dict[str | None, float] = {}
        keyed: dict[tuple[str, str], _Attempt] = {}
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
                    "at_s": _since(attempt.time, start),
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


# -- the summary ---------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _file_view(info: _FileInfo) -> dict[str, Any]:
    return {
        "node": info.node,
        "records": info.records,
        "skipped_lines": info.skipped,
        "unreadable_lines": list(info.unreadable),
        "partial_last_line": info.partial_last_line,
        "runs": info.runs,
        "trace_versions": list(info.versions),
        "first": info.first,
        "last": info.last,
    }


def _files_of(records: Sequence[dict[str, Any]]) -> list[_FileInfo]:
    """What can be said of each node from the records alone (no :class:`TraceRecords`)."""
    infos: dict[str, _FileInfo] = {}
    for record in records:
        node = str(record.get("node") or "-")
        info = infos.setdefault(node, _FileInfo(node))
        info.records += 1
        at = float(record["time"])
        info.first = at if info.first is None else min(info.first, at)
        info.last = at if info.last is None else max(info.last, at)
        if record["event"] == "trace":
            info.runs += 1
            info.versions.append(record.get("version"))
    return list(infos.values())


_NEVER_SENT = "never_sent"
"""The disposition of a held message that has no delivery record (``reason`` says why)."""


class _Holds:
    """Held messages: each ``held`` record joined to the record of its delivery (same
    :func:`hold_key`), counted by direction, kind, method and rules, sent or not."""

    def __init__(self) -> None:
        self.count: Counter[tuple[str, str, str, str]] = Counter()
        self.sent: Counter[tuple[str, str, str, str]] = Counter()
        self.delays: defaultdict[tuple[str, str, str, str], list[float]] = defaultdict(list)
        self.never_sent: Counter[tuple[str, str, str, str, str]] = Counter()
        """Held messages without a delivery, as rows of the messages not relayed."""
        self._open: dict[tuple[str, int, str, str], tuple[str, str, str, str]] = {}
        """Holds awaiting their delivery, and the row each is counted in."""
        self._run: Counter[str] = Counter()

    def step(self, record: dict[str, Any]) -> None:
        node = str(record.get("node") or "-")
        event = record["event"]
        if event == "trace":
            self._close(lambda key: key[0] == node, "the proxy run ended while it was held")
            self._run[node] += 1
        elif event == "restart":
            run, link = self._run[node], wire_text(record.get("link"))
            self._close(lambda key: key[:3] == (node, run, link), "a restart discarded it")
        elif event == "held":
            row = (
                str(record.get("direction") or "-"),
                str(record.get("kind") or "-"),
                str(record.get("method") or "-"),
                rules_text(record.get("rules")),
            )
            self.count[row] += 1
            delay = record.get("delay_ms")
            if isinstance(delay, int | float) and not isinstance(delay, bool):
                self.delays[row].append(float(delay))
            self._open[hold_key(node, self._run[node], record)] = row
        elif event == "message" and "hold" in record:
            held = self._open.pop(hold_key(node, self._run[node], record), None)
            if held is not None and record.get("disposition", "relayed") == "relayed":
                self.sent[held] += 1

    def _close(self, match: Callable[[tuple[str, int, str, str]], bool], why: str) -> None:
        for key in [key for key in self._open if match(key)]:
            direction, kind, method, _ = self._open.pop(key)
            self.never_sent[_NEVER_SENT, direction, kind, method, why] += 1

    def finish(self) -> None:
        """The trace ended: what is still held was never sent."""
        self._close(lambda key: True, "still held when the trace ended")

    def view(self) -> list[dict[str, Any]]:
        return [
            {
                "direction": direction,
                "kind": kind,
                "method": None if method == "-" else method,
                "rules": rules,
                "count": count,
                "sent": self.sent[direction, kind, method, rules],
                "not_sent": count - self.sent[direction, kind, method, rules],
                "delay_ms": _spread(self.delays.get((direction, kind, method, rules), [])),
            }
            for (direction, kind, method, rules), count in sorted(self.count.items())
        ]


class _Counts:
    """Counts of every record but the prompts' reconstruction."""

    def __init__(self, start: float | None) -> None:
        self.start = start
        self.relayed: Counter[tuple[str, str, str]] = Counter()
        self.bytes: Counter[tuple[str, str, str]] = Counter()
        self.durations: defaultdict[tuple[str, str, str], list[float]] = defaultdict(list)
        self.dispositions: Counter[str] = Counter()
        self.not_relayed: Counter[tuple[str, str, str, str, str]] = Counter()
        self.faults: Counter[tuple[str, str]] = Counter()
        self.fault_nodes: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
        self.actions: Counter[str] = Counter()
        self.opened: Counter[tuple[str, str]] = Counter()
        self.closed: Counter[tuple[str, str]] = Counter()
        self.restarts: Counter[str] = Counter()
        self.abandoned = 0
        self.reloads: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.findings: list[dict[str, Any]] = []
        self.holds = _Holds()

    def step(self, record: dict[str, Any]) -> None:
        event = record["event"]
        self.holds.step(record)
        if event == "held":
            pass  # counted by the holds
        elif event == "message":
            self._message(record)
        elif event == "fault":
            key = (str(record.get("rule")), str(record.get("action")))
            self.faults[key] += 1
            self.fault_nodes[key].add(str(record.get("node") or "-"))
            self.actions[key[1]] += 1
        elif event == "connection":
            pair = (str(record.get("side")), str(record.get("transport")))
            (self.opened if record.get("state") == "open" else self.closed)[pair] += 1
        elif event == "restart":
            self.restarts[str(record.get("what"))] += 1
            count = record.get("abandoned")
            self.abandoned += count if isinstance(count, int) else 0
        elif event == "reload":
            self.reloads[str(record.get("result"))] += 1
        elif event == "finding":
            self._finding(record)
        elif event != "trace" and event not in LEDGER_EVENTS:
            self.ignored[event] += 1

    def _message(self, record: dict[str, Any]) -> None:
        disposition = str(record.get("disposition", "relayed"))
        self.dispositions[disposition] += 1
        direction = str(record.get("direction") or "-")
        kind = str(record.get("kind") or "-")
        method = str(record.get("method") or "-")
        if disposition != "relayed":
            reason = str(record.get("reason") or "")
            self.not_relayed[disposition, direction, kind, method, reason] += 1
            return
        row = (direction, kind, method)
        self.relayed[row] += 1
        size = record.get("size")
        self.bytes[row] += size if isinstance(size, int) else 0
        duration = record.get("duration_ms")
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            self.durations[row].append(float(duration))

    def _finding(self, record: dict[str, Any]) -> None:
        check = str(record.get("check"))
        at = float(record["time"])
        self.findings.append(
            {
                "check": check,
                "warning": check in WARNING_CHECKS,
                "session": record.get("session"),
                "key": record.get("key"),
                "detail": record.get("detail"),
                "by": "proxy",
                "node": str(record.get("node") or "-"),
                "nodes": [str(record.get("node") or "-")],
                "link": record.get("link"),
                "time": at,
                "at_s": _since(at, self.start),
            }
        )

    def finish(self) -> None:
        """The trace ended: held messages never sent are counted as not relayed."""
        self.holds.finish()
        self.not_relayed.update(self.holds.never_sent)

    def messages(self) -> dict[str, Any]:
        return {
            "relayed": [
                {
                    "direction": direction,
                    "kind": kind,
                    "method": method,
                    "count": count,
                    "bytes": self.bytes[direction, kind, method],
                    "duration_ms": _spread(self.durations.get((direction, kind, method), [])),
                }
                for (direction, kind, method), count in sorted(self.relayed.items())
            ],
            "by_disposition": dict(sorted(self.dispositions.items())),
            "not_relayed": [
                {
                    "disposition": disposition,
                    "direction": direction,
                    "kind": kind,
                    "method": None if method == "-" else method,
                    "reason": reason or None,
                    "count": count,
                }
                for (disposition, direction, kind, method, reason), count in sorted(
                    self.not_relayed.items()
                )
            ],
            "held": self.holds.view(),
        }

    def faults_view(self) -> dict[str, Any]:
        return {
            "by_rule": [
                {
                    "rule": rule,
                    "action": action,
                    "count": count,
                    "nodes": sorted(self.fault_nodes[rule, action]),
                }
                for (rule, action), count in sorted(self.faults.items())
            ],
            "by_action": dict(sorted(self.actions.items())),
        }

    def connections(self) -> list[dict[str, Any]]:
        return [
            {
                "side": side,
                "transport": transport,
                "opened": self.opened[side, transport],
                "closed": self.closed[side, transport],
            }
            for side, transport in sorted(set(self.opened) | set(self.closed))
        ]


def _findings_view(findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "count": len(findings),
        "failing": sum(1 for finding in findings if not finding["warning"]),
        "by_check": dict(sorted(Counter(f["check"] for f in findings).items())),
        "list": findings,
    }


def _merged_findings(
    written: list[dict[str, Any]], keys: Keys, start: float | None
) -> list[dict[str, Any]]:
    """The ledgers' findings and those only the merged traces show
    (:mod:`proxy.tools.report.keys`)."""
    found = [
        {
            **finding,
            "warning": finding["check"] in WARNING_CHECKS,
            "by": "report",
            "node": None,
            "link": None,
            "at_s": _since(finding["time"], start),
        }
        for finding in keys.findings(written)
    ]
    return sorted(written + found, key=lambda finding: float(finding["time"]))


def _keys_view(keys: Keys, start: float | None) -> dict[str, Any]:
    listed = [{**key, "at_s": _since(key["time"], start)} for key in keys.view()]
    return {
        "count": len(listed),
        "retried": sum(1 for key in listed if key["retries"]),
        "across_nodes": sum(1 for key in listed if len(key["nodes"]) > 1),
        "duplicates": sum(1 for key in listed if key["verdict"] == "duplicate"),
        "list": listed,
    }


def _sessions(attempts: list[_Attempt], findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per session: attempts by outcome, retries, nodes, and the keys its findings name."""
    rows: dict[str | None, dict[str, Any]] = {}
    nodes: defaultdict[str | None, set[str]] = defaultdict(set)
    for attempt in attempts:
        row = rows.setdefault(
            attempt.session,
            {
                "session": attempt.session,
                "attempts": 0,
                "answered": 0,
                "errors": 0,
                "lost": 0,
                "unanswered": 0,
                "retries": 0,
                "nodes": [],
                "keys_in_findings": [],
            },
        )
        row["attempts"] += 1
        outcome = attempt.outcome()
        row["errors" if outcome in ("error", "injected_error") else outcome] += 1
        row["retries"] += int(attempt.retry_of is not None)
        nodes[attempt.session].add(attempt.node)
    for session, row in rows.items():
        row["nodes"] = sorted(nodes[session])
    for finding in findings:
        session, key = finding["session"], finding["key"]
        found = rows.get(session) if isinstance(session, str) else None
        if found is not None and isinstance(key, str) and key not in found["keys_in_findings"]:
            found["keys_in_findings"].append(key)
    return list(rows.values())


def _notes(files: list[_FileInfo]) -> list[str]:
    notes = []
    for info in files:
        for version in info.versions:
            if version != TRACE_VERSION:
                notes.append(
                    f"{info.node}: trace version {version!r}, this report reads version "
                    f"{TRACE_VERSION}; read as far as it goes"
                )
        if info.partial_last_line:
            notes.append(f"{info.node}: the last line is incomplete (the proxy stopped mid-write?)")
    return notes


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of merged trace records (from :func:`load_traces`), JSON-ready."""
    files = records.files if isinstance(records, TraceRecords) else _files_of(records)
    notes = list(records.notes) if isinstance(records, TraceRecords) else []
    notes += _notes(files)
    times = [float(r["time"]) for r in records]
    start, end = (min(times), max(times)) if times else (None, None)
    counts = _Counts(start)
    prompts = _Prompts()
    keys = Keys()
    for record in records:
        prompts.step(record)
        counts.step(record)
        keys.step(record)
    counts.finish()
    retries = prompts.retries(start)
    attempts = prompts.attempts
    outcomes = Counter(attempt.outcome() for attempt in attempts)
    all_findings = _merged_findings(counts.findings, keys, start)
    findings = _findings_view(all_findings)
    keyed = _keys_view(keys, start)
    verdict = "failing" if findings["failing"] else "warnings" if findings["count"] else "clean"
    return {
        "report_version": REPORT_VERSION,
        "files": [_file_view(info) for info in files],
        "notes": notes,
        "span": {
            "start": start,
            "end": end,
            "seconds": 0.0 if start is None or end is None else round(end - start, 6),
        },
        "verdict": verdict,
        "totals": {
            "files": len(files),
            "records": len(records),
            "skipped_lines": sum(info.skipped for info in files),
            "ignored_records": sum(counts.ignored.values()),
            "messages_relayed": sum(counts.relayed.values()),
            "bytes_relayed": sum(counts.bytes.values()),
            "messages_not_relayed": sum(counts.not_relayed.values()),
            "messages_held": sum(counts.holds.count.values()),
            "messages_held_sent": sum(counts.holds.sent.values()),
            "faults": sum(counts.faults.values()),
            "connections_opened": sum(counts.opened.values()),
            "connections_closed": sum(counts.closed.values()),
            "restarts": sum(counts.restarts.values()),
            "prompts": len(attempts),
            "prompts_lost": outcomes["lost"],
            "retries": len(retries),
            "keys": keyed["count"],
            "findings": findings["count"],
            "failing_findings": findings["failing"],
        },
        "faults": counts.faults_view(),
        "messages": counts.messages(),
        "connections": counts.connections(),
        "restarts": {
            "by_what": dict(sorted(counts.restarts.items())),
            "abandoned_requests": counts.abandoned,
            "proxy_runs": sum(info.runs for info in files),
        },
        "reloads": dict(sorted(counts.reloads.items())),
        "prompts": {
            "attempts": len(attempts),
            "copies": sum(attempt.copies for attempt in attempts),
            "swallowed_answers": sum(attempt.swallowed for attempt in attempts),
            "by_outcome": dict(sorted(outcomes.items())),
            "sessions": _sessions(attempts, all_findings),
            "list": [attempt.view(start) for attempt in attempts],
        },
        "retries": {
            "count": len(retries),
            "across_nodes": sum(1 for retry in retries if retry["across_nodes"]),
            "delay_ms": _spread([retry["delay_ms"] for retry in retries]),
            "list": retries,
        },
        "keys": keyed,
        "findings": findings,
        "ignored": dict(sorted(counts.ignored.items())),
    }


# -- text ----------------------------------------------------------------------------------------


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 word``, ``2 words`` (or ``many``)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows aligned under ``header``: numbers to the right, text to the left."""
    cells = [[_cell(value) for value in row] for row in rows]
    numeric = [True] * len(header)
    for row in rows:
        for index, value in enumerate(row):
            if not (value is None or isinstance(value, int | float)) or isinstance(value, bool):
                numeric[index] = False
    widths = [len(title) for title in header]
    for row_cells in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row_cells, strict=True)]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if numeric[index] else value.ljust(width)
            for index, (value, width) in enumerate(zip(values, widths, strict=True))
        ]
        return ("  " + "  ".join(parts)).rstrip()

    return [line(header), *(line(row_cells) for row_cells in cells)]


def _at(seconds: float | None) -> str:
    return "-" if seconds is None else f"+{seconds:.3f}s"


def findings_phrase(summary: dict[str, Any]) -> str:
    """The findings of a summary in a few words (``0 findings`` when clean)."""
    found = summary["findings"]
    count, failing = found["count"], found["failing"]
    if count == 0:
        return "0 findings"
    checks = ", ".join(f"{check} x{n}" for check, n in found["by_check"].items())
    if failing == 0:
        return f"{plural(count, 'finding')}, warnings only ({checks})"
    return f"{plural(count, 'finding')}, {failing} failing ({checks})"


def short_names(nodes: Iterable[str]) -> dict[str, str]:
    """Each node's shortest path suffix that no other node shares (``a.jsonl``, ``x/t.jsonl``)."""
    parts = {node: Path(node).parts or (node,) for node in nodes}
    deepest = max((len(p) for p in parts.values()), default=1)
    for depth in range(1, deepest + 1):
        names = {node: "/".join(p[-depth:]) for node, p in parts.items()}
        if len(set(names.values())) == len(names):
            return names
    return {node: node for node in parts}


# -- the summary tables --------------------------------------------------------------------------
# Each table of the summary, as its column titles and rows of cell values (``None``: no value),
# for both renderers: the text here (``_table``) and the page (``proxy.tools.report.html``) only
# format them. ``names`` names each node (:func:`short_names`; a node it lacks is shown as it is).

Table = tuple[list[str], list[list[Any]]]
"""A table: its column titles and its rows."""


def _nodes(names: Mapping[str, str], nodes: Iterable[str]) -> str:
    return ", ".join(names.get(node, node) for node in nodes)


def totals_rows(summary: dict[str, Any], *, runs_and_reloads: bool = False) -> list[list[str]]:
    """The totals, a ``[name, text]`` row each.

    ``runs_and_reloads`` adds the proxy runs, and the rule reloads when there were any, after the
    restarts.
    """
    totals, prompts = summary["totals"], summary["prompts"]
    retries, restarts = summary["retries"], summary["restarts"]
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in prompts["by_outcome"].items())
    retry_text = plural(retries["count"], "retry", "retries")
    if retries["across_nodes"]:
        retry_text += f" ({retries['across_nodes']} across nodes)"
    restart_text = str(totals["restarts"])
    if restarts["by_what"]:
        kinds = ", ".join(f"{what} x{n}" for what, n in restarts["by_what"].items())
        abandoned = plural(restarts["abandoned_requests"], "request")
        restart_text += f" ({kinds}; {abandoned} abandoned)"
    messages = (
        f"{totals['messages_relayed']} relayed ({totals['bytes_relayed']} bytes), "
        f"{totals['messages_not_relayed']} not relayed"
    )
    if totals["messages_held"]:
        messages += (
            f", {totals['messages_held']} held by rules "
            f"({totals['messages_held_sent']} sent when released)"
        )
    rows = [
        ["messages", messages],
        ["faults", f"{totals['faults']} injected"],
        [
            "connections",
            f"{totals['connections_opened']} opened, {totals['connections_closed']} closed",
        ],
        ["restarts", restart_text],
    ]
    if runs_and_reloads:
        rows.append(["proxy runs", str(restarts["proxy_runs"])])
        reloads = ", ".join(f"{result} x{n}" for result, n in summary["reloads"].items())
        if reloads:
            rows.append(["reloads", reloads])
    rows += [
        [
            "prompts",
            plural(totals["prompts"], "attempt")
            + (f" ({outcomes})" if outcomes else "")
            + f", {retry_text}",
        ],
        ["findings", findings_phrase(summary)],
    ]
    return rows


def faults_table(summary: dict[str, Any], names: Mapping[str, str]) -> Table:
    """The faults injected, by rule and action."""
    return ["rule", "action", "count", "nodes"], [
        [f["rule"], f["action"], f["count"], _nodes(names, f["nodes"])]
        for f in summary["faults"]["by_rule"]
    ]


def relayed_table(summary: dict[str, Any]) -> Table:
    """The messages relayed, by direction, kind and method."""
    return ["direction", "kind", "method", "count", "bytes", "p50 ms", "max ms"], [
        [
            m["direction"],
            m["kind"],
            m["method"],
            m["count"],
            m["bytes"],
            None if m["duration_ms"] is None else m["duration_ms"]["median"],
            None if m["duration_ms"] is None else m["duration_ms"]["max"],
        ]
        for m in summary["messages"]["relayed"]
    ]


def not_relayed_table(summary: dict[str, Any]) -> Table:
    """The messages not relayed, by disposition."""
    return ["disposition", "direction", "kind", "method or reason", "count"], [
        [m["disposition"], m["direction"], m["kind"], m["method"] or m["reason"], m["count"]]
        for m in summary["messages"]["not_relayed"]
    ]


def held_table(summary: dict[str, Any]) -> Table:
    """The messages rules held (``delay``, spaced ``duplicate`` copies), by rule: how many, how
    many were sent when released, how long they were held."""
    headers = ["direction", "kind", "method", "rules", "held", "sent", "not sent", "p50 ms"]
    return [*headers, "max ms"], [
        [
            m["direction"],
            m["kind"],
            m["method"],
            m["rules"],
            m["count"],
            m["sent"],
            m["not_sent"],
            None if m["delay_ms"] is None else m["delay_ms"]["median"],
            None if m["delay_ms"] is None else m["delay_ms"]["max"],
        ]
        for m in summary["messages"]["held"]
    ]


def connections_table(summary: dict[str, Any]) -> Table:
    """The connections opened and closed, by side and transport."""
    return ["side", "transport", "opened", "closed"], [
        [c["side"], c["transport"], c["opened"], c["closed"]] for c in summary["connections"]
    ]


def prompts_table(summary: dict[str, Any], names: Mapping[str, str]) -> Table:
    """The prompts per session, by outcome."""
    headers = [
        "session",
        "attempts",
        "answered",
        "errors",
        "lost",
        "unanswered",
        "retries",
        "nodes",
        "keys in findings",
    ]
    return headers, [
        [
            s["session"],
            s["attempts"],
            s["answered"],
            s["errors"],
            s["lost"],
            s["unanswered"],
            s["retries"],
            _nodes(names, s["nodes"]),
            ", ".join(s["keys_in_findings"]) or None,
        ]
        for s in summary["prompts"]["sessions"]
    ]


def prompts_note(summary: dict[str, Any]) -> str:
    """The injected copies of prompts and the answers to them swallowed (empty when none)."""
    prompts = summary["prompts"]
    extra = []
    if prompts["copies"]:
        extra.append(plural(prompts["copies"], "injected copy", "injected copies"))
    if prompts["swallowed_answers"]:
        extra.append(f"{plural(prompts['swallowed_answers'], 'answer')} to copies swallowed")
    return ", ".join(extra)


def retries_table(
    summary: dict[str, Any],
    names: Mapping[str, str],
    *,
    id_text: Callable[[Any], str],
    timeline_rows: Mapping[int, int] | None = None,
) -> Table:
    """The retries, each id written by ``id_text``.

    With ``timeline_rows`` (the timeline row of each retry, by its index in the summary's list),
    the table has the columns ``row`` (``#N``) and ``retries id`` (the id of the attempt retried).
    """
    headers = [
        "at",
        "row",
        "session",
        "node",
        "link",
        "id",
        "retries id",
        "after",
        "lost on",
        "delay ms",
        "same size",
        "outcome",
    ]
    rows = []
    for index, r in enumerate(summary["retries"]["list"]):
        number = None if timeline_rows is None else timeline_rows.get(index)
        lost_on = names.get(r["lost_node"], r["lost_node"])
        rows.append(
            [
                _at(r["at_s"]),
                "-" if number is None else f"#{number}",
                r["session"],
                names.get(r["node"], r["node"]),
                r["link"],
                id_text(r["id"]),
                id_text(r["lost_id"]),
                r["after"],
                lost_on + (" (other node)" if r["across_nodes"] else ""),
                r["delay_ms"],
                {True: "yes", False: "no", None: "-"}[r["same_size"]],
                r["outcome"],
            ]
        )
    if timeline_rows is None:
        keep = [i for i, title in enumerate(headers) if title not in ("row", "retries id")]
        return [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]
    return headers, rows


def keys_table(summary: dict[str, Any], names: Mapping[str, str]) -> Table:
    """The idempotency keys worth a look: retried, seen by several nodes, or given several
    messages or prompts (the others are counted by :func:`keys_note`)."""
    return ["at", "session", "key", "attempts", "nodes", "prompts", "messageIds", "verdict"], [
        [
            _at(k["at_s"]),
            k["session"],
            k["key"],
            k["attempts"],
            _nodes(names, k["nodes"]),
            k["prompts"],
            ", ".join(k["message_ids"]) or None,
            k["verdict"],
        ]
        for k in summary["keys"]["list"]
        if _notable(k)
    ]


def _notable(key: dict[str, Any]) -> bool:
    return bool(key["retries"]) or len(key["nodes"]) > 1 or key["verdict"] == "duplicate"


def keys_note(summary: dict[str, Any]) -> str:
    """The keys in all, and how many :func:`keys_table` leaves out (each one attempt, one node)."""
    keys = summary["keys"]
    plain = sum(1 for key in keys["list"] if not _notable(key))
    text = (
        f"{plural(keys['count'], 'key')}: {keys['retried']} retried, "
        f"{keys['across_nodes']} seen by several nodes, "
        f"{plural(keys['duplicates'], 'duplicate')}"
    )
    if plain:
        text += f"; {plain} not listed (one attempt, one node, at most one messageId)"
    return text


def findings_table(
    summary: dict[str, Any], names: Mapping[str, str], *, check_first: bool = False
) -> Table:
    """The findings in time order; ``check_first`` puts the check before the time."""
    rows = []
    for f in summary["findings"]["list"]:
        at, check = _at(f["at_s"]), f["check"] + (" (warning)" if f["warning"] else "")
        first = [check, at] if check_first else [at, check]
        rows.append([*first, f["session"], f["key"], _nodes(names, f["nodes"]), f["detail"]])
    titles = ["check", "at"] if check_first else ["at", "check"]
    return [*titles, "session", "key", "node", "detail"], rows


class _Text:
    """The lines of :func:`render_text`, section by section."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        self.totals: dict[str, Any] = summary["totals"]
        self.names = short_names(f["node"] for f in summary["files"])
        self.out: list[str] = []

    def node(self, node: str) -> str:
        return self.names.get(node, node)

    def section(self, title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.out += ["", title, *_table(header, rows)]

    def head(self) -> None:
        totals, span, files = self.totals, self.summary["span"], self.summary["files"]
        when = ""
        if span["start"] is not None:
            stamp = datetime.fromtimestamp(span["start"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            when = f", {span['seconds']:.3f}s from {stamp} UTC"
        self.out.append(
            f"acp-proxy report: {plural(totals['files'], 'trace file')}, "
            f"{plural(totals['records'], 'record')}{when}"
        )
        if len(files) > 1 or totals["skipped_lines"]:
            self.out += _table(
                ["node", "records", "skipped lines", "runs", "file"],
                [
                    [self.node(f["node"]), f["records"], f["skipped_lines"], f["runs"], f["node"]]
                    for f in files
                ],
            )
        if totals["skipped_lines"]:
            where = [f"{f['node']}:{line}" for f in files for line in f["unreadable_lines"][:3]]
            more = ", ..." if totals["skipped_lines"] > len(where) else ""
            self.out.append(
                f"  skipped {plural(totals['skipped_lines'], 'unreadable line')} "
                f"({', '.join(where)}{more})"
            )
        self.out.extend(f"  note: {note}" for note in self.summary["notes"])
        if totals["ignored_records"]:
            kinds = ", ".join(f"{event} x{n}" for event, n in self.summary["ignored"].items())
            self.out.append(
                f"  ignored {plural(totals['ignored_records'], 'record')} of unknown events "
                f"({kinds})"
            )

    def totals_section(self) -> None:
        rows = totals_rows(self.summary)
        self.out += ["", "Totals", *(f"  {name:<12} {text}" for name, text in rows)]

    def faults(self) -> None:
        self.section("Faults injected", *faults_table(self.summary, self.names))

    def messages(self) -> None:
        self.section("Messages relayed", *relayed_table(self.summary))
        self.section("Messages not relayed", *not_relayed_table(self.summary))
        self.section("Messages held by rules (delay, spaced copies)", *held_table(self.summary))

    def connections(self) -> None:
        self.section("Connections", *connections_table(self.summary))

    def prompts(self) -> None:
        self.section("Prompts (session/prompt requests)", *prompts_table(self.summary, self.names))
        note = prompts_note(self.summary)
        if note:
            self.out.append("  " + note)

    def keys(self) -> None:
        if not self.summary["keys"]["count"]:
            return
        self.out += ["", f"Idempotency keys (over every node): {keys_note(self.summary)}"]
        header, rows = keys_table(self.summary, self.names)
        if rows:
            self.out += _table(header, rows)

    def retries(self) -> None:
        retries = self.summary["retries"]
        if not retries["list"]:
            return
        self.section(
            f"Retries (a prompt resent with its key; unkeyed, the next prompt on a session "
            f"after a loss there): {retries['count']}, median "
            f"{retries['delay_ms']['median']:.1f} ms after the loss",
            *retries_table(self.summary, self.names, id_text=json.dumps),
        )

    def findings(self) -> None:
        self.out += ["", f"Findings: {findings_phrase(self.summary)}"]
        if self.summary["findings"]["list"]:
            self.out += _table(*findings_table(self.summary, self.names))


def render_text(summary: dict[str, Any]) -> str:
    """The summary for people: totals, faults, messages, prompts, keys, retries, findings.

    Nodes are named by the shortest suffix of their path that tells them apart; the file table
    at the top (shown for several files) gives each one's full path.
    """
    text = _Text(summary)
    text.head()
    text.totals_section()
    text.faults()
    text.messages()
    text.connections()
    text.prompts()
    text.keys()
    text.retries()
    text.findings()
    return "\n".join(text.out) + "\n"


def report_main(paths: Sequence[Path], as_json: bool) -> tuple[str, int]:
    """The ``report`` command: the text to print and the exit status.

    Status 0; 1 when a finding other than a warning (``unkeyed_resend``) was recorded; 2 when a
    file is missing, unreadable or not a trace (the text is then an ``error: ...`` line, for
    stderr).
    """
    if not paths:
        return "error: give at least one trace file", 2
    try:
        records = load_traces(paths)
    except TraceReadError as exc:
        return f"error: {exc}", 2
    summary = summarize(records)
    status = 1 if summary["findings"]["failing"] else 0
    if as_json:
        return json.dumps(summary, indent=2) + "\n", status
    return render_text(summary), status
