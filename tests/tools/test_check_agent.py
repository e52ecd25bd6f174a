"""``acp-proxy check-agent``: the conformance traces T0-T7 against real Agents, on every transport."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from harness import PEERS, TIMEOUT

pytestmark = pytest.mark.slow

REFERENCE = [sys.executable, "-m", "proxy", "agent", "--turn-ms", "300"]
SDK_AGENT = [sys.executable, str(PEERS / "sdk_agent.py")]


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-agent", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
        check=False,
    )


@pytest.mark.parametrize("transport", ["stdio", "ws", "http"])
def test_the_reference_agent_passes_every_trace(transport: str, tmp_path: Path) -> None:
    """T0-T7 all PASS against the reference Agent with a store, on each transport."""
    done = check(
        "--transport",
        transport,
        "--json",
        "--junit",
        str(tmp_path / "junit.xml"),
        "--",
        *REFERENCE,
        "--store",
        str(tmp_path / "store"),
    )
    results = json.loads(done.stdout)
    assert [(r["trace"], r["status"]) for r in results] == [(f"T{n}", "PASS") for n in range(8)], (
        done.stdout
    )
    assert done.returncode == 0
    titles = {r["trace"]: r["title"] for r in results}
    assert titles["T2"].endswith("(over ws: a reconnect needs a listener)") == (
        transport == "stdio"
    )
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("8", "0", "0")


def test_an_agent_that_ignores_keys_fails_t1(tmp_path: Path) -> None:
    """--no-dedupe: T1 fails with the reason; the exit status is 1."""
    done = check("--trace", "T1", "--trace", "T6", "--", *REFERENCE, "--no-dedupe")
    assert done.returncode == 1
    assert "T1  FAIL" in done.stdout
    assert "2 user messages for one submission" in done.stdout
    assert "T6  PASS" in done.stdout
    assert "1 passed, 1 failed, 0 skipped" in done.stdout


def test_without_a_store_a_restarted_agent_is_skipped_or_failed_never_crashed(
    tmp_path: Path,
) -> None:
    """T3 needs stored sessions: an in-memory Agent gets a SKIP naming what is missing; a run in
    which nothing was checked exits 2, so that CI does not take it for a pass."""
    done = check("--trace", "T3", "--", *REFERENCE)
    assert done.returncode == 2
    assert "nothing was checked: every trace was skipped" in done.stdout
    assert "T3  SKIP" in done.stdout
    assert "does not keep the session" in done.stdout


def test_an_agent_that_does_not_speak_v2_is_judged_not_crashed() -> None:
    """The official SDK's v1 Agent: every trace has a verdict, none crashes the checker."""
    done = check("--json", "--", *SDK_AGENT)
    results = json.loads(done.stdout)
    assert len(results) == 8
    assert {r["status"] for r in results} <= {"SKIP", "FAIL"}
    assert all(r["reason"] for r in results)
    assert "Traceback" not in done.stderr


def test_unknown_traces_are_a_usage_error() -> None:
    """Only T0-T7 exist."""
    done = check("--trace", "T9", "--", *REFERENCE)
    assert done.returncode == 2
    assert "unknown traces" in done.stderr


BROKEN = [sys.executable, str(PEERS / "broken_v2_agent.py")]


def test_an_agent_that_starts_slowly_is_given_time_to_start() -> None:
    """A start longer than --answer-timeout is no FAIL: initialize gets a start-up allowance.

    The other answers come in milliseconds; the answer timeout leaves them seconds, so that a
    busy machine never makes one late, and the Agent sleeps longer than that before it reads."""
    patience = TIMEOUT / 6
    start = str(patience + 1)
    done = check("--answer-timeout", str(patience), "--trace", "T6", "--", *BROKEN, "ids", start)
    assert "T6  PASS" in done.stdout, done.stdout
    assert done.returncode == 0


@pytest.mark.parametrize(("mode", "said"), [("error", "-32603"), ("string-error", "nope")])
def test_prompts_answered_with_errors_are_named_not_blamed_on_the_proxy(
    mode: str, said: str
) -> None:
    """A keyed prompt answered with an error (well-formed or not) fails with that error."""
    done = check("--trace", "T1", "--", *BROKEN, mode)
    assert f"the keyed prompt was answered with error {said}, no messageId" in done.stdout
    assert "did not lose" not in done.stdout
    assert "Error:" not in done.stdout  # no checker exception shown as the verdict
    assert done.returncode == 1


def test_an_echoed_key_fails_and_only_the_keys_sent_are_looked_for() -> None:
    """Keys are fresh UUIDs, so an id that happens to contain a short label is no echo; an Agent
    that sends the key back fails the trace, naming it."""
    done = check("--json", "--trace", "T1", "--", *BROKEN, "echo-key")
    (result,) = json.loads(done.stdout)
    assert result["status"] == "FAIL"
    assert result["reason"].startswith("the Agent echoed keys: ['K1-")
    assert done.returncode == 1


def test_an_agent_that_cannot_run_is_refused_before_any_trace() -> None:
    """A command that is not there is refused before any trace (exit 2)."""
    missing = check("--", "/nonexistent/agent")
    assert missing.returncode == 2
    assert "cannot run the Agent: '/nonexistent/agent' is not an executable" in missing.stderr


@pytest.mark.parametrize(
    ("transport", "lost"),
    [
        ("stdio", "no answer to initialize: the connection closed"),
        ("ws", "no answer to initialize: the connection closed"),
        # The HTTP proxy answers the initialize POST itself when its Agent is gone.
        ("http", "initialize was answered with error -32603"),
    ],
)
def test_an_agent_that_exits_at_once_is_explained(transport: str, lost: str) -> None:
    """An Agent that exits at once fails with what the proxy saw, its exit status, on every
    transport (a listening proxy's log is read once it has logged the link's end)."""
    exiting = check(
        "--transport", transport, "--trace", "T0", "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert lost in exiting.stdout, exiting.stdout
    assert "the proxy says: the agent exited (3)" in exiting.stdout, exiting.stdout
    assert exiting.returncode == 1
    assert exiting.stderr == ""  # the proxies' log lines stay out of the checker's output


def test_initialize_refused_is_a_skip_and_failing_is_a_fail_each_naming_the_error() -> None:
    """initialize answered -32602 (a version the Agent does not take) skips, naming the error;
    -32603 (the Agent failing as it starts) fails."""
    refused = check("--trace", "T1", "--", *BROKEN, "init-refuse")
    assert "initialize was refused with error -32602 (unsupported protocol version)" in (
        refused.stdout
    )
    assert refused.returncode == 2  # every trace skipped: nothing was checked
    failing = check("--trace", "T1", "--", *BROKEN, "init-crash")
    assert "initialize was answered with error -32603 (boom)" in failing.stdout
    assert failing.returncode == 1
