"""``acp-proxy demo``: the README's first command, run as a user would, good and bad Agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import TIMEOUT

from proxy.report import load_traces, summarize


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "demo", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
        check=False,
    )


def test_the_demo_shows_retries_and_no_duplicate(tmp_path: Path) -> None:
    """Every built-in fault fires, every submission is confirmed once, zero findings."""
    done = demo("--keep", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "OK: every submission confirmed, none inserted twice" in out
    assert "0 findings" in out
    assert "every submission is in the session exactly once" in out
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


def test_the_bad_agent_demo_shows_the_duplicates() -> None:
    """--bad-agent: the Agent ignores keys, and the duplicates are reported as findings."""
    done = demo("--bad-agent")
    assert done.returncode == 0, done.stderr
    assert "duplicate_insert" in done.stdout
    assert "duplicated submission(s) in history" in done.stdout
