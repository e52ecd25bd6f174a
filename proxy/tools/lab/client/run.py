"""One run of the reference Client: open a session, deliver every prompt with a key of its own,
verify the history, and judge the report."""

from __future__ import annotations

import contextlib
import hashlib
import uuid

from proxy.shell.log import get_logger
from proxy.tools.lab.client.options import ClientOptions, KeyMode
from proxy.tools.lab.client.report import ClientReport, Submission, judge
from proxy.tools.lab.client.retry import submit
from proxy.tools.lab.client.session import Fatal, SessionKeeper
from proxy.tools.lab.trace_follow import TraceFollower

__all__ = ["make_key", "run_client"]

log = get_logger("proxy.client")


def make_key(mode: KeyMode, text: str, earlier: list[Submission]) -> str | None:
    """The key of a new submission of ``text``: a UUID4 (``fresh``, the RFD); or, breaking the
    RFD on purpose: none, the first submission's key again (``reuse``), a digest of the text
    (``from_text``)."""
    if mode == "none":
        return None
    if mode == "reuse" and earlier:
        return earlier[0].key
    if mode == "from_text":
        return hashlib.sha256(text.encode()).hexdigest()[:32]
    return str(uuid.uuid4())


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
            submission = Submission(text, make_key(options.keys, text, report.submissions))
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
