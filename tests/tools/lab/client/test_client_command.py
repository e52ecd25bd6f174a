"""``acp-proxy client``: the report on stdout, the exit status from the verdict."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from client_lab import (
    AGENT,
    CLIENT,
    LOSE_FIRST,
    ledger_duplicates,
    replay_without_the_retry,
    through_proxy,
)
from harness import TIMEOUT

pytestmark = pytest.mark.slow


def test_the_client_command_exits_1_on_a_duplicate(tmp_path: Path) -> None:
    """``acp-proxy client`` prints the duplicate and exits 1, agreeing with the ledger."""
    state = tmp_path / "state.json"
    trace = tmp_path / "trace.jsonl"
    argv = through_proxy(
        "--trace",
        trace,
        "--faults",
        LOSE_FIRST,
        "--faults",
        replay_without_the_retry(tmp_path),
        "--state",
        state,
        agent=(*AGENT, "--no-dedupe"),
    )
    patience = ["--answer-timeout", str(TIMEOUT), "--follow-trace", str(trace)]
    done = subprocess.run(
        [*CLIENT, "-p", "first", "-p", "second", *patience, "--json", "--", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["duplicates"] == 1
    first, second = report["submissions"]
    assert len(first["messageIds"]) == 2
    assert second["messageIds"] == [second["messageId"]]
    assert ledger_duplicates(state) == {first["key"]}


def test_one_misbehaviour_at_a_time() -> None:
    """--no-key, --reuse-key and --key-from-text (for check-client's tests) exclude each other:
    a usage error (exit 2) before anything runs."""
    done = subprocess.run(
        [*CLIENT, "--no-key", "--key-from-text", "-p", "x", "--", *AGENT],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert "--no-key and --key-from-text: give one at most" in done.stderr
