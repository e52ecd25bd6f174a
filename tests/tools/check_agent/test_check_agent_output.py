"""What check-agent tells (``proxy.tools.check_agent.output``): the table, JSON, JUnit XML and the
exit status, from results made by hand."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest

from proxy.tools.check_agent import (
    CheckOptions,
    Result,
    Status,
    exit_status,
    render,
    to_json,
    to_junit,
)

OPTIONS = CheckOptions(agent_argv=("my-agent", "--flag"), transport="ws")


def results(*statuses: str) -> list[Result]:
    return [
        Result(f"T{n}", f"title {n}", Status(name), f"reason {n}" if name != "PASS" else "", 0.5)
        for n, name in enumerate(statuses)
    ]


@pytest.mark.parametrize(
    ("statuses", "status"),
    [
        (("PASS", "SKIP"), 0),
        ((), 0),
        (("PASS", "FAIL", "ERROR"), 1),
        (("PASS", "ERROR"), 2),
        (("SKIP", "SKIP"), 2),
    ],
)
def test_the_exit_status(statuses: tuple[str, ...], status: int) -> None:
    """1 on a FAIL; else 2 when a trace could not be checked or every one was skipped; else 0."""
    assert exit_status(results(*statuses)) == status


def test_the_table_names_the_agent_each_trace_and_the_counts() -> None:
    """One line per trace, its reason below it, then the counts."""
    text = render(results("PASS", "FAIL", "SKIP", "ERROR"), OPTIONS)
    lines = text.splitlines()
    assert lines[0] == "check-agent over ws: my-agent --flag"
    assert "T0  PASS  title 0" in lines
    assert "T1  FAIL  title 1" in lines
    assert "          reason 1" in lines
    assert lines[-1] == "1 passed, 1 failed, 1 skipped, 1 could not be checked"


def test_a_run_that_skipped_everything_says_nothing_was_checked() -> None:
    """Every trace skipped: the table says so, with its exit status."""
    text = render(results("SKIP", "SKIP"), OPTIONS)
    assert text.splitlines()[-1] == "nothing was checked: every trace was skipped (exit status 2)"


def test_json_has_every_field_of_every_result() -> None:
    """A list of objects: trace, title, status, reason, seconds."""
    assert json.loads(to_json(results("PASS", "FAIL"))) == [
        {"trace": "T0", "title": "title 0", "status": "PASS", "reason": "", "seconds": 0.5},
        {"trace": "T1", "title": "title 1", "status": "FAIL", "reason": "reason 1", "seconds": 0.5},
    ]


def test_junit_has_one_test_case_per_trace() -> None:
    """Counts on the suite; a failure, an error or a skipped element with the reason."""
    suite = ElementTree.fromstring(to_junit(results("PASS", "FAIL", "SKIP", "ERROR"), OPTIONS))
    assert suite.tag == "testsuite"
    assert suite.get("name") == "acp-check-agent-ws"
    counts = [suite.get(name) for name in ("tests", "failures", "errors", "skipped")]
    assert counts == ["4", "1", "1", "1"]
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == [f"T{n} title {n}" for n in range(4)]
    assert [[(child.tag, child.get("message")) for child in case] for case in cases] == [
        [],
        [("failure", "reason 1")],
        [("skipped", "reason 2")],
        [("error", "reason 3")],
    ]
