"""``acp-proxy report --html``: the page rendered from real traces and checked for its contents.

The real traces come from ``python -m proxy demo --keep DIR`` (the retry lab: lost answers, an
Agent killed and started again, a duplicated prompt), once with the known-bad Agent (two
``duplicate_insert`` findings) and once with the good one. The page is walked with the standard
library's HTML parser: well nested, nothing fetched, three lanes, one timeline row per message and
per fault, retries linked to the attempt they retry. Hand-written traces cover escaping, the bound
on the timeline and unreadable files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT, write_jsonl

from proxy.tools.report import load_traces, summarize
from proxy.tools.report.html import render_html, write_html

VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "source", "wbr"}


class Page(HTMLParser):
    """The elements of a page: tags, attributes and text, with a check that they nest."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text_of: dict[int, list[str]] = {}
        """For each open element (by index in ``elements``): the text inside it."""
        self.open: list[int] = []
        self.feed(text)
        self.close()
        assert self.stack == [], f"unclosed elements: {self.stack}"

    def _start(self, tag: str, attrs: list[tuple[str, str | None]], closes: bool) -> None:
        self.elements.append((tag, {name: value or "" for name, value in attrs}))
        index = len(self.elements) - 1
        self.text_of[index] = []
        if not closes and tag not in VOID:
            self.stack.append(tag)
            self.open.append(index)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs, closes=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs, closes=True)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack, f"</{tag}> closes nothing"
        assert self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1]}>"
        self.stack.pop()
        self.open.pop()

    def handle_data(self, data: str) -> None:
        for index in self.open:
            self.text_of[index].append(data)

    def with_class(self, name: str, tag: str | None = None) -> list[int]:
        return [
            index
            for index, (t, attrs) in enumerate(self.elements)
            if name in attrs.get("class", "").split() and (tag is None or t == tag)
        ]

    def text(self, index: int) -> str:
        return "".join(self.text_of[index])

    def tags(self) -> set[str]:
        return {tag for tag, _ in self.elements}


def demo_trace(directory: Path, *options: str, status: int = 0) -> Path:
    """Run the demo keeping its files; it exits ``status`` (1: it found a flaw). The Client's
    answer timeout is the harness's bound (the demo's Client follows the proxy's trace)."""
    patience = ["--answer-timeout", str(TIMEOUT)]
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", *patience, "--keep", str(directory), *options],
        check=False,
        capture_output=True,
        timeout=TIMEOUT * 2,
    )
    assert done.returncode == status, done.stderr
    return directory / "trace.jsonl"


@pytest.fixture(scope="module")
def bad_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_trace(tmp_path_factory.mktemp("bad"), "--bad-agent", status=1)


def records_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_self_contained(html: str, page: Page) -> None:
    assert "http://" not in html
    assert "https://" not in html
    assert "//" not in "".join(a.get("href", "") + a.get("src", "") for _, a in page.elements)
    for _, attrs in page.elements:
        assert "src" not in attrs
        assert attrs.get("href", "#").startswith("#")
    assert not page.tags() & {"script", "link", "img", "iframe", "object", "embed"}
    assert "@import" not in html
    assert "url(" not in html


@pytest.mark.slow  # the demo runs first
def test_a_demo_trace_of_the_bad_agent(bad_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert write_html([bad_trace], out) == 1  # duplicate_insert is failing
    html = out.read_text(encoding="utf-8")
    page = Page(html)
    assert_self_contained(html, page)
    assert html.startswith("<!DOCTYPE html>")
    assert page.tags() >= {"html", "head", "style", "body", "table", "svg"}

    # The header: the file and the time span.
    records = records_of(bad_trace)
    assert str(bad_trace) in html
    assert "UTC" in html

    # Three lanes.
    lanes = {page.text(i) for i in page.with_class("lane-label")}
    assert lanes == {"Client", "proxy", "Agent"}

    # One timeline row per message record, per fault record, per connection event.
    messages = [r for r in records if r["event"] == "message"]
    faults = [r for r in records if r["event"] == "fault"]
    assert len(page.with_class("msg", "g")) == len(messages) > 20
    assert len(page.with_class("conn", "g")) == sum(r["event"] == "connection" for r in records)
    assert len(page.with_class("run", "g")) == 2  # the proxy was started again
    fault_rows = [page.text(i) for i in page.with_class("fault", "g")]
    assert len(fault_rows) == len(faults) == 4
    for fault, text in zip(faults, fault_rows, strict=True):
        assert fault["rule"] in text
        assert fault["action"] in text
    assert any("drop (rule lose-first-keyed-answer)" in t for t in fault_rows)
    assert any("kill_agent (rule kill-agent-with-the-second-answer)" in t for t in fault_rows)
    # A relayed message crosses to the far lane; a dropped one ends at the proxy with a cross.
    first = page.with_class("msg", "g")[0]
    assert "to_agent" in page.elements[first][1]["class"].split()
    assert len(page.with_class("cross", "path")) == len(faults)
    # The copy of the duplicated prompt, spaced by gap_ms: held, then sent, joined by a bar.
    (held,) = [r for r in records if r["event"] == "held"]
    assert (held["rules"], held["copy"]) == (["replay-third-prompt"], True)
    assert len(page.with_class("held", "g")) == 1
    (bar,) = page.with_class("hold-bar", "line")
    sent_row = page.elements[bar][1]["data-to"]
    (sent,) = [i for i, (_, a) in enumerate(page.elements) if a.get("id") == f"row-{sent_row}"]
    assert "released" in page.elements[sent][1]["class"].split()

    # Retries are linked to the attempt they retry (a row of the timeline that precedes them).
    summary = summarize(load_traces([bad_trace]))
    assert summary["retries"]["count"] >= 2
    links = page.with_class("retry-link", "path")
    assert len(links) == summary["retries"]["count"]
    ids = {attrs.get("id") for _, attrs in page.elements}
    for index in links:
        attrs = page.elements[index][1]
        lost, retry = int(attrs["data-from"]), int(attrs["data-to"])
        assert lost < retry
        assert {f"row-{lost}", f"row-{retry}"} <= ids
        retry_row = next(
            i for i, (_, a) in enumerate(page.elements) if a.get("id") == f"row-{retry}"
        )
        assert f"retry of #{lost}" in page.text(retry_row)
        assert "retry" in page.elements[retry_row][1]["class"].split()

    # The summary tables.
    (findings,) = page.with_class("findings", "table")
    assert page.text(findings).count("duplicate_insert") == 3  # one per step: each key twice
    (fault_table,) = page.with_class("faults", "table")
    for rule in {f["rule"] for f in faults}:
        assert rule in page.text(fault_table)
    (totals,) = page.with_class("totals", "table")
    assert "4 injected" in page.text(totals)
    (relayed,) = page.with_class("messages-relayed", "table")
    assert "session/prompt" in page.text(relayed)
    (retries,) = page.with_class("retries", "table")
    assert "lose-first-keyed-answer" in page.text(retries)
    assert page.with_class("prompts", "table")
    assert page.with_class("verdict")
    assert "failing" in page.text(page.with_class("verdict")[0])


def test_a_demo_trace_of_the_good_agent_exits_0(tmp_path: Path) -> None:
    trace = demo_trace(tmp_path / "good")
    out = tmp_path / "report.html"
    assert write_html([trace], out) == 0
    html = out.read_text(encoding="utf-8")
    page = Page(html)
    assert_self_contained(html, page)
    (findings,) = page.with_class("findings", "table")
    assert "no finding" in page.text(findings)
    assert "clean" in page.text(page.with_class("verdict")[0])
    assert page.with_class("retry-link", "path")
    assert '<table class="totals"><tbody>' in html  # no empty row of column titles


@pytest.mark.slow  # the demo runs first
@pytest.mark.parametrize("as_json", [False, True])
def test_the_command_writes_the_page_and_with_json_prints_the_summary_too(
    bad_trace: Path, tmp_path: Path, as_json: bool
) -> None:
    """``report --html F`` writes the page and prints nothing; with ``--json`` it prints the JSON
    summary as well. The exit status is the report's (1: the bad Agent's findings)."""
    out = tmp_path / "page.html"
    argv = [sys.executable, "-m", "proxy", "report", "--html", str(out), str(bad_trace)]
    done = subprocess.run(
        [*argv, *(["--json"] if as_json else [])],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == f"wrote {out}"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    if as_json:
        assert json.loads(done.stdout)["verdict"] == "failing"
    else:
        assert done.stdout == ""


def message(at: float, method: str, direction: str = "to_agent", **extra: Any) -> dict[str, Any]:
    return {
        "time": at,
        "link": 1,
        "event": "message",
        "disposition": "relayed",
        "direction": direction,
        "kind": "request",
        "method": method,
        "session": "s1",
        "id": 1,
        "forwarded_id": 0,
        "size": 10,
        **extra,
    }


def test_every_string_from_the_trace_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert('x')</script>"
    trace = write_jsonl(
        tmp_path / "evil<script>.jsonl",
        {"time": 1.0, "event": "trace", "version": 1},
        message(1.1, evil, session='"><script>s</script>', id="<img src=x>"),
        {
            "time": 1.2,
            "link": 1,
            "event": "fault",
            "rule": "</svg><script>r</script>",
            "action": "drop",
            "direction": "to_client",
            "kind": "response",
            "method": evil,
            "session": "s1",
            "id": 0,
        },
        message(1.3, "x", disposition="invalid<b>", reason="<i>bad</i>"),
        {
            "time": 1.4,
            "link": 1,
            "event": "finding",
            "check": "duplicate_insert<script>",
            "session": "s1",
            "key": "<k&>",
            "detail": "</table><script>d</script>",
        },
        {"time": 1.5, "link": 1, "event": "connection", "state": "closed", "side": "<x>"},
        {"time": 1.6, "event": "<script>unknown</script>"},
    )
    records = load_traces([trace])
    html = render_html(records, summarize(records))
    page = Page(html)
    assert "<script" not in html.lower()
    assert "<img" not in html.lower()
    assert "<b>" not in html
    assert "<i>" not in html
    assert "script" not in page.tags()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    # Escaped text reads back as the original.
    assert any(evil in page.text(i) for i in page.with_class("msg", "g"))
    assert any("</svg><script>r</script>" in page.text(i) for i in page.with_class("fault", "g"))
    (findings,) = page.with_class("findings", "table")
    assert "</table><script>d</script>" in page.text(findings)
    assert len(page.with_class("msg", "g")) == 2
    assert len(page.with_class("stopped", "g")) == 1  # the invalid one stops at the proxy


def test_a_held_message_is_drawn_when_it_left_with_the_hold_visible(tmp_path: Path) -> None:
    """A delayed notification: a row when it was held (a pause at the proxy, the rule and the
    delay), the answer that overtook it, then its own row when it left, from the proxy lane to
    the Client, joined to the hold by a bar on the proxy lane. A dropped message is counted in
    the totals as not relayed, and the held one in the table of held messages."""
    late = message(1.5, "_x/late", "to_client", kind="notification", id=None, forwarded_id=None)
    fault = {
        "time": 1.0,
        "link": 1,
        "event": "fault",
        "rule": "late-rule",
        "action": "delay",
        "direction": "to_client",
        "kind": "notification",
        "method": "_x/late",
        "session": "s1",
        "id": None,
    }
    held = {**late, "time": 1.0, "event": "held", "hold": 4, "rules": ["late-rule"]}
    held.pop("disposition")
    held["delay_ms"] = 500.0
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        {"time": 0.5, "event": "trace", "version": 1},
        fault,
        held,
        message(1.1, "_x/fast", "to_client", kind="response", id="f", forwarded_id=2),
        {**late, "hold": 4},
        {**fault, "time": 1.6, "rule": "lose", "action": "drop", "method": "_x/b"},
        {**late, "time": 1.6, "method": "_x/b", "disposition": "dropped", "rule": "lose"},
    )
    records = load_traces([trace])
    page = Page(render_html(records, summarize(records)))
    rows = [
        (page.elements[i][1]["id"], page.elements[i][1]["class"].split()[1], page.text(i))
        for i in page.with_class("ev", "g")
    ]
    kinds = [(row_id, kind) for row_id, kind, _ in rows]
    assert kinds[1:6] == [
        ("row-2", "fault"),
        ("row-3", "held"),
        ("row-4", "msg"),  # the answer that overtook it
        ("row-5", "msg"),  # the held notification, when it left
        ("row-6", "fault"),
    ]
    assert "held 500.0 ms by late-rule" in rows[2][2]
    assert "_x/fast" in rows[3][2]
    assert "_x/late" in rows[4][2]
    assert "held 500.0 ms by late-rule since #3" in rows[4][2]
    (released,) = page.with_class("released", "g")
    assert page.elements[released][1]["id"] == "row-5"
    (bar,) = page.with_class("hold-bar", "line")
    attrs = page.elements[bar][1]
    assert (attrs["data-from"], attrs["data-to"]) == ("3", "5")
    assert attrs["x1"] == attrs["x2"]  # on the proxy lane
    assert "late-rule" in page.text(bar)
    (note,) = page.with_class("hold-note", "text")
    assert page.text(note) == "500.0 ms by late-rule"
    (totals,) = page.with_class("totals", "table")
    assert "2 relayed (20 bytes), 1 not relayed, 1 held by rules (1 sent when released)" in (
        page.text(totals)
    )
    (not_relayed,) = page.with_class("messages-not-relayed", "table")
    assert "dropped" in page.text(not_relayed)
    (held_table,) = page.with_class("messages-held", "table")
    assert "late-rule" in page.text(held_table)


def test_a_key_is_named_only_on_the_prompt_right_after_it(tmp_path: Path) -> None:
    """A ``keyed`` record names the prompt relayed right after it; a prompt that comes after
    another record carries no key (the same rule as the report's tables)."""
    keyed = {
        "time": 1.1,
        "link": 1,
        "event": "keyed",
        "session": "s1",
        "key": "K-right",
        "prompt": "P",
        "retry": False,
    }
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        {"time": 1.0, "event": "trace", "version": 1},
        keyed,
        message(1.1, "session/prompt", id=1, forwarded_id=1),
        {**keyed, "time": 1.2, "key": "K-stale"},
        message(1.2, "session/new", id=2, forwarded_id=2),
        message(1.3, "session/prompt", id=3, forwarded_id=3),
    )
    records = load_traces([trace])
    page = Page(render_html(records, summarize(records)))
    texts = [page.text(i) for i in page.with_class("msg", "g")]
    assert [("key K-right" in t, "K-stale" in t) for t in texts] == [
        (True, False),
        (False, False),
        (False, False),
    ]


def test_the_timeline_is_bounded(tmp_path: Path) -> None:
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        {"time": 1.0, "event": "trace", "version": 1},
        *(message(1.0 + n / 10, "session/new", id=n, forwarded_id=n) for n in range(1, 6)),
    )
    records = load_traces([trace])
    summary = summarize(records)
    page = Page(render_html(records, summary, limit=3))
    assert len(page.with_class("msg", "g")) == 3
    (note,) = page.with_class("truncated")
    assert "5 message records" in page.text(note)
    assert "first 3" in page.text(note)
    (relayed,) = page.with_class("messages-relayed", "table")
    assert "5" in page.text(relayed)  # the tables count them all
    whole = Page(render_html(records, summary))
    assert len(whole.with_class("msg", "g")) == 5
    assert not whole.with_class("truncated")


def test_unreadable_traces_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    assert write_html([tmp_path / "missing.jsonl"], out) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    assert not out.exists()
    assert write_html([], out) == 2
    trace = write_jsonl(tmp_path / "t.jsonl", {"time": 1.0, "event": "trace", "version": 1})
    assert write_html([trace], tmp_path / "no" / "such" / "dir.html") == 2
    assert "cannot write" in capsys.readouterr().err
