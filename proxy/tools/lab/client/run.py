"""One run of the reference Client: open a session, deliver every prompt with a key of its own,
verify the history, and judge the report."""

from __future__ import annotations

import contextlib
import uuid

from proxy.shell.log import get_logger
from proxy.tools.lab.client.options import ClientOptions
from proxy.tools.lab.client.report import ClientReport, Submission, judge
from proxy.tools.lab.client.retry import submit
from proxy.tools.lab.client.session import Fatal, SessionKeeper
from proxy.tools.lab.trace_follow import TraceFollower

__all__ = ["run_client"]

log = get_logger("proxy.client")


async def run_client(options: ClientOptions) -> ClientReport:
    """Connect, open a session, deliver every prompt with its own key, and report.

    Never raises for trouble with the Agent or the connection: the report's ``error`` says why
    the run stopped early, and unconfirmed submissions stay unconfirmed.
    """
    async with contextlib.AsyncExitStack() as stack:
        trace = None
        if options.follow_trace is not None:
            trace = await stack.enter_async_context(TraceFollower(options.follow_trace))
        return await _run(options, SessionKeeper(options, ClientReport(options.transport), trace))


async def _run(options: ClientOptions, keeper: SessionKeeper) -> ClientReport:
    report = keeper.report
    try:
        await keeper.open()
        for number, text in enumerate(options.prompts):
            report.not_submitted = list(options.prompts[number + 1 :])
            submission = Submission(text, str(uuid.uuid4()))
            report.submissions.append(submission)
            await submit(keeper, submission)
        if options.verify:
            await keeper.verify()
    except Fatal as exc:
        if not report.submissions:
            report.not_submitted = list(options.prompts)
        report.error = str(exc)
        report.stop = exc.stop
        if report.submissions:  # else the report is that one line
            log.error("the client stopped", error=str(exc))
    finally:
        await keeper.drop()
    judge(report)
    return report
