"""What check-agent tells: the results as a table for people, JSON, JUnit XML for CI
dashboards, and the exit status."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from xml.etree import ElementTree

from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.check_agent.verdicts import Status, TraceResult

__all__ = ["exit_status", "render", "to_json", "to_junit"]


def render(results: list[TraceResult], options: CheckOptions) -> str:
    """A table for people."""
    lines = [f"check-agent over {options.transport}: {' '.join(options.agent_argv)}", ""]
    for result in results:
        lines.append(f"{result.trace}  {result.status:<4}  {result.title}")
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
        lines.append("nothing was checked: every trace was skipped (exit status 2)")
    return "\n".join(lines)


def exit_status(results: list[TraceResult]) -> int:
    """1 when a trace failed; else 2 when one could not be checked, or every one was skipped
    (nothing was checked, which CI should not take for a pass); else 0."""
    if any(result.status is Status.FAIL for result in results):
        return 1
    if any(result.status is Status.ERROR for result in results):
        return 2
    return 2 if results and all(result.status is Status.SKIP for result in results) else 0


def to_json(results: list[TraceResult]) -> str:
    """The results as JSON."""
    return json.dumps([asdict(result) for result in results], indent=2)


def to_junit(results: list[TraceResult], options: CheckOptions) -> bytes:
    """JUnit XML, one test case per trace, for CI dashboards."""
    suite = ElementTree.Element(
        "testsuite",
        name=f"acp-check-agent-{options.transport}",
        tests=str(len(results)),
        failures=str(sum(r.status is Status.FAIL for r in results)),
        errors=str(sum(r.status is Status.ERROR for r in results)),
        skipped=str(sum(r.status is Status.SKIP for r in results)),
    )
    for result in results:
        case = ElementTree.SubElement(
            suite, "testcase", classname="acp.idempotency", name=f"{result.trace} {result.title}",
            time=str(result.seconds),
        )  # fmt: skip
        if result.status is Status.FAIL:
            ElementTree.SubElement(case, "failure", message=result.reason)
        elif result.status is Status.ERROR:
            ElementTree.SubElement(case, "error", message=result.reason)
        elif result.status is Status.SKIP:
            ElementTree.SubElement(case, "skipped", message=result.reason)
    xml: bytes = ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True)
    return xml
