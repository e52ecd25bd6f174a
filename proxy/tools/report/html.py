"""``acp-proxy report --html FILE``: the report as one self-contained HTML page.

:func:`render_html` turns the merged records of :func:`proxy.tools.report.load.load_traces` and
their summary (:func:`proxy.tools.report.summary.summarize`) into one HTML document: a header (the
files, the time span, the verdict), the summary tables (totals, faults by rule, messages,
connections, prompts, keys, retries, findings; their columns and rows are
:mod:`proxy.tools.report.tables`') and a sequence timeline of the trace, drawn as inline SVG with
three lanes (Client, proxy, Agent):

* every ``message`` record is an arrow in time order (``to_agent``: Client -> proxy -> Agent;
  ``to_client``: Agent -> proxy -> Client); one that was not relayed (any other disposition:
  dropped, answered by the proxy, severed, undeliverable...) stops at the proxy lane;
* every ``fault`` record is an arrow from the sender that ends at the proxy lane with a cross,
  labelled with its rule and action;
* a message a rule held (a ``held`` record: ``delay``, ``reorder``, ``bandwidth``, ``stall``, a
  ``duplicate`` copy spaced by ``gap_ms``)
  is drawn twice: when it arrived, an arrow from the sender that ends at the proxy lane with a
  pause mark, labelled with the rules and the delay; when it really left (its ``message`` record,
  same ``hold``), an arrow from the proxy lane to the receiver. Between the two, a dashed bar on
  the proxy lane (``hold-bar``) shows the hold;
* connections (on the Client or Agent lane), restarts, proxy runs, reloads and findings are
  markers on the lanes;
* a relayed prompt is labelled with its idempotency key (from the ledger's ``keyed`` record);
* each retry of the summary (a prompt resent with its key, on any node; unkeyed, the next
  ``session/prompt`` of a session after one was lost there) is linked to the attempt it retries
  by a curve in the left margin and a "retry of #N" note;
* the findings only the merged traces show (``by: report``, :mod:`proxy.tools.report.keys`) are rows
  at their time, named by the nodes involved.

Each timeline row is an SVG group with the classes ``ev`` and its kind (``msg``, ``held``,
``fault``, ``conn``, ``restart``, ``run``, ``reload``, ``finding``) and the id ``row-N``; a message
sent from a hold has the class ``released`` too; retry links have the class ``retry-link``, hold
bars ``hold-bar`` (``data-from`` and ``data-to``: the rows they join). The page has inline CSS
only: no script, no URL to fetch, no font or image. Every string from the trace is escaped.
The timeline is bounded: past ``limit`` message records it stops, and says so.

:func:`write_html` is the command: load, summarise, write the page, and return the exit status of
:func:`proxy.tools.report.report_main` (0; 1 for a finding other than ``unkeyed_resend``; 2 when a
trace cannot be read, or the page cannot be written).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from proxy.core import acp
from proxy.core.actions import ActionName
from proxy.core.events import Direction
from proxy.core.observations import Check
from proxy.core.records import (
    ConnectionRecord,
    Disposition,
    FaultRecord,
    FindingRecord,
    HeldRecord,
    KeyedRecord,
    MessageRecord,
    ReloadRecord,
    RestartRecord,
    TraceHeader,
    TraceRecord,
    as_json,
)
from proxy.tools.report.load import Entry, TraceReadError, load_traces
from proxy.tools.report.model import Finding, RetryView, Summary
from proxy.tools.report.prompts import LEDGER_RECORDS, HoldKey, hold_key, rules_text, wire_text
from proxy.tools.report.summary import WARNING_CHECKS, summarize
from proxy.tools.report.tables import (
    Cell,
    connections_table,
    faults_table,
    findings_phrase,
    findings_table,
    held_table,
    keys_note,
    keys_table,
    not_relayed_table,
    plural,
    prompts_note,
    prompts_table,
    relayed_table,
    retries_table,
    short_names,
    totals_rows,
)

__all__ = ["MAX_MESSAGES", "render_html", "write_html"]

MAX_MESSAGES = 2000
"""How many message records the timeline shows at most (the tables always count them all)."""

# Timeline geometry (SVG user units).
_ROW = 22
_TOP = 44
_X_CLIENT, _X_PROXY, _X_AGENT = 190, 400, 610
_X_LABEL = 640
_WIDTH = 1700
_LABEL_CHARS = 150
_NOTE_CHARS = 28
"""How much of a hold's note fits between the proxy lane and the next."""

_LANES = {"client": _X_CLIENT, "proxy": _X_PROXY, "agent": _X_AGENT}

_CSS = """
:root { --fg: #1d232b; --muted: #5d6875; --line: #d5dbe2; --bg: #ffffff; --alt: #f5f7fa;
  --client: #2f6fb3; --agent: #2e8b57; --proxy: #6b4fa3; --fault: #c62828; --warn: #b26a00; }
* { box-sizing: border-box; }
body { margin: 0; padding: 1.5rem 2rem 3rem; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 1.5rem; margin: 0 0 .3rem; }
h2 { font-size: 1.15rem; margin: 2rem 0 .5rem; border-bottom: 1px solid var(--line);
  padding-bottom: .2rem; }
p.meta, p.note { color: var(--muted); margin: .2rem 0; }
nav a { margin-right: 1rem; color: var(--client); }
table { border-collapse: collapse; margin: .4rem 0 1rem; }
th, td { border: 1px solid var(--line); padding: .2rem .55rem; text-align: left;
  vertical-align: top; }
th { background: var(--alt); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.none { color: var(--muted); font-style: italic; }
.verdict { display: inline-block; padding: .1rem .6rem; border-radius: .8rem; color: #fff;
  font-weight: 600; font-size: .9rem; vertical-align: middle; }
.verdict.clean { background: var(--agent); }
.verdict.warnings { background: var(--warn); }
.verdict.failing { background: var(--fault); }
tr.failing td:first-child { color: var(--fault); font-weight: 600; }
tr.warning td:first-child { color: var(--warn); font-weight: 600; }
.timeline { overflow-x: auto; border: 1px solid var(--line); background: var(--bg); }
svg { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
svg .lane { stroke: var(--line); stroke-width: 2; }
svg .lane-label { font: 600 14px system-ui, sans-serif; text-anchor: middle; }
svg .lane-label.client { fill: var(--client); }
svg .lane-label.proxy { fill: var(--proxy); }
svg .lane-label.agent { fill: var(--agent); }
svg .gutter { fill: var(--muted); }
svg .ev:hover .bg { fill: var(--alt); }
svg .bg { fill: transparent; }
svg .arrow { stroke-width: 1.6; fill: none; }
svg .to_agent .arrow { stroke: var(--client); }
svg .to_client .arrow { stroke: var(--agent); }
svg .msg.stopped .arrow { stroke-dasharray: 5 3; }
svg .to_agent .head { fill: var(--client); }
svg .to_client .head { fill: var(--agent); }
svg .fault .arrow { stroke: var(--fault); stroke-dasharray: 5 3; }
svg .cross { stroke: var(--fault); stroke-width: 2.4; }
svg .stop { stroke: var(--muted); stroke-width: 2.4; }
svg .fault text.label { fill: var(--fault); font-weight: 600; }
svg .finding text.label { fill: var(--fault); }
svg .finding.warning text.label { fill: var(--warn); }
svg .dot { stroke-width: 1.6; }
svg .conn .dot { fill: var(--agent); stroke: var(--agent); }
svg .conn.closed .dot { fill: var(--bg); stroke: var(--muted); }
svg .restart .dot, svg .run .dot, svg .reload .dot { fill: var(--proxy); stroke: var(--proxy); }
svg .finding .dot { fill: var(--fault); stroke: var(--fault); }
svg .finding.warning .dot { fill: var(--warn); stroke: var(--warn); }
svg .restart text.label, svg .run text.label { fill: var(--proxy); font-weight: 600; }
svg .conn text.label, svg .reload text.label { fill: var(--muted); }
svg .retry-link { stroke: var(--warn); stroke-width: 1.6; fill: none; stroke-dasharray: 2 3; }
svg .hold-bar { stroke: var(--warn); stroke-width: 4; stroke-dasharray: 5 3; }
svg .pause { fill: var(--warn); }
svg .hold-note { fill: var(--warn); font-size: 11px; }
svg .held .arrow { stroke-dasharray: 5 3; }
svg .retry-note { fill: var(--warn); font-weight: 600; }
.legend span { margin-right: 1.2rem; }
.legend .k-client { color: var(--client); } .legend .k-agent { color: var(--agent); }
.legend .k-fault { color: var(--fault); } .legend .k-retry { color: var(--warn); }
.legend .k-proxy { color: var(--proxy); } .legend .k-hold { color: var(--warn); }
"""


def _e(value: object) -> str:
    """Any value as escaped text (``-`` for ``None``)."""
    if value is None:
        return "-"
    return escape(str(value), quote=True)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: Cell) -> str:
    if value is None:
        return '<td class="none">-</td>'
    if isinstance(value, float):
        return f'<td class="num">{value:.1f}</td>'
    if _number(value):
        return f'<td class="num">{value}</td>'
    return f"<td>{_e(value)}</td>"


def _table(
    header: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    classes: Sequence[str] | None = None,
    table_class: str = "",
    empty: str = "none",
) -> str:
    rows = list(rows)
    head = "".join(f"<th>{_e(title)}</th>" for title in header)
    if not rows:
        body = f'<tr><td class="none" colspan="{len(header)}">{_e(empty)}</td></tr>'
    else:
        body = "".join(
            (f'<tr class="{_e(classes[i])}">' if classes and classes[i] else "<tr>")
            + "".join(_cell(value) for value in row)
            + "</tr>"
            for i, row in enumerate(rows)
        )
    cls = f' class="{_e(table_class)}"' if table_class else ""
    thead = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    return f"<table{cls}>{thead}<tbody>{body}</tbody></table>"


def _stamp(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


# -- the summary tables --------------------------------------------------------------------------


def _header(summary: Summary, names: dict[str, str]) -> str:
    totals, span, files = summary["totals"], summary["span"], summary["files"]
    verdict = str(summary["verdict"])
    out = [
        f'<h1>acp-proxy report <span class="verdict {_e(verdict)}">{_e(verdict)}</span></h1>',
        f'<p class="meta">{_e(plural(totals["files"], "trace file"))}, '
        f"{_e(plural(totals['records'], 'record'))}; from {_e(_stamp(span['start']))} to "
        f"{_e(_stamp(span['end']))} ({span['seconds']:.3f} s)</p>",
        _table(
            ["node", "file", "records", "skipped lines", "runs", "first", "last"],
            [
                [
                    names.get(f["node"], f["node"]),
                    f["node"],
                    f["records"],
                    f["skipped_lines"],
                    f["runs"],
                    _stamp(f["first"]),
                    _stamp(f["last"]),
                ]
                for f in files
            ],
            table_class="files",
        ),
    ]
    out += [f'<p class="note">note: {_e(note)}</p>' for note in summary["notes"]]
    if totals["skipped_lines"]:
        where = [f"{f['node']}:{line}" for f in files for line in f["unreadable_lines"][:3]]
        out.append(
            f'<p class="note">skipped {_e(plural(totals["skipped_lines"], "unreadable line"))}'
            f" ({_e(', '.join(where))})</p>"
        )
    if totals["ignored_records"]:
        kinds = ", ".join(f"{event} x{n}" for event, n in summary["ignored"].items())
        out.append(
            f'<p class="note">ignored {_e(plural(totals["ignored_records"], "record"))} '
            f"of unknown events ({_e(kinds)})</p>"
        )
    out.append(
        '<nav><a href="#totals">Totals</a><a href="#faults">Faults</a>'
        '<a href="#messages">Messages</a><a href="#prompts">Prompts</a>'
        '<a href="#keys">Keys</a><a href="#retries">Retries</a><a href="#findings">Findings</a>'
        '<a href="#timeline">Timeline</a></nav>'
    )
    return "\n".join(out)


def _totals(summary: Summary) -> str:
    rows = totals_rows(summary, runs_and_reloads=True)
    return '<h2 id="totals">Totals</h2>' + _table(["", ""], rows, table_class="totals")


def _faults(summary: Summary, names: dict[str, str]) -> str:
    return '<h2 id="faults">Faults injected</h2>' + _table(
        *faults_table(summary, names), table_class="faults", empty="no fault injected"
    )


def _messages(summary: Summary) -> str:
    relayed = _table(
        *relayed_table(summary), table_class="messages-relayed", empty="no message relayed"
    )
    not_relayed = _table(
        *not_relayed_table(summary),
        table_class="messages-not-relayed",
        empty="every message was relayed",
    )
    held = _table(
        *held_table(summary), table_class="messages-held", empty="no message held by a rule"
    )
    connections = _table(
        *connections_table(summary), table_class="connections", empty="no connection recorded"
    )
    return (
        '<h2 id="messages">Messages relayed</h2>'
        + relayed
        + "<h2>Messages not relayed</h2>"
        + not_relayed
        + '<h2>Messages held by rules</h2><p class="note">delays, reorders, throttles, stalls, '
        "spaced copies: each is in the messages relayed (or not relayed) when it left</p>"
        + held
        + "<h2>Connections</h2>"
        + connections
    )


def _prompts(summary: Summary, names: dict[str, str]) -> str:
    note = prompts_note(summary)
    return (
        '<h2 id="prompts">Prompts</h2><p class="note">session/prompt requests, rebuilt from the '
        "trace, by session</p>"
        + _table(
            *prompts_table(summary, names), table_class="prompts", empty="no session/prompt request"
        )
        + (f'<p class="note">{_e(note)}</p>' if note else "")
    )


def _keys(summary: Summary, names: dict[str, str]) -> str:
    header, rows = keys_table(summary, names)
    return (
        '<h2 id="keys">Idempotency keys</h2><p class="note">each (session, key) over every '
        f"node: {_e(keys_note(summary))}</p>"
        + _table(
            header,
            rows,
            classes=["failing" if row[-1] == "duplicate" else "" for row in rows],
            table_class="keys",
            empty="no key worth listing",
        )
    )


def _retries(summary: Summary, names: dict[str, str], rows: dict[int, int]) -> str:
    retries = summary["retries"]
    note = ""
    if retries["delay_ms"] is not None:
        note = (
            f'<p class="note">{retries["count"]} retries, median '
            f"{retries['delay_ms']['median']:.1f} ms after the loss</p>"
        )
    return (
        '<h2 id="retries">Retries</h2><p class="note">a prompt resent with its key (on any '
        "node), or, unkeyed, the next prompt on a session after a loss there; each is linked to "
        "the attempt it retries in the timeline</p>"
        + note
        + _table(
            *retries_table(summary, names, id_text=wire_text, timeline_rows=rows),
            table_class="retries",
            empty="no retry",
        )
    )


def _findings(summary: Summary, names: dict[str, str]) -> str:
    found = summary["findings"]["list"]
    return (
        f'<h2 id="findings">Findings</h2><p class="meta">{_e(findings_phrase(summary))}</p>'
        + _table(
            *findings_table(summary, names, check_first=True),
            classes=["warning" if f["warning"] else "failing" for f in found],
            table_class="findings",
            empty="no finding",
        )
    )


# -- the timeline --------------------------------------------------------------------------------


@dataclass
class _Row:
    """One row of the timeline: an SVG group."""

    number: int
    kind: str
    classes: list[str]
    time: float
    node: str
    shapes: list[str] = field(default_factory=list)
    label: str = ""
    title: str = ""


def _sender_receiver(direction: Direction) -> tuple[int, int]:
    if direction is Direction.TO_CLIENT:
        return _X_AGENT, _X_CLIENT
    return _X_CLIENT, _X_AGENT


def _arrow(x1: int, x2: int, y: int, *, head: bool = True) -> list[str]:
    """A horizontal line from x1 to x2 at y, with an arrow head at x2."""
    shapes = [f'<line class="arrow" x1="{x1}" y1="{y}" x2="{x2}" y2="{y}"/>']
    if head:
        step = -7 if x2 > x1 else 7
        shapes.append(
            f'<polygon class="head" points="{x2},{y} {x2 + step},{y - 4} {x2 + step},{y + 4}"/>'
        )
    return shapes


def _cross(x: int, y: int, cls: str = "cross") -> str:
    return (
        f'<path class="{cls}" d="M {x - 5} {y - 5} L {x + 5} {y + 5} M {x - 5} {y + 5} '
        f'L {x + 5} {y - 5}"/>'
    )


def _dot(x: int, y: int) -> str:
    return f'<circle class="dot" cx="{x}" cy="{y}" r="5"/>'


def _ids(record: MessageRecord | HeldRecord) -> str:
    sent, forwarded = record.id, record.forwarded_id
    if sent is None and forwarded is None:
        return ""
    if forwarded is None:
        return f" id {wire_text(sent)}"
    return f" id {wire_text(sent)}\u2192{wire_text(forwarded)}"


def _held_for(record: HeldRecord) -> str:
    """How long and by which rules a ``held`` record's message was held."""
    return f"{record.delay_ms:.1f} ms by {rules_text(record.rules)}"


def _css_word(value: object) -> str:
    """A value usable as one CSS class (anything else becomes ``other``)."""
    text = str(value)
    if text and all(c.isalnum() or c in "_-" for c in text):
        return text
    return "other"


def _title(record: TraceRecord) -> str:
    """A record as its trace line has it (the row's tooltip)."""
    return wire_text(as_json(record))


class _Timeline:
    """Builds the rows of the timeline from the records."""

    def __init__(self, summary: Summary, names: dict[str, str], limit: int) -> None:
        self.summary = summary
        self.names = names
        self.several = len(summary["files"]) > 1
        self.start: float = summary["span"]["start"] or 0.0
        self.limit = limit
        self.rows: list[_Row] = []
        self.messages_seen = 0
        self.messages_total = 0
        self.truncated = False
        self.prompt_rows: dict[tuple[str, str, str, float], int] = {}
        self.retry_rows: dict[int, int] = {}
        """Index in the summary's retries list -> the row of the retry."""
        self.links: list[tuple[int, int, str]] = []
        """(row of the lost attempt, row of its retry, title) for each retry link drawn."""
        self.keyed: dict[str, KeyedRecord] = {}
        """Per node: its last ``keyed`` record, named on the prompt relayed right after it."""
        self.held_rows: dict[HoldKey, tuple[int, HeldRecord]] = {}
        """Each hold awaiting its delivery: the row and record that drew it."""
        self.bars: list[tuple[int, int, str]] = []
        """(row of the hold, row of its delivery, title) for each hold bar drawn."""

    def add(self, entries: Sequence[Entry]) -> None:
        self.messages_total = sum(1 for e in entries if isinstance(e.record, MessageRecord))
        merged = [f for f in self.summary["findings"]["list"] if f["by"] == "report"]
        for entry in entries:
            while merged and merged[0]["time"] <= entry.time:
                self._merged_finding(merged.pop(0))
            record = entry.record
            match record:
                case KeyedRecord():
                    self.keyed[entry.node] = record
                case MessageRecord():
                    if self.messages_seen >= self.limit:
                        self.truncated = True
                        break
                    self.messages_seen += 1
                    self._message(entry, record)
                case HeldRecord():
                    self._held(entry, record)
                case FaultRecord():
                    self._fault(entry, record)
                case ConnectionRecord():
                    self._connection(entry, record)
                case RestartRecord():
                    self._restart(entry, record)
                case TraceHeader():
                    text = f"proxy run (trace v{record.version})"
                    self._marker(entry, "run", "proxy", text)
                case ReloadRecord():
                    text = f"rules reloaded: {record.result} ({record.rules} rules)"
                    self._marker(entry, "reload", "proxy", text)
                case FindingRecord():
                    self._finding(entry, record)
            if not isinstance(record, LEDGER_RECORDS):  # a key names only the record after it
                self.keyed.pop(entry.node, None)
        if not self.truncated:
            for finding in merged:
                self._merged_finding(finding)
        self._link_retries()

    def _row(self, node: str, at: float, kind: str, *classes: str) -> _Row:
        row = _Row(len(self.rows) + 1, kind, ["ev", kind, *classes], at, node)
        self.rows.append(row)
        return row

    def _y(self, row: _Row) -> int:
        return _TOP + (row.number - 1) * _ROW + _ROW // 2

    def _prefix(self, node: str, link: int | None) -> str:
        where = f"link {link}" if link is not None else ""
        if self.several:
            where = f"{self.names.get(node, node)} {where}".strip()
        return f"[{where}] " if where else ""

    def _remember_prompt(self, record: MessageRecord | HeldRecord | FaultRecord, row: _Row) -> None:
        if record.method == acp.PROMPT and record.direction is Direction.TO_AGENT:
            key = (row.node, wire_text(record.link), wire_text(record.id), row.time)
            self.prompt_rows.setdefault(key, row.number)

    def _message(self, entry: Entry, record: MessageRecord) -> None:
        disposition = record.disposition
        relayed = disposition is Disposition.RELAYED
        kind = record.kind
        classes = [record.direction.value, _css_word(kind), _css_word(disposition)]
        if not relayed:
            classes.append("stopped")
        held = None
        if record.hold is not None:
            held = self.held_rows.pop(hold_key(entry, record), None)
            classes.append("released")
        row = self._row(entry.node, entry.time, "msg", *classes)
        y = self._y(row)
        start, end = _sender_receiver(record.direction)
        if record.hold is not None:
            start = _X_PROXY  # it reached the proxy when it was held
        if relayed:
            row.shapes += _arrow(start, end, y)
        else:
            if start != _X_PROXY:
                row.shapes += _arrow(start, _X_PROXY, y, head=False)
            row.shapes.append(_cross(_X_PROXY, y, "stop"))
        what = kind or "message"
        text = f"{record.method} {what}" if record.method else str(what)
        text += _ids(record)
        if record.session:
            text += f" {record.session}"
        key = self._key(entry, record)
        if key is not None:
            text += f" key {key}"
        if record.size is not None:
            text += f" {record.size} B"
        if record.duration_ms is not None:
            text += f" {record.duration_ms:.1f} ms"
        if not relayed:
            text += f" \u2014 {disposition}, not relayed"
            if record.reason:
                text += f" ({record.reason})"
            elif record.rule is not None:
                text += f" (rule {record.rule})"
        if held is not None:
            number, hold = held
            note = f"held {_held_for(hold)} since #{number}"
            text += f" \u2014 {note}"
            self.bars.append((number, row.number, f"#{number} to #{row.number}: {note}"))
        elif record.hold is not None:
            text += f" \u2014 released from hold {record.hold}"
        row.label = self._prefix(entry.node, record.link) + text
        row.title = _title(record)
        self._remember_prompt(record, row)

    def _held(self, entry: Entry, record: HeldRecord) -> None:
        """A message a rule held: it reached the proxy and waits there (a pause mark)."""
        direction = record.direction
        row = self._row(entry.node, entry.time, "held", direction.value, record.kind.value)
        y = self._y(row)
        start, _ = _sender_receiver(direction)
        row.shapes += _arrow(start, _X_PROXY, y, head=False)
        row.shapes += [
            f'<rect class="pause" x="{_X_PROXY - 5}" y="{y - 6}" width="3" height="12"/>',
            f'<rect class="pause" x="{_X_PROXY + 2}" y="{y - 6}" width="3" height="12"/>',
        ]
        note = _held_for(record)
        if len(note) > _NOTE_CHARS:
            note = note[: _NOTE_CHARS - 1] + "\u2026"
        # on the empty side of the proxy lane: where the message has not gone yet
        x, anchor = (_X_PROXY + 10, "start") if start < _X_PROXY else (_X_PROXY - 10, "end")
        row.shapes.append(
            f'<text class="hold-note" x="{x}" y="{y - 5}" text-anchor="{anchor}">{_e(note)}</text>'
        )
        kind = record.kind
        what = record.method or kind
        text = f"\u2016 held {_held_for(record)}: {what} {kind}" + _ids(record)
        if record.copy:
            text += " (an injected copy)"
        text += f" {record.size} B"
        row.label = self._prefix(entry.node, record.link) + text
        row.title = _title(record)
        self.held_rows[hold_key(entry, record)] = (row.number, record)
        self._remember_prompt(record, row)

    def _key(self, entry: Entry, record: MessageRecord) -> str | None:
        """The idempotency key of a relayed prompt (its ``keyed`` record came just before)."""
        if record.method != acp.PROMPT or record.direction is not Direction.TO_AGENT:
            return None
        keyed = self.keyed.pop(entry.node, None)
        if keyed is None or keyed.link != record.link:
            return None
        return keyed.key

    def _fault(self, entry: Entry, record: FaultRecord) -> None:
        action = record.action
        row = self._row(entry.node, entry.time, "fault", record.direction.value)
        row.classes.append(f"action-{_css_word(action)}")
        y = self._y(row)
        start, _ = _sender_receiver(record.direction)
        row.shapes += _arrow(start, _X_PROXY, y, head=False)
        row.shapes.append(_cross(_X_PROXY, y))
        what = record.method or record.kind
        text = f"\u26a1 {action} (rule {record.rule}) on {what} {record.kind}"
        if record.id is not None:
            text += f" id {wire_text(record.id)}"
        if action == ActionName.DROP:
            text += ": lost at the proxy"
        row.label = self._prefix(entry.node, record.link) + text
        row.title = _title(record)
        self._remember_prompt(record, row)

    def _connection(self, entry: Entry, record: ConnectionRecord) -> None:
        state, side = record.state, record.side
        row = self._row(entry.node, entry.time, "conn", state, side.value)
        row.shapes.append(_dot(_LANES.get(side, _X_PROXY), self._y(row)))
        row.label = (
            self._prefix(entry.node, record.link)
            + f"{side} connection {state} ({record.transport})"
        )
        row.title = row.label

    def _restart(self, entry: Entry, record: RestartRecord) -> None:
        what = record.what
        row = self._row(entry.node, entry.time, "restart", what)
        row.shapes.append(_dot(_X_AGENT if what == "agent" else _X_PROXY, self._y(row)))
        row.label = (
            self._prefix(entry.node, record.link)
            + f"\u21bb restart ({what}), {record.abandoned} requests abandoned"
        )
        row.title = row.label

    def _marker(self, entry: Entry, kind: str, lane: str, text: str) -> None:
        row = self._row(entry.node, entry.time, kind)
        row.shapes.append(_dot(_LANES[lane], self._y(row)))
        link = entry.record.link if isinstance(entry.record, ReloadRecord) else None
        row.label = self._prefix(entry.node, link) + text
        row.title = row.label

    def _finding(self, entry: Entry, record: FindingRecord) -> None:
        """A ledger's ``finding`` record."""
        prefix = self._prefix(entry.node, record.link)
        self._finding_row(
            entry.node,
            record.time,
            prefix=prefix,
            check=record.check,
            session=record.session,
            key=record.key,
            detail=record.detail,
        )

    def _merged_finding(self, finding: Finding) -> None:
        """A finding of the merged traces (``by: report``), named by the nodes involved."""
        prefix = f"[{', '.join(self.names.get(n, n) for n in finding['nodes'])}] "
        self._finding_row(
            "-",
            float(finding["time"]),
            prefix=prefix,
            check=finding["check"],
            session=finding["session"],
            key=finding["key"],
            detail=finding["detail"],
        )

    def _finding_row(
        self,
        node: str,
        at: float,
        *,
        prefix: str,
        check: Check | str,
        session: str | None,
        key: str | None,
        detail: str,
    ) -> None:
        warning = check in WARNING_CHECKS
        row = self._row(node, at, "finding", "warning" if warning else "failing")
        y = self._y(row)
        row.shapes.append(
            f'<polygon class="dot" points="{_X_PROXY},{y - 6} {_X_PROXY + 6},{y} '
            f'{_X_PROXY},{y + 6} {_X_PROXY - 6},{y}"/>'
        )
        row.label = prefix + f"\u2691 finding {check}: session {session}, key {key}: {detail}"
        row.title = row.label

    def _lost_row(self, retry: RetryView) -> int | None:
        """The row of the attempt a retry retries."""
        key = (
            retry["lost_node"],
            wire_text(retry["lost_link"]),
            wire_text(retry["lost_id"]),
            retry["lost_time"],
        )
        return self.prompt_rows.get(key)

    def _link_retries(self) -> None:
        for index, retry in enumerate(self.summary["retries"]["list"]):
            key = (retry["node"], wire_text(retry["link"]), wire_text(retry["id"]), retry["time"])
            at = self.prompt_rows.get(key)
            if at is None:
                continue
            self.retry_rows[index] = at
            lost = self._lost_row(retry)
            row = self.rows[at - 1]
            where = f"#{lost}" if lost is not None else f"id {wire_text(retry['lost_id'])}"
            note = f"\u21ba retry of {where} after {retry['after']}, {retry['delay_ms']:.1f} ms"
            if retry["across_nodes"]:
                note += " (other node)"
            row.classes.append("retry")
            row.label = f"{note} \u2014 {row.label}"
            if lost is not None:
                self.links.append((lost, at, note))

    def svg(self) -> str:
        height = _TOP + len(self.rows) * _ROW + 16
        bottom = height - 8
        out = [
            f'<svg width="{_WIDTH}" height="{height}" '
            f'viewBox="0 0 {_WIDTH} {height}" role="img" aria-label="sequence timeline">',
            '<text class="gutter" x="8" y="22">row</text>',
            '<text class="gutter" x="52" y="22">time</text>',
        ]
        for lane, x in _LANES.items():
            title = {"client": "Client", "proxy": "proxy", "agent": "Agent"}[lane]
            out.append(f'<text class="lane-label {lane}" x="{x}" y="22">{title}</text>')
            out.append(f'<line class="lane {lane}" x1="{x}" y1="30" x2="{x}" y2="{bottom}"/>')
        for row in self.rows:
            y = self._y(row)
            label = row.label
            if len(label) > _LABEL_CHARS:
                label = label[: _LABEL_CHARS - 1] + "\u2026"
            out.append(
                f'<g class="{_e(" ".join(row.classes))}" id="row-{row.number}">'
                f"<title>#{row.number} {_e(row.title)}</title>"
                f'<rect class="bg" x="0" y="{y - _ROW // 2}" width="{_WIDTH}" height="{_ROW}"/>'
                f'<text class="gutter" x="8" y="{y + 4}">#{row.number}</text>'
                f'<text class="gutter" x="52" y="{y + 4}">+{row.time - self.start:.3f}s</text>'
                + "".join(row.shapes)
                + f'<text class="label" x="{_X_LABEL}" y="{y + 4}">{_e(label)}</text></g>'
            )
        for held, sent, note in self.bars:
            y1 = _TOP + (held - 1) * _ROW + _ROW // 2
            y2 = _TOP + (sent - 1) * _ROW + _ROW // 2
            out.append(
                f'<line class="hold-bar" data-from="{held}" data-to="{sent}" '
                f'x1="{_X_PROXY}" y1="{y1 + 7}" x2="{_X_PROXY}" y2="{y2}">'
                f"<title>{_e(note)}</title></line>"
            )
        for lost, at, note in self.links:
            y1 = _TOP + (lost - 1) * _ROW + _ROW // 2
            y2 = _TOP + (at - 1) * _ROW + _ROW // 2
            bend = _X_CLIENT - 30 - min(50, (y2 - y1) // 20)
            out.append(
                f'<path class="retry-link" data-from="{lost}" data-to="{at}" '
                f'd="M {_X_CLIENT} {y1} C {bend} {y1}, {bend} {y2}, {_X_CLIENT - 4} {y2}">'
                f"<title>#{at}: {_e(note)}</title></path>"
            )
        out.append("</svg>")
        return "\n".join(out)


def _timeline(timeline: _Timeline) -> str:
    shown = timeline.messages_seen
    total = timeline.messages_total
    bound = ""
    if timeline.truncated:
        bound = (
            f'<p class="note truncated">The trace has {total} message records; the timeline '
            f"shows the first {shown} (and the records up to them). The tables above count "
            "them all.</p>"
        )
    legend = (
        '<p class="legend"><span class="k-client">\u2192 Client to Agent</span>'
        '<span class="k-agent">\u2190 Agent to Client</span>'
        "<span>\u2715 (grey) not relayed</span>"
        '<span class="k-fault">\u2715 fault at the proxy (rule, action)</span>'
        '<span class="k-hold">\u2016\u2506 held by a rule (delay, reorder, throttle, stall, '
        "spaced copy), until sent</span>"
        '<span class="k-proxy">\u25cf restart, proxy run</span>'
        '<span class="k-fault">\u25c6 finding</span>'
        '<span class="k-retry">\u21ba retry, linked to the attempt it retries</span></p>'
    )
    return (
        '<h2 id="timeline">Timeline</h2>'
        + f'<p class="meta">{_e(plural(len(timeline.rows), "row"))}, '
        + f"{_e(plural(shown, 'message'))} of {total}; hover a row for its record</p>"
        + bound
        + legend
        + '<div class="timeline">'
        + timeline.svg()
        + "</div>"
    )


def render_html(records: Sequence[Entry], summary: Summary, *, limit: int = MAX_MESSAGES) -> str:
    """The report as one self-contained HTML document (inline CSS and SVG, nothing fetched).

    ``records`` are the merged records of :func:`proxy.tools.report.load_traces` and ``summary``
    their
    :func:`proxy.tools.report.summarize`. The timeline shows at most ``limit`` message records.
    """
    names = short_names(f["node"] for f in summary["files"])
    timeline = _Timeline(summary, names, max(0, limit))
    timeline.add(records)
    body = [
        _header(summary, names),
        _totals(summary),
        _findings(summary, names),
        _faults(summary, names),
        _messages(summary),
        _prompts(summary, names),
        _keys(summary, names),
        _retries(summary, names, timeline.retry_rows),
        _timeline(timeline),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>acp-proxy report ({_e(summary['verdict'])})</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def write_html(paths: Sequence[Path], out_file: Path, *, limit: int = MAX_MESSAGES) -> int:
    """``report --html FILE``: write the page of the traces to ``out_file``; the exit status.

    0; 1 when a finding other than a warning (``unkeyed_resend``) was recorded (the page is
    written all the same); 2 when a trace is missing, unreadable or not a trace, or the page
    cannot be written (an ``error: ...`` line on stderr, no page).
    """
    if not paths:
        sys.stderr.write("error: give at least one trace file\n")
        return 2
    try:
        records = load_traces(paths)
    except TraceReadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    summary = summarize(records)
    page = render_html(records, summary, limit=limit)
    try:
        Path(out_file).write_text(page, encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"error: {out_file}: cannot write it: {exc.strerror or exc}\n")
        return 2
    return 1 if summary["findings"]["failing"] else 0
