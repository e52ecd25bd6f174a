"""``acp-proxy demo``: the retry lab in a few seconds, on loopback, with nothing to set up.

The reference Client submits a few prompts, each with a key of its own, to an Agent through the
proxy, which runs a built-in fault file:

1. the answer to the first keyed prompt is lost (the Client times out and resends the same key);
2. the second prompt's answer is lost and the Agent killed at that moment: the proxy exits like
   the Agent did, the Client starts it again (``--state`` keeps the rules from firing twice),
   resumes the session and resends;
3. the third keyed prompt reaches the Agent twice, under two ids (a replayed retry).

What the run shows does not depend on the machine's speed. The Client follows the proxy's trace
(:mod:`proxy.tools.lab.trace_follow`): its timeout for an answer ends the moment the proxy drops
that answer, so a slow answer is never taken for a lost one and the rules' counts always meet the
same messages; a killed Agent ends the connection, which the Client sees; and the final history
is read once the proxy's copy in step 3 has been answered. The Client's retries are its own:
same key, new id, reconnect, resume, as when it runs alone on a timer.

The Agent is the reference one with a session store, or with ``--bad-agent`` the reference one
ignoring keys, or any Agent command given after ``--`` (spawned over stdio by the proxy). Then it
prints what happened: the faults injected, the Client's attempts and verdict, the messages in the
session's history and the proxy's findings, and a result whose status :attr:`DemoResult.status`
is: 0 clean, 1 a flaw found (a finding, or the Client's verdict), 2 nothing checked (the Agent
could not be run, or is not an ACP v2 Agent).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from proxy.core.errors import OptionError, at_least, os_cause
from proxy.shell.defaults import MIN_TIMEOUT
from proxy.shell.writable import cannot_write_in
from proxy.tools import cannot_run
from proxy.tools.lab.client import ClientOptions, ClientReport, run_client
from proxy.tools.lab.client import render as render_client
from proxy.tools.report import (
    Summary,
    findings_phrase,
    load_traces,
    plural,
    render_text,
    summarize,
)

__all__ = ["ANSWER_TIMEOUT", "DEMO_FAULTS", "DemoOptions", "DemoResult", "demo_main", "run_demo"]

DEMO_FAULTS = """\
version: 1
seed: 7
rules:
  - name: lose-first-keyed-answer
    when: {direction: to_client, kind: response, method: session/prompt, idempotency_key: present}
    schedule: {nth: [1]}
    do: {action: drop}
  - name: lose-second-answer
    when: {direction: to_client, kind: response, method: session/prompt, idempotency_key: present}
    schedule: {nth: [3]}
    do: {action: drop}
    continue: true
  - name: kill-agent-with-the-second-answer
    when: {direction: to_client, kind: response, method: session/prompt, idempotency_key: present}
    schedule: {nth: [3]}
    do: {action: kill_agent, signal: KILL}
  - name: replay-third-prompt
    when: {direction: to_agent, kind: request, method: session/prompt, idempotency_key: present}
    schedule: {nth: [5]}
    do: {action: duplicate, copies: 1, gap_ms: 10}
"""
"""The built-in fault file. Each rule counts every message its ``when`` matches, those an earlier
rule acted on included: the 3rd keyed answer is the second prompt's (after the first prompt's
lost answer and its retry's), and the 5th keyed request is the third prompt's first attempt
(after one retry each of the first two). The counts hold because the Client resends only what
the proxy dropped (it follows the trace), never an answer that is merely slow."""

ANSWER_TIMEOUT = 10.0
"""Seconds the Client waits for an answer the proxy did not drop (then resends)."""
STARTUP_TIMEOUT = 30.0
"""Seconds the proxy and the Agent it spawns get to start and answer ``initialize`` (a busy
machine starts Python slowly), and to exit once the Client is done with them (the proxy saves
its ``--state`` and its last trace lines as it exits)."""

PROMPTS = ("Run the database migration", "Deploy to staging", "Send the release notes")

KILL_NOTE = (
    "Step 2 kills the Agent and starts it again: an Agent that keeps its sessions across "
    "restarts (a store on disk) lets the Client resume the session and resend with the same "
    "key; one that keeps them in memory only has lost the session, so the resume fails and the "
    "Client stops there, as it would after a crash."
)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the demo runs against, and where it keeps its files."""

    bad_agent: bool = False
    """The reference Agent ignoring keys (a known-bad Agent)."""
    agent_argv: tuple[str, ...] = ()
    """Another Agent, spawned over stdio by the proxy (default: the reference Agent)."""
    directory: Path | None = None
    """Where the run's files (trace, store, fault file) are kept (default: a temporary one)."""
    answer_timeout: float = ANSWER_TIMEOUT
    """Seconds the Client waits for an answer the proxy did not drop (then resends)."""

    def __post_init__(self) -> None:
        at_least("--answer-timeout", self.answer_timeout, MIN_TIMEOUT)
        if self.bad_agent and self.agent_argv:
            raise OptionError(
                "--bad-agent picks the reference Agent: give it or an Agent command, not both",
                option="AGENT_CMD",
            )


@dataclass
class DemoResult:
    """What the demo saw, and its exit status."""

    client: ClientReport
    summary: Summary | None
    """The proxy's trace summarized (``None`` when nothing was checked)."""
    text: str
    """The report for people; when nothing was checked, the one line saying why."""
    status: int
    """0 clean; 1 a flaw found (a finding, or the Client's verdict); 2 nothing checked."""


def demo_main(options: DemoOptions) -> int:
    """``acp-proxy demo``: run the lab once and print what it showed (stdout), or the one line
    saying why nothing could be checked (stderr); the exit status (:attr:`DemoResult.status`)."""
    why = cannot_run(options.agent_argv) if options.agent_argv else None
    if why is None and options.directory is not None:
        why = cannot_keep(options.directory)
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    result = asyncio.run(run_demo(options))
    if result.status == 2:
        sys.stderr.write(f"error: {result.text}\n")
    else:
        sys.stdout.write(result.text + "\n")
    return result.status


def cannot_keep(directory: Path) -> str | None:
    """Why the demo cannot keep its files in ``directory`` (``--keep``); None when it can (the
    directory is made if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--keep {directory}: {os_cause(exc)}"
    cause = cannot_write_in(directory)
    return None if cause is None else f"--keep {directory}: cannot be written: {cause}"


async def run_demo(options: DemoOptions) -> DemoResult:
    """Run the lab once against ``options.agent_argv`` (default: the reference Agent, ignoring
    keys with ``options.bad_agent``); keep its files in ``options.directory`` (a temporary one by
    default).

    The Client follows the proxy's trace: it resends when the proxy dropped an answer, and waits
    ``options.answer_timeout`` for the others (only an Agent that does not answer ever spends
    it)."""
    bad_agent, agent_argv = options.bad_agent, options.agent_argv
    with tempfile.TemporaryDirectory(prefix="acp-demo-") as scratch:
        work = options.directory or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        faults = work / "demo-faults.yaml"
        faults.write_text(DEMO_FAULTS)
        trace = work / "trace.jsonl"
        state = work / "proxy-state.json"
        for previous in (trace, state):  # a kept directory used again: this run's files only
            previous.unlink(missing_ok=True)
        agent = list(agent_argv) or [
            sys.executable,
            "-m",
            "proxy",
            "agent",
            "--store",
            str(work / "store"),
            *(["--no-dedupe"] if bad_agent else []),
        ]
        proxy = [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--faults",
            str(faults),
            "--state",
            str(state),
            "--trace",
            str(trace),
            "--log-level",
            "error",
            "--",
            *agent,
        ]
        report = await run_client(
            ClientOptions(
                agent_argv=tuple(proxy),
                prompts=PROMPTS,
                answer_timeout=options.answer_timeout,
                setup_timeout=max(STARTUP_TIMEOUT, options.answer_timeout),
                grace=STARTUP_TIMEOUT,
                follow_trace=trace,
            )
        )
        if report.exit_status == 2:
            return DemoResult(report, None, _unchecked(report, agent_argv), 2)
        summary = summarize(load_traces([trace]))
        status = 1 if report.exit_status or summary["findings"]["count"] else 0
        text = _render(report, summary, _agent_name(bad_agent, agent_argv), bool(agent_argv))
        if options.directory is None:
            text += f"\n\n{KEEP_NOTE}"
        return DemoResult(report, summary, text, status)


KEEP_NOTE = (
    "The run's files (trace.jsonl, the fault file, the proxy's state) were in a temporary "
    "folder, now gone: `acp-proxy demo --keep DIR` keeps them in DIR, for "
    "`acp-proxy report DIR/trace.jsonl --html report.html`."
)
"""The last line of a demo whose files were not kept."""


def _agent_name(bad_agent: bool, agent_argv: tuple[str, ...]) -> str:
    if agent_argv:
        return f"your Agent ({shlex.join(agent_argv)})"
    if bad_agent:
        return "the reference Agent with --no-dedupe (ignores keys)"
    return "the reference Agent"


def _unchecked(report: ClientReport, agent_argv: tuple[str, ...]) -> str:
    """The one line of a run that checked nothing: which Agent, and why."""
    name = shlex.join(agent_argv) if agent_argv else "the reference Agent"
    return f"cannot run the demo against {name}: {report.error}"


def _render(report: ClientReport, summary: Summary, agent: str, own_agent: bool) -> str:
    lines = [
        "acp-proxy demo: the reference Client -> the proxy with a built-in fault file -> " + agent,
        "",
    ]
    if own_agent:
        lines += [KILL_NOTE, ""]
    lines += [render_client(report), "", render_text(summary), ""]
    lines += _result(report, summary, own_agent)
    return "\n".join(lines)


def _result(report: ClientReport, summary: Summary, own_agent: bool) -> list[str]:
    """The closing lines: the verdict of the Client and of the proxy, and whether they agree."""
    found = summary["findings"]["count"]
    if report.ok and found == 0:
        clean = (
            "Result: every lost answer was retried with its key and every submission is in the "
            "session exactly once."
        )
        if own_agent:
            return [clean]
        return [f"{clean} Run `acp-proxy demo --bad-agent` to see an Agent that ignores keys."]
    twice = [s for s in report.submissions if s.inserted_twice]
    lines: list[str] = []
    if report.stop == "session_lost":  # the cause first: the findings follow from it
        lines.append(
            "The Agent lost the session when it was killed (step 2): the Client could not "
            f"resume it, so {plural(len(report.not_submitted), 'prompt')} went unsubmitted. An "
            "Agent that keeps its sessions in memory only cannot be resumed after a crash; give "
            "it a store if it has one."
        )
    if twice or found:
        lines.append(
            f"The Client saw {plural(len(twice), 'submission')} inserted more than once and the "
            f"trace shows {findings_phrase(summary)}."
        )
    if twice:
        lines.append(
            "The Agent inserted a prompt again under a key it had seen (a retry after a lost "
            "answer, a replayed request): it does not honour keys."
        )
    unconfirmed = sum(1 for s in report.submissions if not s.confirmed)
    if report.stop != "session_lost":  # that one was said first, as the cause
        if report.error is not None:
            lines.append(f"The Client stopped: {report.error}.")
        elif unconfirmed:
            lines.append(f"{plural(unconfirmed, 'submission')} never confirmed.")
    ledger = {
        finding["key"]
        for finding in summary["findings"]["list"]
        if finding["check"] == "duplicate_insert"
        and finding["session"] == report.session_id
        and finding["key"] is not None  # a ledger's duplicate_insert always names its key
    }
    client = {submission.key for submission in twice if submission.key is not None}
    if ledger != client:
        lines.append(
            "The Client and the proxy disagree on which keys were inserted twice: "
            f"Client {sorted(client)}, proxy {sorted(ledger)}."
        )
    return [f"Result (exit 1): {lines[0]}", *lines[1:]]
