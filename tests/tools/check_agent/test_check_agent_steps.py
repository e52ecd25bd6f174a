"""The steps the traces share (``proxy.tools.check_agent.steps``): opening a v2 session, with
time for a slow start, and what an Agent that is not v2, or refuses or fails initialize, gets."""

from __future__ import annotations

import json
import sys

import pytest
from harness import PEERS, TIMEOUT
from tool_runs import check_agent

pytestmark = pytest.mark.slow

SDK_AGENT = [sys.executable, str(PEERS / "sdk_agent.py")]
BROKEN = [sys.executable, str(PEERS / "broken_v2_agent.py")]


def test_an_agent_that_does_not_speak_v2_is_judged_not_crashed() -> None:
    """The official SDK's v1 Agent: every trace has a verdict, none crashes the checker."""
    done = check_agent("--json", "--", *SDK_AGENT)
    results = json.loads(done.stdout)
    assert len(results) == 8
    assert {r["status"] for r in results} <= {"SKIP", "FAIL"}
    assert all(r["reason"] for r in results)
    assert "Traceback" not in done.stderr


def test_an_agent_that_starts_slowly_is_given_time_to_start() -> None:
    """A start longer than --answer-timeout is no FAIL: initialize gets a start-up allowance.

    The other answers come in milliseconds; the answer timeout leaves them seconds, so that a
    busy machine never makes one late, and the Agent sleeps longer than that before it reads."""
    patience = TIMEOUT / 6
    start = str(patience + 1)
    done = check_agent(
        "--answer-timeout", str(patience), "--only", "T6", "--", *BROKEN, "ids", start
    )
    assert "T6  PASS" in done.stdout, done.stdout
    assert done.returncode == 0


def test_initialize_refused_is_a_skip_and_failing_is_a_fail_each_naming_the_error() -> None:
    """initialize answered -32602 (a version the Agent does not take) skips, naming the error;
    -32603 (the Agent failing as it starts) fails."""
    refused = check_agent("--only", "T1", "--", *BROKEN, "init-refuse")
    assert "initialize was refused with error -32602 (unsupported protocol version)" in (
        refused.stdout
    )
    assert refused.returncode == 2  # every trace skipped: nothing was checked
    failing = check_agent("--only", "T1", "--", *BROKEN, "init-crash")
    assert "initialize was answered with error -32603 (boom)" in failing.stdout
    assert failing.returncode == 1
