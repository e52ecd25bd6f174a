"""The summary of merged traces: counts, held messages, prompts, keys and findings, JSON-ready.

:func:`summarize` reads the merged records once, in time order, into each view: the counts of
every record (messages by direction, kind and method; every disposition other than ``relayed``
apart; faults by rule and action; connections, restarts, reloads), the messages rules held
(:class:`_Holds`), the prompts and their retries (:mod:`proxy.tools.report.prompts`), the keys
over every node (:mod:`proxy.tools.report.keys`) and the findings: the ledgers' own, and those
only the merged traces show. The summary (a :class:`~proxy.tools.report.model.Summary`) is what
``report --json`` prints, and what the text and the page render.

A message counts once, when it left the proxy (its ``message`` record). A held message (a
``held`` record) is joined to the record of its delivery by its hold (a ``hold`` rule's also to its
``held_ended`` record): one never sent (discarded by a restart or, for a ``hold`` rule's, by the end
of its link, or still held when its run or the trace ended) is counted as not relayed, with the
disposition ``never_sent``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Literal

from proxy.core.observations import Check, ReloadResult, RestartWhat
from proxy.core.records import (
    TRACE_VERSION,
    ConnectionRecord,
    Disposition,
    FaultRecord,
    FindingRecord,
    HeldEndedRecord,
    HeldRecord,
    MessageRecord,
    ReloadRecord,
    RestartRecord,
    TraceHeader,
    UnknownRecord,
)
from proxy.tools.report.keys import Keys
from proxy.tools.report.load import Entry, FileInfo, TraceRecords
from proxy.tools.report.model import (
    ConnectionRow,
    FaultsView,
    FileRow,
    Finding,
    FindingsView,
    HeldRow,
    KeysView,
    MessagesView,
    Outcome,
    SessionRow,
    Spread,
    Summary,
    Verdict,
)
from proxy.tools.report.prompts import (
    Attempt,
    HoldKey,
    Prompts,
    hold_key,
    rules_text,
    since,
    wire_text,
)

__all__ = ["REPORT_VERSION", "WARNING_CHECKS", "summarize"]

REPORT_VERSION = 1
WARNING_CHECKS = frozenset({Check.UNKEYED_RESEND})
"""Findings that are warnings: they do not make ``report`` exit 1."""
_NEVER_SENT = "never_sent"
"""The disposition of a held message that has no delivery record (``reason`` says why)."""

_Row = tuple[str, str, str, str]
"""direction, kind, method (``-`` for none), rules."""


def _spread(values: list[float]) -> Spread | None:
    if not values:
        return None
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _file_view(info: FileInfo) -> FileRow:
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


def _files_of(entries: Sequence[Entry]) -> list[FileInfo]:
    """What can be said of each node from the records alone (no :class:`TraceRecords`)."""
    infos: dict[str, FileInfo] = {}
    for entry in entries:
        info = infos.setdefault(entry.node, FileInfo(entry.node))
        info.records += 1
        at = entry.time
        info.first = at if info.first is None else min(info.first, at)
        info.last = at if info.last is None else max(info.last, at)
        if isinstance(entry.record, TraceHeader):
            info.runs += 1
            info.versions.append(entry.record.version)
    return list(infos.values())


class _Holds:
    """Held messages: each ``held`` record joined to the record of its delivery (same
    :func:`~proxy.tools.report.prompts.hold_key`), counted by direction, kind, method and rules,
    sent or not."""

    def __init__(self) -> None:
        self.count: Counter[_Row] = Counter()
        self.sent: Counter[_Row] = Counter()
        self.delays: defaultdict[_Row, list[float]] = defaultdict(list)
        self.never_sent: Counter[tuple[str, str, str, str, str]] = Counter()
        """Held messages without a delivery, as rows of the messages not relayed."""
        self._open: dict[HoldKey, tuple[_Row, float, float]] = {}
        """Holds awaiting their delivery: the row each is counted in, when it began, and its
        planned length (ms)."""

    def step(self, entry: Entry) -> None:
        node, record = entry.node, entry.record
        match record:
            case TraceHeader():
                self._close(lambda key: key[0] == node, "the proxy run ended while it was held")
            case RestartRecord():
                scope = (node, entry.run, record.link)
                self._close(lambda key: key[:3] == scope, "a restart discarded it", entry.time)
            case HeldRecord():
                row = (
                    record.direction.value,
                    record.kind.value,
                    record.method or "-",
                    rules_text(record.rules),
                )
                self.count[row] += 1
                self._open[hold_key(entry, record)] = (row, entry.time, record.delay_ms)
            case MessageRecord(hold=int()):
                self._ended(entry, record, sent=record.disposition is Disposition.RELAYED)
            case HeldEndedRecord(outcome="drop" | "timeout_drop"):
                self._ended(entry, record, sent=False)  # its ``dropped`` message counts it
            case HeldEndedRecord(outcome="link_end"):
                key = hold_key(entry, record)
                self._close(
                    lambda held: held == key, "its link ended while it was held", entry.time
                )

    def _ended(self, entry: Entry, record: MessageRecord | HeldEndedRecord, *, sent: bool) -> None:
        """A hold ended (``sent``: its message left): how long it lasted."""
        held = self._open.pop(hold_key(entry, record), None)
        if held is None:
            return
        row, began, planned = held
        # A reorder's delay_ms is its cap: overtaken, it left sooner, and that counts.
        self.delays[row].append(min(planned, (entry.time - began) * 1000))
        if sent:
            self.sent[row] += 1

    def _close(self, match: Callable[[HoldKey], bool], why: str, at: float | None = None) -> None:
        """The holds ``match`` picks ended without their message being sent (never sent, for
        ``why``): at ``at``, the time of the record that ended them, which their length counts
        to (a hold rule's message lost at its link's end waited that long, not its timeout);
        ``None`` when the trace does not show when (its run or the trace ended with them held):
        their planned length counts."""
        for key in [key for key in self._open if match(key)]:
            row, began, planned = self._open.pop(key)
            lasted = planned if at is None else min(planned, (at - began) * 1000)
            self.delays[row].append(lasted)
            direction, kind, method, _ = row
            self.never_sent[_NEVER_SENT, direction, kind, method, why] += 1

    def finish(self) -> None:
        """The trace ended: what is still held was never sent."""
        self._close(lambda key: True, "still held when the trace ended")

    def view(self) -> list[HeldRow]:
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
        self.restarts: Counter[RestartWhat] = Counter()
        self.abandoned = 0
        self.reloads: Counter[ReloadResult] = Counter()
        self.ignored: Counter[str] = Counter()
        self.findings: list[Finding] = []
        self.holds = _Holds()

    def step(self, entry: Entry) -> None:
        self.holds.step(entry)
        match entry.record:
            case MessageRecord() as message:
                self._message(message)
            case FaultRecord(rule=rule, action=action):
                self.faults[rule, action] += 1
                self.fault_nodes[rule, action].add(entry.node)
                self.actions[action] += 1
            case ConnectionRecord(state=state, side=side, transport=transport):
                (self.opened if state == "open" else self.closed)[side.value, transport] += 1
            case RestartRecord(what=what, abandoned=abandoned):
                self.restarts[what] += 1
                self.abandoned += abandoned
            case ReloadRecord(result=result):
                self.reloads[result] += 1
            case FindingRecord() as finding:
                self._finding(entry, finding)
            case UnknownRecord(event=event):
                self.ignored[event] += 1

    def _message(self, record: MessageRecord) -> None:
        disposition = str(record.disposition)
        self.dispositions[disposition] += 1
        direction = record.direction.value
        kind = "-" if record.kind is None else record.kind.value
        method = record.method or "-"
        if record.disposition is not Disposition.RELAYED:
            reason = "" if record.reason is None else str(record.reason)
            self.not_relayed[disposition, direction, kind, method, reason] += 1
            return
        row = (direction, kind, method)
        self.relayed[row] += 1
        self.bytes[row] += record.size or 0
        if record.duration_ms is not None:
            self.durations[row].append(record.duration_ms)

    def _finding(self, entry: Entry, record: FindingRecord) -> None:
        self.findings.append(
            {
                "check": str(record.check),
                "warning": record.check in WARNING_CHECKS,
                "session": record.session,
                "key": record.key,
                "detail": record.detail,
                "by": "proxy",
                "node": entry.node,
                "nodes": [entry.node],
                "link": record.link,
                "time": record.time,
                "at_s": since(record.time, self.start),
            }
        )

    def finish(self) -> None:
        """The trace ended: held messages never sent are counted as not relayed."""
        self.holds.finish()
        self.not_relayed.update(self.holds.never_sent)

    def messages(self) -> MessagesView:
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

    def faults_view(self) -> FaultsView:
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

    def connections(self) -> list[ConnectionRow]:
        return [
            {
                "side": side,
                "transport": transport,
                "opened": self.opened[side, transport],
                "closed": self.closed[side, transport],
            }
            for side, transport in sorted(set(self.opened) | set(self.closed))
        ]


def _findings_view(findings: list[Finding]) -> FindingsView:
    return {
        "count": len(findings),
        "failing": sum(1 for finding in findings if not finding["warning"]),
        "by_check": dict(sorted(Counter(f["check"] for f in findings).items())),
        "list": findings,
    }


def _merged_findings(
    written: list[Finding], keys: Keys, prompts: list[Finding], start: float | None
) -> list[Finding]:
    """The ledgers' findings, those only the merged traces show (:mod:`proxy.tools.report.keys`)
    and the prompts' (:func:`_not_resent`), in time order.

    A finding of the report has the fields of :meth:`~proxy.tools.report.keys.Keys.findings` in
    their order there, then ``warning``, ``by``, ``node``, ``link``, ``at_s`` (as ``--json`` prints
    it)."""
    found: list[Finding] = [
        {
            "check": finding["check"],
            "session": finding["session"],
            "key": finding["key"],
            "detail": finding["detail"],
            "time": finding["time"],
            "nodes": finding["nodes"],
            "warning": finding["check"] in WARNING_CHECKS,
            "by": "report",
            "node": None,
            "link": None,
            "at_s": since(finding["time"], start),
        }
        for finding in keys.findings(written)
    ]
    return sorted(written + found + prompts, key=lambda finding: finding["time"])


def _keys_view(keys: Keys, start: float | None) -> KeysView:
    listed = keys.view(start)
    return {
        "count": len(listed),
        "retried": sum(1 for key in listed if key["retries"]),
        "across_nodes": sum(1 for key in listed if len(key["nodes"]) > 1),
        "duplicates": sum(1 for key in listed if key["verdict"] == "duplicate"),
        "list": listed,
    }


_COLUMNS: dict[Outcome, Literal["answered", "errors", "lost", "unanswered"]] = {
    "answered": "answered",
    "error": "errors",
    "injected_error": "errors",
    "lost": "lost",
    "unanswered": "unanswered",
}
"""The column of a session's row that counts each outcome."""


def _sessions(attempts: list[Attempt], findings: list[Finding]) -> list[SessionRow]:
    """Per session: attempts by outcome, retries, nodes, and the keys its findings name."""
    rows: dict[str | None, SessionRow] = {}
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
        row[_COLUMNS[attempt.outcome()]] += 1
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


def _notes(files: list[FileInfo]) -> list[str]:
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
        if not info.records and not info.skipped:  # beside others: all empty is an error
            notes.append(
                f"{info.node}: the file is empty (no proxy wrote to it: was --trace given this "
                "path, and did the proxy start?)"
            )
        if info.runs > 1:
            notes.append(
                f"{info.node}: {info.runs} proxy runs appended to one file; each run's links "
                "and ids start afresh"
            )
    return notes


def _prompt_notes(attempts: list[Attempt]) -> list[str]:
    """A lossy trace whose Client sent no keys: its retries are only guessed."""
    lost = any(attempt.outcome() == "lost" for attempt in attempts)
    if lost and all(attempt.key is None for attempt in attempts):
        return [
            "no prompt carried an idempotencyKey: a resend cannot be told from a new prompt, "
            "so retries are judged by session and time only"
        ]
    return []


def _not_resent(attempts: list[Attempt], start: float | None) -> list[Finding]:
    """A finding for each lost attempt no later attempt retried (after
    :meth:`~proxy.tools.report.prompts.Prompts.retries` marked the retries)."""
    retried = {id(attempt.retry_of) for attempt in attempts if attempt.retry_of is not None}
    found: list[Finding] = []
    for attempt in attempts:
        loss = attempt.loss()
        if loss is None or id(attempt) in retried:
            continue
        at, how = loss
        found.append(
            {
                "check": str(Check.PROMPT_NOT_RESENT),
                "session": attempt.session,
                "key": attempt.key,
                "detail": (
                    f"the answer to the prompt of id {wire_text(attempt.id)} was lost, by "
                    f"{how}; the Client never sent it again: the user's input was dropped, "
                    "unless the Client told the user"
                ),
                "time": at,
                "nodes": [attempt.node],
                "warning": Check.PROMPT_NOT_RESENT in WARNING_CHECKS,
                "by": "report",
                "node": None,
                "link": None,
                "at_s": since(at, start),
            }
        )
    return found


def summarize(entries: Sequence[Entry]) -> Summary:
    """The summary of merged trace records (from :func:`~proxy.tools.report.load.load_traces`),
    JSON-ready."""
    files = entries.files if isinstance(entries, TraceRecords) else _files_of(entries)
    notes = list(entries.notes) if isinstance(entries, TraceRecords) else []
    notes += _notes(files)
    times = [entry.time for entry in entries]
    start, end = (min(times), max(times)) if times else (None, None)
    counts = _Counts(start)
    prompts = Prompts()
    keys = Keys()
    for entry in entries:
        prompts.step(entry)
        counts.step(entry)
        keys.step(entry)
    counts.finish()
    retries = prompts.retries(start)
    attempts = prompts.attempts
    notes += _prompt_notes(attempts)
    outcomes = Counter(attempt.outcome() for attempt in attempts)
    all_findings = _merged_findings(counts.findings, keys, _not_resent(attempts, start), start)
    findings = _findings_view(all_findings)
    keyed = _keys_view(keys, start)
    verdict: Verdict = (
        "failing" if findings["failing"] else "warnings" if findings["count"] else "clean"
    )
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
            "records": len(entries),
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
