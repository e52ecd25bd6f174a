"""The traces T0-T7 (``proxy.tools.check_agent.traces``) against real Agents, on every transport:
the reference Agent passes them all; an Agent that ignores keys, lacks a store, answers prompts
with errors or echoes keys fails or skips the trace concerned, with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from harness import PEERS, SDK_AGENT
from tool_runs import check_agent

pytestmark = pytest.mark.slow

REFERENCE = [sys.executable, "-m", "proxy", "agent", "--turn-ms", "300"]
BROKEN = [sys.executable, str(PEERS / "broken_v2_agent.py")]


@pytest.mark.parametrize("transport", ["stdio", "ws", "http"])
def test_the_reference_agent_passes_every_trace(transport: str, tmp_path: Path) -> None:
    """T0-T7 all PASS against the reference Agent with a store, on each transport."""
    done = check_agent(
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
    """--no-dedupe: T1 fails with the reason; the exit status is 1 (--trace: the older name of
    --only)."""
    done = check_agent("--only", "T1", "--trace", "T6", "--", *REFERENCE, "--no-dedupe")
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
    done = check_agent("--only", "T3", "--", *REFERENCE)
    assert done.returncode == 2
    assert "nothing was checked: every trace was skipped" in done.stdout
    assert "T3  SKIP" in done.stdout
    assert "does not keep the session" in done.stdout


@pytest.mark.parametrize(("mode", "said"), [("error", "-32603"), ("string-error", "nope")])
def test_prompts_answered_with_errors_are_named_not_blamed_on_the_proxy(
    mode: str, said: str
) -> None:
    """A keyed prompt answered with an error (well-formed or not) fails with that error."""
    done = check_agent("--only", "T1", "--", *BROKEN, mode)
    assert f"the keyed prompt was answered with error {said}, no messageId" in done.stdout
    assert "did not lose" not in done.stdout
    assert "Error:" not in done.stdout  # no checker exception shown as the verdict
    assert done.returncode == 1


def test_an_echoed_key_fails_and_only_the_keys_sent_are_looked_for() -> None:
    """Keys are fresh UUIDs, so an id that happens to contain a short label is no echo; an Agent
    that sends the key back fails the trace, naming it."""
    done = check_agent("--json", "--only", "T1", "--", *BROKEN, "echo-key")
    (result,) = json.loads(done.stdout)
    assert result["status"] == "FAIL"
    assert result["reason"].startswith("the Agent echoed keys: ['K1-")
    assert done.returncode == 1


def test_an_agent_that_is_not_a_v2_one_is_told_once_and_not_checked_again() -> None:
    """The SDK's v1 Agent: the first trace finds what every trace needs missing; the others are
    skipped with the same reason without starting it again (exit 2: nothing was checked)."""
    done = check_agent("--json", "--", *SDK_AGENT)
    assert done.returncode == 2, done.stderr
    results = json.loads(done.stdout)
    reasons = [result["reason"] for result in results]
    assert {result["status"] for result in results} == {"SKIP"}
    assert reasons[0] == "the Agent speaks protocol version 1, not 2"
    assert reasons[1:] == [f"{reasons[0]} (not run)"] * 7


def test_an_agent_that_echoes_the_version_without_sessions_is_shown_its_answer() -> None:
    """A v1 Agent that echoes the version it is asked for claims 2 but has no v2 sessions: the
    reason says so and quotes its answer, so the user does not go looking for a capability."""
    done = check_agent("--json", "--only", "T0", "--", *BROKEN, "echo-version")
    assert done.returncode == 2, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["status"] == "SKIP"
    assert result["reason"] == (
        "the Agent does not advertise capabilities.session (v2's sessions; a v1 Agent that "
        'echoes the protocol version does not): its initialize answer was {"protocolVersion":2}'
    )
