"""Delivering one submission: send, wait, resend with the same key until an answer confirms it.

* No answer within ``answer_timeout``, or the followed trace says the proxy lost it: the outcome
  is unknown, so the prompt is sent again with the same key on the same connection; a late
  answer to an earlier attempt still confirms it.
* The connection fails: a new one (the session resumed), then the same key again.
* An error answer: not inserted, the key still unused, so the same key again; ``-32600`` or
  ``-32002`` first initialize and resume again on the same connection (the Agent forgot it).
* After ``max_attempts`` requests the submission stays unconfirmed.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Literal

from proxy.core import acp
from proxy.core.jsonrpc import ErrorCode
from proxy.shell.log import get_logger
from proxy.tools.lab.client.connection import Connection
from proxy.tools.lab.client.report import Attempt, Submission
from proxy.tools.lab.client.session import Action, SessionKeeper
from proxy.tools.lab.trace_follow import TraceFollower
from proxy.tools.rpc import Answer

__all__ = ["RESYNC_CODES", "submit"]

log = get_logger("proxy.client")

RESYNC_CODES = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.RESOURCE_NOT_FOUND})
"""Errors to a prompt meaning the Agent lost the connection's state: initialize and resume again."""


async def submit(keeper: SessionKeeper, submission: Submission) -> None:
    """Deliver one submission: send, wait, resend with the same key until confirmed."""
    options = keeper.options
    assert keeper.report.session_id is not None
    params: dict[str, Any] = {
        "sessionId": keeper.report.session_id,
        "prompt": [{"type": "text", "text": submission.text}],
    }
    if submission.key is not None:  # none: --no-key, a Client breaking the RFD on purpose
        params["idempotencyKey"] = submission.key
    sent: list[tuple[Connection, asyncio.Future[Answer]]] = []
    action: Action | Literal["wait"] = "send"
    while True:
        if action != "wait":
            if len(submission.attempts) >= options.max_attempts:
                log.warning(
                    "giving up on a submission",
                    key=submission.key,
                    attempts=len(submission.attempts),
                )
                return
            connection = await keeper.ready(action)
            attempt = Attempt(keeper.next_id(), connection.number)
            submission.attempts.append(attempt)
            future = await connection.request(attempt.request_id, acp.PROMPT, params)
            future.add_done_callback(functools.partial(settle, submission, attempt))
            sent.append((connection, future))
            log.info(
                "prompt sent",
                key=submission.key,
                id=attempt.request_id,
                attempt=len(submission.attempts),
                connection=connection.number,
            )
        for attempt, (_, future) in zip(submission.attempts, sent, strict=True):
            if future.done():
                settle(submission, attempt, future)
        if submission.confirmed:
            return
        current = keeper.connection
        if current is None or current.lost or sent[-1][1].done():
            # The latest attempt failed: act on it now. Earlier attempts still pending on
            # this connection may yet be answered, and a success among them still counts.
            action = _after_failure(current, submission)
            continue
        waiting = {
            attempt.request_id: future
            for attempt, (connection, future) in zip(submission.attempts, sent, strict=True)
            if connection is current and not future.done()
        }
        if await _answered(waiting, options.answer_timeout, keeper.trace):
            action = "wait"
            continue
        for attempt, (_, future) in zip(submission.attempts, sent, strict=True):
            if not future.done():
                attempt.timed_out = True
        action = "send"


async def _answered(
    waiting: dict[int, asyncio.Future[Answer]], answer_timeout: float, trace: TraceFollower | None
) -> bool:
    """Wait for an answer to one of ``waiting`` (by request id): ``True`` when one came (or the
    connection ended), ``False`` when they are lost: ``answer_timeout`` passed, or the followed
    ``trace`` says every one of them is lost (dropped, or owed by a replaced Agent)."""
    futures: set[asyncio.Future[Any]] = set(waiting.values())
    dropped = None
    if trace is not None:
        dropped = asyncio.get_running_loop().create_task(trace.lost(waiting))
        futures.add(dropped)
    try:
        done, _ = await asyncio.wait(
            futures, timeout=answer_timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        if dropped is not None:
            dropped.cancel()
    if any(future in done for future in waiting.values()):
        return True
    if dropped is not None and dropped in done:
        log.warning(
            "the proxy's trace says the answer is lost; resending with the same key",
            ids=list(waiting),
        )
    else:
        log.warning(
            "no answer in time; the outcome is unknown, resending with the same key",
            ids=list(waiting),
            timeout=answer_timeout,
        )
    return False


def _after_failure(connection: Connection | None, submission: Submission) -> Action:
    """What to do when no attempt on the current connection can still be answered."""
    if connection is None or connection.lost:
        log.warning("connection lost with a prompt pending; reconnecting", key=submission.key)
        return "reconnect"
    last = submission.attempts[-1]
    code = last.error.get("code") if last.error is not None else None
    if code in RESYNC_CODES:
        log.warning(
            "the agent lost this connection's state; initializing and resuming again",
            key=submission.key,
            code=code,
        )
        return "resync"
    log.warning("prompt not inserted; resending with the same key", key=submission.key, code=code)
    return "send"


def settle(submission: Submission, attempt: Attempt, future: asyncio.Future[Answer]) -> None:
    """Record an attempt's answer once (also a late one, after the Client moved on)."""
    if attempt.outcome != "pending" or not future.done() or future.cancelled():
        return
    answer = future.result()
    if answer is None:
        attempt.outcome = "connection_lost"
        return
    result = answer.get("result")
    error = answer.get("error")
    if isinstance(error, dict) or not isinstance(result, dict):
        attempt.outcome = "error"
        error = error if isinstance(error, dict) else {}
        attempt.error = {"code": error.get("code"), "message": error.get("message")}
        return
    attempt.outcome = "answered"
    message_id = result.get("messageId")
    attempt.message_id = message_id if isinstance(message_id, str) else None
    if attempt.message_id is not None and attempt.message_id not in submission.answers:
        submission.answers.append(attempt.message_id)
    if not submission.confirmed:
        submission.confirmed = True
        submission.message_id = attempt.message_id
        log.info(
            "prompt confirmed",
            key=submission.key,
            message_id=attempt.message_id,
            attempts=len(submission.attempts),
        )
    elif attempt.message_id != submission.message_id:
        log.warning(
            "two messageIds answered for one key",
            key=submission.key,
            first=submission.message_id,
            other=attempt.message_id,
        )
