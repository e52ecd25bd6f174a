"""``acp-proxy demo``: the retry lab in a few seconds, on loopback, with nothing to set up.

The reference Client submits a few prompts, each with a key of its own, to the reference Agent
(with a session store) through the proxy, which runs a built-in fault file:

1. the answer to the first keyed prompt is lost (the Client times out and resends the same key);
2. the second prompt's answer is lost and the Agent killed at that moment: the proxy exits like
   the Agent did, the Client starts it again (``--state`` keeps the rules from firing twice),
   resumes the session and resends;
3. the third keyed prompt reaches the Agent twice, under two ids (a replayed retry).

Then it prints what happened: the faults injected, the Client's attempts, the messages in the
session's history and the proxy's findings. With ``--bad-agent`` the Agent ignores keys and the
duplicates show up as findings.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.reference_client import ClientOptions, ClientReport, run_client
from proxy.reference_client import render as render_client
from proxy.report import load_traces, render_text, summarize

__all__ = ["DEMO_FAULTS", "DemoResult", "run_demo"]

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
    schedule: {nth: [2]}
    do: {action: drop}
    continue: true
  - name: kill-agent-with-the-second-answer
    when: {direction: to_client, kind: response, method: session/prompt, idempotency_key: present}
    schedule: {nth: [2]}
    do: {action: kill_agent, signal: KILL}
  - name: replay-third-prompt
    when: {direction: to_agent, kind: request, method: session/prompt, idempotency_key: present}
    schedule: {nth: [5]}
    do: {action: duplicate, copies: 1, gap_ms: 10}
"""
"""The built-in fault file. Each rule counts its own matches: the 2nd answer ``lose-second-answer``
sees is the second prompt's (the first rule took the first answer), and the 5th keyed request is
the third prompt's first attempt (after one retry each of the first two)."""

PROMPTS = ("Run the database migration", "Deploy to staging", "Send the release notes")


@dataclass
class DemoResult:
    """What the demo saw."""

    client: ClientReport
    summary: dict[str, Any]
    text: str


async def run_demo(*, bad_agent: bool = False, directory: Path | None = None) -> DemoResult:
    """Run the lab once; keep its files in ``directory`` (a temporary one by default)."""
    with tempfile.TemporaryDirectory(prefix="acp-demo-") as scratch:
        work = directory or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        faults = work / "demo-faults.yaml"
        faults.write_text(DEMO_FAULTS)
        trace = work / "trace.jsonl"
        agent = [sys.executable, "-m", "proxy", "agent", "--store", str(work / "store")]
        if bad_agent:
            agent.append("--no-dedupe")
        proxy = [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--faults",
            str(faults),
            "--state",
            str(work / "proxy-state.json"),
            "--trace",
            str(trace),
            "--log-level",
            "error",
            "--",
            *agent,
        ]
        report = await run_client(
            ClientOptions(agent_argv=tuple(proxy), prompts=PROMPTS, answer_timeout=1.0)
        )
        summary = summarize(load_traces([trace]))
        text = _render(report, summary, bad_agent)
        return DemoResult(report, summary, text)


def _render(report: ClientReport, summary: dict[str, Any], bad_agent: bool) -> str:
    agent = (
        "the reference Agent with --no-dedupe (ignores keys)"
        if bad_agent
        else ("the reference Agent")
    )
    found = int(summary["findings"]["count"])
    lines = [
        "acp-proxy demo: the reference Client -> the proxy with a built-in fault file -> " + agent,
        "",
        render_client(report),
        "",
        render_text(summary),
        "",
    ]
    if report.duplicates == 0 and found == 0:
        lines.append(
            "Result: every lost answer was retried with its key and every submission is in the "
            "session exactly once. Run `acp-proxy demo --bad-agent` to see an Agent that "
            "ignores keys."
        )
    else:
        lines.append(
            f"Result: {report.duplicates} duplicated submission(s) in history and {found} "
            "finding(s): the Agent ran work twice after a lost answer."
        )
    return "\n".join(lines)
