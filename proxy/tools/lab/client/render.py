"""The reference Client's report for people: one row per submission, then the verdict."""

from __future__ import annotations

from proxy.tools.lab.client.report import Attempt, ClientReport

__all__ = ["render"]

LISTED_IDS = 5
"""The messageIds of a duplicated submission listed by :func:`render` (the JSON has them all)."""


def render(report: ClientReport) -> str:
    """The report for people: one row per submission, then the verdict; only the verdict when
    the run stopped before any submission (an Agent of ACP v1, one that cannot be reached)."""
    if report.error is not None and not report.submissions:
        return f"ERROR: stopped: {report.error}; nothing was submitted"
    plural = "" if report.reconnects == 1 else "s"
    lines = [
        f"session {report.session_id or '-'} over {report.transport}: "
        f"{report.connections} connection(s), {report.reconnects} reconnect{plural}, "
        f"{report.resyncs} resync(s)",
        f"  {'#':>2}  {'prompt':<24}  {'key':<8}  {'messageId':<16}  {'inserted':<8}  "
        f"{'in history':<10}  attempts (#id@connection)",
    ]
    for number, submission in enumerate(report.submissions, start=1):
        inserted = len(submission.message_ids)
        times = f"{inserted} time" + ("" if inserted == 1 else "s")
        history = "-" if report.history is None else str(len(submission.history_ids))
        message = submission.message_id or ("(no id)" if submission.confirmed else "unconfirmed")
        attempts = ", ".join(_attempt_text(attempt) for attempt in submission.attempts)
        key = (submission.key or "-")[:8]  # "-": no key (--no-key)
        lines.append(
            f"  {number:>2}  {_cell(repr(submission.text), 24):<24}  {key:<8}  "
            f"{_cell(message, 16):<16}  {times:<8}  {history:<10}  {attempts}"
        )
    seen = report.user_message_ids()
    in_history = (
        "history not verified" if report.history is None else f"{len(report.history)} in history"
    )
    lines.append(
        f"user messages: {len(seen)} seen (live and replayed), {in_history}; "
        f"duplicates: {report.duplicates}"
    )
    twice = [(n, s) for n, s in enumerate(report.submissions, start=1) if s.inserted_twice]
    for number, submission in twice:
        ids = [_cell(message_id, 48) for message_id in submission.message_ids[:LISTED_IDS]]
        more = len(submission.message_ids) - len(ids)
        lines.append(
            f"  #{number} inserted {len(submission.message_ids)} times: {', '.join(ids)}"
            + (f" and {more} more" if more else "")
        )
    if report.history is not None:
        missing = [
            str(number)
            for number, submission in enumerate(report.submissions, start=1)
            if submission.confirmed and not submission.history_ids
        ]
        if missing:
            lines.append(
                f"note: confirmed but absent from the final replay: #{', #'.join(missing)} "
                "(the Agent's replay of the session is incomplete)"
            )
    unconfirmed = sum(1 for submission in report.submissions if not submission.confirmed)
    if report.ok:
        lines.append("OK: every submission confirmed, none inserted twice")
    else:
        problems = []
        if twice:
            problems.append(
                f"{len(twice)} submission{'' if len(twice) == 1 else 's'} inserted more than once"
            )
        if unconfirmed:
            problems.append(f"{unconfirmed} unconfirmed submission(s)")
        if report.error is not None:
            problems.append(f"stopped: {report.error}")
        if report.not_submitted:
            problems.append(f"{len(report.not_submitted)} prompt(s) not submitted")
        verdict = "ERROR" if report.exit_status == 2 else "FAIL"  # 2: nothing was checked
        lines.append(f"{verdict}: " + "; ".join(problems))
    return "\n".join(lines)


def _attempt_text(attempt: Attempt) -> str:
    outcome = {
        "pending": "no answer",
        "answered": "answered",
        "error": f"error {(attempt.error or {}).get('code')}",
        "connection_lost": "connection lost",
    }[attempt.outcome]
    if attempt.timed_out:
        outcome = f"timeout, {outcome}" if attempt.outcome != "pending" else "timeout"
    return f"#{attempt.request_id}@{attempt.connection} {outcome}"


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
