"""``acp-proxy demo``: the README's first command, run as a user would, good and bad Agents.

Exit statuses: 0 clean, 1 a flaw found (a finding, the Client's verdict), 2 a usage error or
nothing checked. ``demo -- AGENT_CMD`` runs against another Agent: the reference one with a
store (clean), without one (it loses the session when killed), and the official Python SDK's
(not a v2 Agent).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness import PEERS, ROOT, TIMEOUT
from md_blocks import shell_blocks

from proxy.core.records import TraceHeader
from proxy.tools.lab.demo import KEEP_NOTE
from proxy.tools.report import load_traces, summarize

pytestmark = pytest.mark.slow

REFERENCE_AGENT = (sys.executable, "-m", "proxy", "agent")


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    """``acp-proxy demo ARGS``; the Client's answer timeout is the harness's bound (it only
    expires for an Agent that does not answer: the Client follows the proxy's trace)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--answer-timeout", str(TIMEOUT), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
        check=False,
    )


def test_the_demo_shows_retries_and_no_duplicate(tmp_path: Path) -> None:
    """The README's first command: every fault fires, each submission once, zero findings, 0."""
    first_command = shell_blocks(ROOT / "README.md")[0].text.strip()
    assert first_command.endswith("acp-proxy demo")
    done = demo("--keep", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "OK: every submission confirmed, none inserted twice" in out
    assert "0 findings" in out
    assert "every submission is in the session exactly once" in out
    assert KEEP_NOTE not in out  # kept: the files are where the user asked
    # What each step did, whatever the machine's speed: a resend only after a drop.
    rows = [line for line in out.splitlines() if re.match(r" +\d+  '", line)]
    attempts = [row.split("  ")[-1].strip() for row in rows]
    assert attempts == [
        "#3@1 timeout, connection lost, #4@1 answered",
        "#5@1 connection lost, #8@2 answered",
        "#9@2 answered",
    ]
    assert "1 injected copy, 1 answer to copies swallowed" in out
    summary = summarize(load_traces([tmp_path / "trace.jsonl"]))
    fired = (
        {row["rule"] for row in summary["faults"]["by_rule"]}
        if isinstance(summary["faults"], dict) and "by_rule" in summary["faults"]
        else set()
    )
    text_rules = [
        "lose-first-keyed-answer",
        "lose-second-answer",
        "kill-agent-with-the-second-answer",
        "replay-third-prompt",
    ]
    for rule in text_rules:
        assert rule in out
    assert fired <= set(text_rules)
    assert summary["findings"]["count"] == 0


def test_a_kept_directory_used_again_holds_the_last_run_only(tmp_path: Path) -> None:
    """``--keep DIR`` twice: the second run's rules fire again (the first run's ``--state`` is
    not carried over) and the trace holds the second run alone (two proxy runs: the restart)."""
    assert demo("--keep", str(tmp_path)).returncode == 0
    done = demo("--keep", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "faults       4 injected" in done.stdout
    records = load_traces([tmp_path / "trace.jsonl"])
    assert sum(isinstance(entry.record, TraceHeader) for entry in records) == 2


def test_the_bad_agent_demo_shows_the_duplicates_and_exits_1() -> None:
    """--bad-agent: the Agent ignores keys; the Client and the proxy both report the duplicates:
    each of the three steps inserts its prompt twice (a retry after a lost answer, a resend
    after the restart, the replayed copy)."""
    done = demo("--bad-agent")
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "duplicate_insert x3" in out
    assert "FAIL: 3 submissions inserted more than once" in out
    assert "Result (exit 1): The Client saw 3 submissions inserted more than once" in out
    assert "disagree" not in out
    assert out.rstrip().endswith(KEEP_NOTE)  # its files were not kept: how to keep them


def test_another_agent_that_stores_its_sessions_runs_the_demo_clean(tmp_path: Path) -> None:
    """``demo -- AGENT_CMD``: the reference Agent with a store, spawned by the proxy, exits 0."""
    done = demo("--", *REFERENCE_AGENT, "--store", str(tmp_path / "sessions"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "-> your Agent (" in out
    assert "Step 2 kills the Agent" in out
    assert "OK: every submission confirmed, none inserted twice" in out
    assert "every submission is in the session exactly once" in out
    assert list((tmp_path / "sessions").glob("*.json"))  # the Agent given was the one run


def test_an_agent_that_loses_its_sessions_when_killed_cannot_resume() -> None:
    """Without a store the Agent killed in step 2 forgets the session: the Client stops, 1."""
    done = demo("--", *REFERENCE_AGENT)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "Result (exit 1): The Agent lost the session when it was killed (step 2)" in out
    assert "1 prompt went unsubmitted" in out


def test_an_agent_that_is_not_v2_is_one_clear_line_and_exit_2() -> None:
    """The official Python SDK's Agent speaks protocol version 1: nothing to check."""
    agent = [sys.executable, str(PEERS / "sdk_agent.py")]
    done = demo("--", *agent)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot run the demo against {shlex.join(agent)}: not an ACP v2 Agent: "
        "initialize answered protocol version 1 (idempotency keys need 2)"
    )


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    """--bad-agent with an Agent command, or a command that is not an executable."""
    both = demo("--bad-agent", "--", *REFERENCE_AGENT)
    assert both.returncode == 2
    assert "--bad-agent picks the reference Agent" in both.stderr
    missing = demo("--", str(tmp_path / "no-such-agent"))
    assert missing.returncode == 2
    assert "is not an executable" in missing.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    kept = demo("--keep", str(a_file))
    assert (kept.returncode, kept.stdout) == (2, "")
    assert f"error: --keep {a_file}: file exists" in kept.stderr
