"""The verdicts of the conformance checkers (``check-agent``, ``check-client``), and how they are
told: a table for people, JSON, JUnit XML for CI dashboards, and the exit status.

A check (a trace of ``check-agent``, a scenario of ``check-client``) returns the reason of its
PASS; it raises :class:`Fail` when the peer under test broke the check's rule, :class:`Skip` when
the peer lacks what the check needs, and :class:`Error` when the check itself could not be
carried out (the proxy did not start): not the peer's fault. Each ends as a :class:`Result`.
"""

from __future__ import annotations

import enum
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.etree import ElementTree

from proxy.core.errors import os_cause
from proxy.shell.writable import cannot_write_in
from proxy.tools import cannot_run

__all__ = [
    "Error",
    "Fail",
    "Result",
    "Skip",
    "Status",
    "exit_status",
    "refusal",
    "render",
    "tell",
    "to_json",
    "to_junit",
]


class Status(enum.StrEnum):
    """A check's verdict."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"
    """The check itself could not be carried out (not the fault of the peer under test)."""


@dataclass
class Result:
    """The verdict of one check (``name``: ``T1``, ``C1``)."""

    name: str
    title: str
    status: Status
    reason: str = ""
    seconds: float = 0.0


class Fail(Exception):
    """The peer broke the check's rule (``diagnose``: what the proxy logged explains it)."""

    def __init__(self, reason: str, *, diagnose: bool = False) -> None:
        super().__init__(reason)
        self.diagnose = diagnose


class Skip(Exception):
    """The peer lacks what the check needs; ``every_trace`` when it lacks what every check needs
    (an Agent that is not a v2 one: the checks after it are skipped without running)."""

    def __init__(self, reason: str, *, every_trace: bool = False) -> None:
        super().__init__(reason)
        self.every_trace = every_trace


class Error(Exception):
    """The check could not be carried out (the proxy did not start, a bug of the checker)."""


def render(results: list[Result], heading: str, *, what: str) -> str:
    """A table for people under ``heading``; ``what`` names a check in the last line
    (``trace``, ``scenario``)."""
    lines = [heading, ""]
    for result in results:
        lines.append(f"{result.name}  {result.status:<4}  {result.title}")
        if result.reason:
            lines.append(f"          {result.reason}")
    counts = Counter(result.status for result in results)
    summary = (
        f"{counts[Status.PASS]} passed, {counts[Status.FAIL]} failed, {counts[Status.SKIP]} skipped"
    )
    if counts[Status.ERROR]:
        summary += f", {counts[Status.ERROR]} could not be checked"
    lines += ["", summary]
    if results and counts[Status.SKIP] == len(results):
        lines.append(f"nothing was checked: every {what} was skipped (exit status 2)")
    return "\n".join(lines)


def exit_status(results: list[Result]) -> int:
    """1 when a check failed; else 2 when one could not be checked, or every one was skipped
    (nothing was checked, which CI should not take for a pass); else 0."""
    if any(result.status is Status.FAIL for result in results):
        return 1
    if any(result.status is Status.ERROR for result in results):
        return 2
    return 2 if results and all(result.status is Status.SKIP for result in results) else 0


def to_json(results: list[Result], *, what: str) -> str:
    """The results as JSON: a list of objects, the check's name under ``what`` (``trace``,
    ``scenario``)."""
    rows = []
    for result in results:
        row = asdict(result)
        rows.append({what: row.pop("name"), **row})
    return json.dumps(rows, indent=2)


def to_junit(results: list[Result], suite: str) -> bytes:
    """JUnit XML, one test case per check, in a test suite named ``suite``."""
    element = ElementTree.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(sum(r.status is Status.FAIL for r in results)),
        errors=str(sum(r.status is Status.ERROR for r in results)),
        skipped=str(sum(r.status is Status.SKIP for r in results)),
    )
    for result in results:
        case = ElementTree.SubElement(
            element, "testcase", classname="acp.idempotency", name=f"{result.name} {result.title}",
            time=str(result.seconds),
        )  # fmt: skip
        if result.status is Status.FAIL:
            ElementTree.SubElement(case, "failure", message=result.reason)
        elif result.status is Status.ERROR:
            ElementTree.SubElement(case, "error", message=result.reason)
        elif result.status is Status.SKIP:
            ElementTree.SubElement(case, "skipped", message=result.reason)
    xml: bytes = ElementTree.tostring(element, encoding="utf-8", xml_declaration=True)
    return xml


def refusal(argv: Sequence[str], what: str, junit: Path | None) -> str | None:
    """Why a checker cannot start (told before anything runs, exit status 2): the command of
    the peer under test (``what``: ``Agent``, ``Client``) cannot be run, or no ``junit`` file
    can be written in its folder; None when it can."""
    why = cannot_run(argv, what)
    if why is None and junit is not None:
        if not junit.parent.is_dir():
            why = f"--junit {junit}: its folder {junit.parent} does not exist"
        elif (cause := cannot_write_in(junit.parent)) is not None:
            why = f"--junit {junit}: cannot be written: {cause}"
    return why


def tell(results: list[Result], text: str, junit: Path | None, junit_xml: bytes) -> int:
    """Print ``text`` (the table, or JSON), write ``junit_xml`` to ``junit`` if given; the exit
    status (2, with one line, when the JUnit file cannot be written after all: the file itself
    read-only, the disk full)."""
    sys.stdout.write(text + "\n")
    if junit is not None:
        try:
            junit.write_bytes(junit_xml)
        except OSError as exc:
            sys.stderr.write(f"error: --junit {junit}: cannot be written: {os_cause(exc)}\n")
            return 2
    return exit_status(results)
