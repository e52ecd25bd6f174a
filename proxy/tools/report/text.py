"""The report for people, as text: totals, faults, messages, prompts, keys, retries, findings."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from proxy.tools.report.model import Summary, Totals
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

__all__ = ["render_text"]


def _cell(value: Cell) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[str]:
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


class _Text:
    """The lines of :func:`render_text`, section by section."""

    def __init__(self, summary: Summary) -> None:
        self.summary = summary
        self.totals: Totals = summary["totals"]
        self.names = short_names(f["node"] for f in summary["files"])
        self.out: list[str] = []

    def node(self, node: str) -> str:
        return self.names.get(node, node)

    def section(self, title: str, header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> None:
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
        held = held_table(self.summary)
        title = "Messages held by rules (delay, reorder, bandwidth, stall, hold, spaced copies)"
        self.section(title, *held)

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
        delay = retries["delay_ms"]
        if not retries["list"] or delay is None:  # no retry, so no delay
            return
        self.section(
            f"Retries (a prompt resent with its key; unkeyed, the next prompt on a session "
            f"after a loss there): {retries['count']}, median "
            f"{delay['median']:.1f} ms after the loss",
            *retries_table(self.summary, self.names, id_text=json.dumps),
        )

    def findings(self) -> None:
        self.out += ["", f"Findings: {findings_phrase(self.summary)}"]
        if self.summary["findings"]["list"]:
            self.out += _table(*findings_table(self.summary, self.names))


def render_text(summary: Summary) -> str:
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
