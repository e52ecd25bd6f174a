"""The reference Client's hold on its session: connecting, ``initialize``, ``session/new``, and
after a failure connecting again (respawning a stdio command) or initializing again on the same
connection, each time resuming the session with a full replay; and at the end the replay the
verdict is judged on.

Every user message update of the session, live or replayed, goes to the report as it arrives.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Literal

from proxy import __version__
from proxy.core import acp
from proxy.core.jsonrpc import ErrorCode
from proxy.shell.log import get_logger, shorten
from proxy.tools.lab.client.connection import Connection, Failure, open_endpoint
from proxy.tools.lab.client.options import ClientOptions
from proxy.tools.lab.client.report import ClientReport, Resume, SeenMessage, Stop
from proxy.tools.lab.trace_follow import TraceFollower
from proxy.tools.rpc import Message

__all__ = ["Action", "Fatal", "SessionKeeper"]

log = get_logger("proxy.client")

PROTOCOL_VERSION = 2
MAX_BACKOFF = 2.0
"""Seconds between two tries to reconnect, at most (0.1 s, doubling)."""

Action = Literal["send", "resync", "reconnect"]
"""What a submission needs before its next attempt: nothing, the session resumed again on this
connection, or a new connection."""


class Fatal(Exception):
    """The run cannot go on (the session is gone, the Agent is not a v2 Agent, unreachable)."""

    def __init__(self, message: str, stop: Stop) -> None:
        super().__init__(message)
        self.stop: Stop = stop


class SessionKeeper:
    """The Client's connection and session for one run; what it sees goes to ``report``;
    ``trace``, the followed trace of the proxy in front of the Agent (``follow_trace``)."""

    def __init__(
        self, options: ClientOptions, report: ClientReport, trace: TraceFollower | None = None
    ) -> None:
        self.options = options
        self.report = report
        self.trace = trace
        self.connection: Connection | None = None
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        """A request id, unique across the run's connections."""
        return next(self._ids)

    # -- connections ---------------------------------------------------------------------------

    async def _connect(self) -> Connection:
        await self.drop()
        number = self.report.connections + 1
        endpoint = await open_endpoint(self.options)
        self.report.connections = number
        self.connection = Connection(number, endpoint, self._on_update)
        log.info("connected", connection=number, transport=self.options.transport)
        return self.connection

    async def drop(self) -> None:
        """Close the current connection, if any."""
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.close(self.options.grace)

    async def _call(self, connection: Connection, method: str, params: dict[str, Any]) -> Message:
        return await connection.call(self.next_id(), method, params, self.options.setup_timeout)

    async def _initialize(self, connection: Connection) -> None:
        answer = await self._call(
            connection,
            acp.INITIALIZE,
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "info": {"name": "acp-proxy-reference-client", "version": __version__},
            },
        )
        result = _result_of(answer, acp.INITIALIZE)
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            answered = shorten(repr(version), 40)
            raise Fatal(
                f"not an ACP v2 Agent: initialize answered protocol version {answered} "
                f"(idempotency keys need {PROTOCOL_VERSION})",
                "not_v2",
            )
        capabilities = result.get("capabilities")
        if not isinstance(capabilities, dict) or capabilities.get("session") is None:
            raise Fatal(
                "not an ACP v2 Agent: its initialize answer has no capabilities.session", "not_v2"
            )

    async def _new_session(self, connection: Connection) -> None:
        answer = await self._call(
            connection, acp.NEW_SESSION, {"cwd": self.options.cwd, "mcpServers": []}
        )
        session_id = _result_of(answer, acp.NEW_SESSION).get("sessionId")
        if not isinstance(session_id, str):
            raise Fatal(f"session/new answered no sessionId: {shorten(answer)}", "unreachable")
        self.report.session_id = session_id
        log.info("session created", session=session_id)

    async def _resume(self, connection: Connection, *, final: bool = False) -> Resume:
        assert self.report.session_id is not None
        resume = Resume(connection.number, final=final)
        connection.resume = resume
        connection.replays += 1
        try:
            answer = await self._call(
                connection,
                acp.RESUME_SESSION,
                {
                    "sessionId": self.report.session_id,
                    "cwd": self.options.cwd,
                    "mcpServers": [],
                    "replayFrom": {"type": "start"},
                },
            )
        finally:
            connection.resume = None
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") == ErrorCode.RESOURCE_NOT_FOUND:
            raise Fatal(
                f"the agent no longer knows session {self.report.session_id}", "session_lost"
            )
        _result_of(answer, acp.RESUME_SESSION)
        self.report.resumes.append(resume)
        log.info(
            "session resumed",
            connection=connection.number,
            replayed_user_messages=len(resume.user_message_ids),
            state=resume.state,
        )
        return resume

    async def open(self) -> None:
        """The first connection: initialize and a new session."""
        try:
            connection = await self._connect()
            await self._initialize(connection)
            await self._new_session(connection)
        except Failure as exc:
            raise Fatal(str(exc), "unreachable") from exc

    async def _reconnect(self, *, final: bool = False) -> Connection:
        """Connect again (respawn), initialize and resume the session with a full replay."""
        last = ""
        for attempt in range(self.options.max_attempts):
            if attempt:
                await asyncio.sleep(min(MAX_BACKOFF, 0.1 * 2 ** (attempt - 1)))
            try:
                connection = await self._connect()
                await self._initialize(connection)
                await self._resume(connection, final=final)
            except Failure as exc:
                last = str(exc)
                log.warning("reconnecting failed", error=last, attempt=attempt + 1)
                continue
            self.report.reconnects += 1
            return connection
        raise Fatal(
            f"could not reconnect in {self.options.max_attempts} tries: {last}", "reconnect_failed"
        )

    async def _resync(self, connection: Connection) -> Connection:
        """Initialize and resume again on the same connection (its Agent forgot it)."""
        try:
            await self._initialize(connection)
            await self._resume(connection)
        except Failure as exc:
            log.warning("resynchronising failed; reconnecting", error=str(exc))
            return await self._reconnect()
        self.report.resyncs += 1
        return connection

    async def ready(self, action: Action) -> Connection:
        """A connection to send the next attempt on, after doing what ``action`` says."""
        connection = self.connection
        if action == "reconnect" or connection is None or connection.lost:
            return await self._reconnect()
        if action == "resync":
            return await self._resync(connection)
        return connection

    async def verify(self) -> None:
        """Resume once more with a full replay: the history the report is judged on."""
        await self._settle()
        for _ in range(self.options.max_attempts):
            connection = self.connection
            if connection is None or connection.lost:
                await self._reconnect(final=True)
                resume = self.report.resumes[-1]
            else:
                try:
                    resume = await self._resume(connection, final=True)
                except Failure as exc:
                    log.warning("verification failed; reconnecting", error=str(exc))
                    await self.drop()
                    continue
            self.report.history = list(resume.user_message_ids)
            return

    async def _settle(self) -> None:
        """With a followed trace: wait (``answer_timeout`` at most) until the proxy relayed
        every answer this Client got and has nothing held for the Agent or outstanding there."""
        if self.trace is None:
            return
        answered = [
            attempt.request_id
            for submission in self.report.submissions
            for attempt in submission.attempts
            if attempt.outcome == "answered"
        ]
        try:
            await asyncio.wait_for(self.trace.quiet(answered), self.options.answer_timeout)
        except TimeoutError:
            log.warning(
                "the proxy still has requests at the agent; verifying anyway",
                timeout=self.options.answer_timeout,
            )

    # -- what the session shows ----------------------------------------------------------------

    def _on_update(self, connection: Connection, params: dict[str, Any]) -> None:
        if params.get("sessionId") != self.report.session_id or self.report.session_id is None:
            return
        update = params.get("update")
        if not isinstance(update, dict):
            return
        kind = update.get("sessionUpdate")
        resume = connection.resume if connection.replaying else None
        if kind == "state_update" and resume is not None:
            state = update.get("state")
            resume.state = state if isinstance(state, str) else None
        if kind not in ("user_message", "user_message_chunk"):
            return
        message_id = update.get("messageId")
        if not isinstance(message_id, str):
            return
        latest = len(self.report.submissions) - 1 if self.report.submissions else None
        seen = SeenMessage(
            message_id,
            _text_of(update.get("content")),
            connection.number,
            connection.replays if resume is not None else 0,
            latest,
            chunk=kind == "user_message_chunk",
        )
        self.report.user_messages.append(seen)
        if resume is not None and message_id not in resume.user_message_ids:
            resume.user_message_ids.append(message_id)


def _result_of(answer: Message, method: str) -> dict[str, Any]:
    """The result object of an answer; an error answer is a :class:`Failure`."""
    result = answer.get("result")
    if not isinstance(result, dict):
        raise Failure(f"{method} failed: {shorten(answer.get('error', answer))}")
    return result


def _text_of(content: Any) -> str:
    """The text of a content block or a list of them."""
    blocks = content if isinstance(content, list) else [content]
    return "".join(
        block["text"]
        for block in blocks
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )
