"""``acp-proxy report``: what a run showed, read back from one or more JSONL traces.

The package, by concern:

* :mod:`~proxy.tools.report.load`: each line read into its typed record
  (:mod:`proxy.core.records`, the types the proxy wrote it with), every file merged by time, the
  unreadable lines counted;
* :mod:`~proxy.tools.report.prompts`: the ``session/prompt`` attempts rebuilt from their records,
  their outcomes and retries; :mod:`~proxy.tools.report.keys`: each idempotency key over every
  node and run;
* :mod:`~proxy.tools.report.summary`: the JSON-ready summary (``--json``) of all that, typed by
  :mod:`~proxy.tools.report.model` (a ``TypedDict`` per shape, read back by the renderings);
* :mod:`~proxy.tools.report.tables`: the summary's tables, for both renderings;
  :mod:`~proxy.tools.report.text` renders them for people, :mod:`~proxy.tools.report.html` as a
  page with a timeline;
* :func:`report_main` here: the command (text and exit status).

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
exactly, and it reconstructs **prompts** and their **retries** from their records
(:mod:`~proxy.tools.report.prompts`).

Per-key judgement is first the ledgers': each proxy writes its findings (``finding`` records:
check, session, key, detail) to its trace, and the report lists them all. A ledger judges only
what crossed its own proxy, so :mod:`~proxy.tools.report.keys` judges each key again over every
node and run and adds the findings only the merged traces show (``by: report``, with the
``nodes`` involved).

Exit status of :func:`report_main`: 0, or 1 when there is a finding other than ``unkeyed_resend``
(a warning: an unsafe retry of the Client), so that CI can fail on it; 2 when a file is missing,
unreadable or not a trace.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from proxy.tools.report.load import TraceReadError, TraceRecords, load_traces
from proxy.tools.report.model import Summary
from proxy.tools.report.summary import summarize
from proxy.tools.report.tables import findings_phrase, plural
from proxy.tools.report.text import render_text

__all__ = [
    "Summary",
    "TraceReadError",
    "TraceRecords",
    "findings_phrase",
    "load_traces",
    "plural",
    "render_text",
    "report_main",
    "summarize",
]


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
