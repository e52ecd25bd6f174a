"""The report's summary, typed: each shape of what ``report --json`` prints, one ``TypedDict`` each.

:func:`proxy.tools.report.summary.summarize` builds a :class:`Summary` (with
:mod:`~proxy.tools.report.prompts` and :mod:`~proxy.tools.report.keys`), and the tables, the text
and the page read it back with these same types, so that every key they read is checked. They are
plain dicts at run time: ``json.dumps`` prints them as they were built, in the order each dict was
built in (the ``--json`` format: its field names, order and values are documented and do not
change with these types).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from proxy.core.observations import ReloadResult, RestartWhat
from proxy.core.records import JsonValue

__all__ = [
    "AttemptFault",
    "AttemptView",
    "ConnectionRow",
    "FaultRow",
    "FaultsView",
    "FileRow",
    "Finding",
    "FindingBy",
    "FindingsView",
    "HeldRow",
    "KeyFinding",
    "KeyRow",
    "KeyVerdict",
    "KeysView",
    "MessagesView",
    "NotRelayedRow",
    "Outcome",
    "PromptsView",
    "RelayedRow",
    "RestartsView",
    "RetriesView",
    "RetryView",
    "SessionRow",
    "Span",
    "Spread",
    "Summary",
    "Totals",
    "Verdict",
]

Verdict = Literal["clean", "warnings", "failing"]
"""The run in a word: no finding, warnings only, or a finding that makes ``report`` exit 1."""
Outcome = Literal["answered", "error", "injected_error", "lost", "unanswered"]
"""What became of a prompt attempt (:meth:`proxy.tools.report.prompts.Attempt.outcome`)."""
KeyVerdict = Literal["no messageId seen", "one message", "duplicate"]
"""What the ``messageId`` named for an idempotency key say, over every node."""
FindingBy = Literal["proxy", "report"]
"""Who found it: a proxy's ledger (its ``finding`` record) or the report, over merged traces."""


class Spread(TypedDict):
    """Some durations (milliseconds), rounded to the microsecond."""

    min: float
    median: float
    max: float


class FileRow(TypedDict):
    """One trace file (a node) and what was learnt reading it."""

    node: str
    records: int
    skipped_lines: int
    unreadable_lines: list[int]
    partial_last_line: bool
    runs: int
    trace_versions: list[int]
    first: float | None
    last: float | None


class Span(TypedDict):
    """The time the records span (``None``: no record)."""

    start: float | None
    end: float | None
    seconds: float


class Totals(TypedDict):
    """The counts of the whole run, one number each."""

    files: int
    records: int
    skipped_lines: int
    ignored_records: int
    messages_relayed: int
    bytes_relayed: int
    messages_not_relayed: int
    messages_held: int
    messages_held_sent: int
    faults: int
    connections_opened: int
    connections_closed: int
    restarts: int
    prompts: int
    prompts_lost: int
    retries: int
    keys: int
    findings: int
    failing_findings: int


class FaultRow(TypedDict):
    """The faults one rule injected with one action, and the nodes where."""

    rule: str
    action: str
    count: int
    nodes: list[str]


class FaultsView(TypedDict):
    """The faults injected, by rule and by action."""

    by_rule: list[FaultRow]
    by_action: dict[str, int]


class RelayedRow(TypedDict):
    """The messages relayed with one direction, kind and method (``-`` for no kind or method)."""

    direction: str
    kind: str
    method: str
    count: int
    bytes: int
    duration_ms: Spread | None


class NotRelayedRow(TypedDict):
    """The messages of one disposition other than ``relayed`` (``never_sent``: held, then
    discarded), direction, kind, method and reason."""

    disposition: str
    direction: str
    kind: str
    method: str | None
    reason: str | None
    count: int


class HeldRow(TypedDict):
    """The messages rules held, by direction, kind, method and rules: sent or not, and how long."""

    direction: str
    kind: str
    method: str | None
    rules: str
    count: int
    sent: int
    not_sent: int
    delay_ms: Spread | None


class MessagesView(TypedDict):
    """The messages: relayed, by disposition, not relayed, held by rules."""

    relayed: list[RelayedRow]
    by_disposition: dict[str, int]
    not_relayed: list[NotRelayedRow]
    held: list[HeldRow]


class ConnectionRow(TypedDict):
    """The connections of one side and transport."""

    side: str
    transport: str
    opened: int
    closed: int


class RestartsView(TypedDict):
    """The restarts, by what restarted, and the proxy runs of every file."""

    by_what: dict[RestartWhat, int]
    abandoned_requests: int
    proxy_runs: int


class AttemptFault(TypedDict):
    """A fault on a prompt attempt's request or on its answer."""

    rule: str
    action: str
    node: str
    on: Literal["request", "answer"]


class AttemptView(TypedDict):
    """One ``session/prompt`` the Client sent, as the trace shows it."""

    node: str
    link: int | None
    session: str | None
    id: JsonValue
    forwarded_id: JsonValue
    time: float
    at_s: float | None
    size: int | None
    relayed: bool
    copies: int
    swallowed_answers: int
    faults: list[AttemptFault]
    outcome: Outcome
    duration_ms: float | None
    lost_by: str | None
    key: str | None
    retry: bool


class SessionRow(TypedDict):
    """The prompt attempts of one session, by outcome, and the keys its findings name."""

    session: str | None
    attempts: int
    answered: int
    errors: int
    lost: int
    unanswered: int
    retries: int
    nodes: list[str]
    keys_in_findings: list[str]


class PromptsView(TypedDict):
    """The prompts rebuilt from the trace: counts, per session, and each attempt."""

    attempts: int
    copies: int
    swallowed_answers: int
    by_outcome: dict[Outcome, int]
    sessions: list[SessionRow]
    list: list[AttemptView]


class RetryView(TypedDict):
    """One retry: the attempt, and the attempt it retries (``lost_*``)."""

    session: str
    key: str | None
    node: str
    link: int | None
    id: JsonValue
    time: float
    at_s: float | None
    outcome: Outcome
    after: str
    lost_node: str
    lost_link: int | None
    lost_id: JsonValue
    lost_time: float
    delay_ms: float
    across_nodes: bool
    same_size: bool | None


class RetriesView(TypedDict):
    """The retries: how many, how long after the loss, and each one."""

    count: int
    across_nodes: int
    delay_ms: Spread | None
    list: list[RetryView]


class KeyRow(TypedDict):
    """One (session, idempotency key) over every node and run (``time``: its first record)."""

    session: str
    key: str
    time: float
    attempts: int
    retries: int
    nodes: list[str]
    proxy_runs: int
    prompts: int
    message_ids: list[str]
    message_nodes: dict[str, list[str]]
    verdict: KeyVerdict
    at_s: float | None


class KeysView(TypedDict):
    """The idempotency keys: counts, and each one."""

    count: int
    retried: int
    across_nodes: int
    duplicates: int
    list: list[KeyRow]


class KeyFinding(TypedDict):
    """A finding only the merged traces show (:meth:`proxy.tools.report.keys.Keys.findings`):
    a trace's ``finding``, with every node whose records name the key."""

    check: str
    session: str
    key: str
    detail: str
    time: float
    nodes: list[str]


class Finding(TypedDict):
    """One finding: a ledger's (``by: proxy``, its ``node`` and ``link``) or the report's
    (``by: report``, neither), in the list of every finding."""

    check: str
    warning: bool
    session: str | None
    key: str | None
    detail: str
    by: FindingBy
    node: str | None
    nodes: list[str]
    link: int | None
    time: float
    at_s: float | None


class FindingsView(TypedDict):
    """The findings: how many, how many failing, by check, and each one in time order."""

    count: int
    failing: int
    by_check: dict[str, int]
    list: list[Finding]


class Summary(TypedDict):
    """The summary of merged traces: what ``report --json`` prints, and the text and page render."""

    report_version: int
    files: list[FileRow]
    notes: list[str]
    span: Span
    verdict: Verdict
    totals: Totals
    faults: FaultsView
    messages: MessagesView
    connections: list[ConnectionRow]
    restarts: RestartsView
    reloads: dict[ReloadResult, int]
    prompts: PromptsView
    retries: RetriesView
    keys: KeysView
    findings: FindingsView
    ignored: dict[str, int]
