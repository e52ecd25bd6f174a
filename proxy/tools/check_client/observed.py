"""What the proxy saw of one run of the Client, read back from its trace.

The prompts are rebuilt by the report's :class:`~proxy.tools.report.prompts.Prompts` (each
``session/prompt`` attempt, its key, its faults, its outcome, the attempt it retries); beside
them the ledger's ``keyed`` records (a key with the digest of its prompt), the ``messageId`` s
named for each key, the ledger's findings, and the Client's other messages to the Agent
(``session/resume``, ``session/cancel``, ``$/cancel_request``) with the connection they came on.
A Client connection is named by the proxy run in the file (a Client over stdio starts a new
proxy for each connection), the link, and how many Client connections the link had opened by
then (a listening proxy in conductor mode keeps the link when the Client connects again).

Keys are shown by digest (:func:`key_text`), as the trace shows prompts: a verdict never prints
a key.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from proxy.core.events import Direction, Side
from proxy.core.records import (
    ConnectionRecord,
    FindingRecord,
    KeyedMessageRecord,
    KeyedRecord,
    MessageRecord,
    Record,
    TraceHeader,
)
from proxy.tools.report.load import Entry, TraceReadError, read_trace
from proxy.tools.report.prompts import Attempt, Prompts, wire_text

__all__ = ["MAX_TRACE_BYTES", "ClientLinks", "Keyed", "Observed", "Sent", "key_text", "observe"]

MAX_TRACE_BYTES = 64 << 20
"""The largest trace a run's judgement reads (a Client flooding its Agent makes a larger one:
that run is not judged, and the verdict says why)."""

Connection = tuple[int, int | None, int]
"""A connection of the Client: the proxy run in the trace file, the link, and how many Client
connections that link had opened by then (in conductor mode, ``--keep-upstream``, the link
stays when the Client connects again)."""


def key_text(key: str) -> str:
    """A key as a verdict shows it: ``key#`` and the first 8 hex digits of its SHA-256."""
    return f"key#{hashlib.sha256(key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class Keyed:
    """A keyed ``session/prompt`` the ledger recorded: its key and its prompt's digest."""

    time: float
    session: str
    key: str
    prompt: str
    connection: Connection


@dataclass(frozen=True, slots=True)
class Sent:
    """A request or notification of the Client other than a prompt, as the proxy handled it."""

    time: float
    method: str
    session: str | None
    id: object
    disposition: str
    connection: Connection


@dataclass
class Observed:
    """What one run's trace shows (empty when the Client never started the Agent)."""

    attempts: list[Attempt] = field(default_factory=list)
    keyed: list[Keyed] = field(default_factory=list)
    messages: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """The ``messageId`` s named for each (session, key), in order."""
    findings: list[FindingRecord] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    start: float | None = None
    settled: bool = False
    """Every Client connection the trace opened was closed (:class:`ClientLinks`)."""
    unreadable: str | None = None
    opened: dict[tuple[int, int | None], list[float]] = field(default_factory=dict)
    """When each (proxy run, link) saw a Client connection open."""
    prompts: dict[int, str] = field(default_factory=dict)
    """The digest of each keyed attempt's prompt, by the attempt's ``id()`` (:meth:`prompt_of`)."""

    def prompt_of(self, attempt: Attempt) -> str | None:
        """The digest of a keyed attempt's prompt (from the ledger's ``keyed`` record)."""
        return self.prompts.get(id(attempt))

    def at(self, time: float) -> str:
        """``t+1.234s``: a time from the run's first record."""
        return f"t+{time - (self.start or time):.3f}s"

    def attempt_text(self, attempt: Attempt) -> str:
        """``id 3 (key#1a2b3c4d) at t+0.5s``: an attempt as a verdict names it."""
        key = "no key" if attempt.key is None else key_text(attempt.key)
        return f"id {wire_text(attempt.id)} ({key}) at {self.at(attempt.time)}"

    def connection_of(self, attempt: Attempt) -> Connection:
        """The Client connection ``attempt`` came on."""
        return self.connection_at(attempt.run, attempt.link, attempt.time)

    def connection_at(self, run: int, link: int | None, time: float) -> Connection:
        """The Client connection of ``link`` in proxy ``run`` at ``time``."""
        return (run, link, bisect.bisect_right(self.opened.get((run, link), []), time))


class ClientLinks:
    """The Client connections open in a trace, fed record by record in file order."""

    def __init__(self) -> None:
        self.runs = 0
        self.open: set[tuple[int, int | None]] = set()

    def feed(self, record: Record) -> None:
        if isinstance(record, TraceHeader):  # a new proxy process: the links before it are gone
            self.runs += 1
            self.open.clear()
        elif isinstance(record, ConnectionRecord) and record.side is Side.CLIENT:
            link = (self.runs, record.link)
            if record.state == "open":
                self.open.add(link)
            else:
                self.open.discard(link)

    @property
    def settled(self) -> bool:
        """A proxy wrote the trace, and every Client connection it opened was closed."""
        return self.runs > 0 and not self.open


def observe(trace: Path) -> Observed:
    """What ``trace`` shows so far (a missing file: nothing; one over :data:`MAX_TRACE_BYTES`:
    nothing but why)."""
    observed = Observed()
    try:
        with trace.open("rb") as file:
            data = file.read(MAX_TRACE_BYTES + 1)
    except FileNotFoundError:
        return observed
    if len(data) > MAX_TRACE_BYTES:
        observed.unreadable = f"the run's trace is over {MAX_TRACE_BYTES >> 20} MiB: not judged"
        return observed
    try:
        entries, _ = read_trace(str(trace), data)
    except TraceReadError as exc:
        observed.unreadable = str(exc)
        return observed
    prompts = Prompts()
    links = ClientLinks()
    for entry in entries:
        prompts.step(entry)
        links.feed(entry.record)
        _take(observed, entry)
        if isinstance(entry.record, MessageRecord) and observed.keyed:
            for attempt in prompts.attempts:  # the attempt this record gave its key, if any
                if attempt.key is not None and id(attempt) not in observed.prompts:
                    observed.prompts[id(attempt)] = observed.keyed[-1].prompt
    with contextlib.suppress(ValueError):
        observed.start = min(entry.time for entry in entries)
    prompts.retries(observed.start)  # marks each attempt's retry_of
    observed.attempts = sorted(prompts.attempts, key=lambda attempt: attempt.time)
    observed.settled = links.settled
    return observed


def _take(observed: Observed, entry: Entry) -> None:
    record = entry.record
    link = (entry.run, getattr(record, "link", None))
    connection = observed.connection_at(*link, record.time)
    match record:
        case KeyedRecord():
            observed.keyed.append(
                Keyed(record.time, record.session, record.key, record.prompt, connection)
            )
        case KeyedMessageRecord():
            named = observed.messages.setdefault((record.session, record.key), [])
            if record.message_id not in named:
                named.append(record.message_id)
        case FindingRecord():
            observed.findings.append(record)
        case ConnectionRecord(side=Side.CLIENT, state="open"):
            observed.opened.setdefault(link, []).append(record.time)
        case MessageRecord(direction=Direction.TO_AGENT, method=str(method)) if (
            method != "session/prompt"
        ):
            observed.sent.append(
                Sent(record.time, method, record.session, record.id, record.disposition, connection)
            )
