"""``acp-proxy client``: a small ACP v2 Client that retries prompts safely with idempotency keys.

It is the Client side of the retry lab (DESIGN 8, issue 6), written to the idempotency RFD:

* One key per submission: a UUID4 made when the input is submitted, not when a request is
  written, and kept with the pending input until an answer confirms it. Every attempt is its own
  JSON-RPC request with a new ``id`` and the same ``idempotencyKey``.
* No answer within ``answer_timeout``: the outcome is unknown, so the prompt is sent again with
  the same key on the same connection (trace T1); a late answer to an earlier attempt still
  confirms the submission. With ``follow_trace`` (the trace of the proxy in front of the Agent,
  :mod:`proxy.trace_follow`) an answer the proxy lost times out at once, and the timer is left
  for answers that are really late: what a run shows does not depend on the machine's
  speed (``acp-proxy demo`` runs the Client so).
* The connection fails (stdout EOF when the spawned command exits, the WebSocket closes, the HTTP
  connection stream ends): the Client connects again (respawning a stdio command), sends
  ``initialize`` and ``session/resume`` with ``replayFrom: {"type": "start"}``, collects the
  replayed user messages, and resends the pending prompt with the same key (traces T2, T3).
* An error answer means the message was not inserted and the key is still unused: the prompt is
  resent with the same key, up to ``max_attempts``. ``-32600`` or ``-32002`` mean the Agent no
  longer knows this connection or session (an Agent restarted behind a proxy that kept the pipe):
  the Client first initializes and resumes again on the same connection.
* At the end the session is resumed once more with a full replay (the history the report
  shows); with ``follow_trace``, once the proxy has nothing held for the Agent or outstanding
  there (a copy it injected has been answered), so that history is final. The verdict counts
  every ``user_message`` seen for a submission: live during a turn and replayed by any
  ``session/resume``, on every connection, and the ``messageId`` s its attempts were answered
  with. A submission with more than one distinct ``messageId`` was
  inserted more than once (the RFD's invariant is one), as the proxy's ledger judges
  ``duplicate_insert``: an Agent's replay that leaves a copy out hides nothing.

:func:`run_client` returns a :class:`ClientReport` (``to_json()`` for machines, :func:`render`
for people, :attr:`ClientReport.exit_status` for the command). Logs go to stderr through
:mod:`proxy.shell.log`; nothing is printed but by :func:`client_main`, the command's entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from proxy import __version__
from proxy.core.errors import OptionError
from proxy.core.framing import Oversized
from proxy.core.jsonrpc import ErrorCode
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger, shorten
from proxy.shell.transports.http_upstream import connect_http
from proxy.shell.transports.stdio import spawn_agent
from proxy.shell.transports.websocket import connect_ws
from proxy.tools.lab.trace_follow import TraceFollower

__all__ = [
    "Attempt",
    "ClientOptions",
    "ClientReport",
    "Resume",
    "SeenMessage",
    "Submission",
    "client_main",
    "judge",
    "render",
    "run_client",
]

log = get_logger("proxy.client")

PROTOCOL_VERSION = 2
RESYNC_CODES = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.RESOURCE_NOT_FOUND})
"""Errors to a prompt meaning the Agent lost the connection's state: initialize and resume again."""
MAX_BACKOFF = 2.0
"""Seconds between two tries to reconnect, at most (0.1 s, doubling)."""
LISTED_IDS = 5
"""The messageIds of a duplicated submission listed by :func:`render` (the JSON has them all)."""

Outcome = Literal["pending", "answered", "error", "connection_lost"]
Stop = Literal["unreachable", "not_v2", "session_lost", "reconnect_failed"]
"""Why a run stopped early: the Agent could not be started or reached (connect, ``initialize``,
``session/new``), is not a v2 Agent, no longer knows the session, or could not be reached again."""
UNCHECKED: frozenset[Stop] = frozenset({"unreachable", "not_v2"})
"""Stops that leave nothing checked: the run never had a v2 session to submit to."""
Answer = dict[str, Any] | None
"""A response or error object, or ``None`` when the connection ended before it came."""


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """What the reference Client does, and to which Agent.

    Exactly one of ``agent_argv`` (a command spawned over stdio, typically ``acp-proxy run ...
    -- AGENT``; respawned after it exits) and ``connect`` (a ``ws://`` or ``http://`` URL;
    connected again after the connection ends) is given.
    """

    agent_argv: tuple[str, ...] = ()
    connect: str | None = None
    prompts: tuple[str, ...] = ()
    answer_timeout: float = 10.0
    """Seconds to wait for a prompt's answer before its outcome counts as unknown (then resent)."""
    max_attempts: int = 5
    """Requests per submission (and tries per reconnection) before giving up."""
    cwd: str = "/"
    setup_timeout: float = 30.0
    """Seconds to wait for an answer to ``initialize``, ``session/new`` or ``session/resume``
    (a command just spawned, a Python Agent behind a proxy, starts in seconds on a busy
    machine)."""
    verify: bool = True
    """Resume the session with a full replay at the end, to count the copies in history."""
    grace: float = 5.0
    """Seconds a spawned command gets to exit after its stdin closes (then SIGTERM, SIGKILL)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    follow_trace: Path | None = None
    """The trace (``--trace``) of the proxy in front of the Agent, used by this Client alone
    (:mod:`proxy.trace_follow`): an answer it says is lost (dropped, or owed by an Agent the
    proxy replaced) counts as timed out at once, and the final replay waits (``answer_timeout``
    at most) until the proxy has nothing held for the Agent or outstanding there."""

    def __post_init__(self) -> None:
        if bool(self.agent_argv) == (self.connect is not None):
            raise OptionError("give either an agent command or a URL to connect to, not both")
        if self.connect is not None and not self.connect.startswith(
            ("ws://", "wss://", "http://", "https://")
        ):
            raise OptionError(f"expected a ws:// or http:// URL, got {self.connect!r}")
        if self.max_attempts < 1:
            raise OptionError("max_attempts must be at least 1")
        if self.answer_timeout <= 0 or self.setup_timeout <= 0:
            raise OptionError("timeouts must be positive")

    @property
    def transport(self) -> str:
        """``stdio``, ``ws`` or ``http``."""
        if self.connect is None:
            return "stdio"
        return "ws" if self.connect.startswith("ws") else "http"


@dataclass(slots=True)
class Attempt:
    """One ``session/prompt`` request of a submission."""

    request_id: int
    connection: int
    """Which connection carried it (1 is the first)."""
    outcome: Outcome = "pending"
    """``pending`` until answered; still ``pending`` in the report means never answered."""
    timed_out: bool = False
    """The Client stopped waiting for it (``answer_timeout``, or the followed trace said its
    answer was dropped) and sent another attempt."""
    message_id: str | None = None
    error: dict[str, Any] | None = None
    """``code`` and ``message`` of an error answer."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "connection": self.connection,
            "outcome": self.outcome,
            "timedOut": self.timed_out,
            "messageId": self.message_id,
            "error": self.error,
        }


@dataclass(slots=True)
class Submission:
    """One input of the user: its key, made once, and every attempt to deliver it."""

    text: str
    key: str
    attempts: list[Attempt] = field(default_factory=list)
    message_id: str | None = None
    """The ``messageId`` of the first success answer."""
    confirmed: bool = False
    """A success answer came: the Agent inserted the message (once, if it honours keys)."""
    answers: list[str] = field(default_factory=list)
    """Every distinct ``messageId`` answered to its attempts (two: the Agent ignores keys)."""
    message_ids: list[str] = field(default_factory=list)
    """Every distinct message of this submission: the user messages with its text seen live or
    replayed (on any connection), and the answers. One is the invariant; more is a duplicate."""
    history_ids: list[str] = field(default_factory=list)
    """Those of its messages the final replay holds (``[]`` when there was no verification)."""

    @property
    def inserted_twice(self) -> bool:
        """More than one message for this submission: the Agent inserted it again."""
        return len(self.message_ids) > 1

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "key": self.key,
            "confirmed": self.confirmed,
            "messageId": self.message_id,
            "answers": self.answers,
            "messageIds": self.message_ids,
            "historyIds": self.history_ids,
            "attempts": [attempt.to_json() for attempt in self.attempts],
        }


@dataclass(frozen=True, slots=True)
class SeenMessage:
    """A ``user_message`` (or chunk) update of the session, live or replayed."""

    message_id: str
    text: str
    """The text of this update (a chunk's: a part of the message)."""
    connection: int
    replay: int = 0
    """Which ``session/resume`` on its connection replayed it (1 is the first); 0: live."""
    submission: int | None = None
    """The latest submission sent when it arrived (0-based; ``None`` before the first)."""
    chunk: bool = False
    """A ``user_message_chunk``: the message's text is its chunks' in one stream (live, or
    one replay), never across two."""

    @property
    def replayed(self) -> bool:
        return self.replay > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "text": self.text,
            "connection": self.connection,
            "replayed": self.replayed,
            "submission": self.submission,
            "chunk": self.chunk,
        }


@dataclass(slots=True)
class Resume:
    """One ``session/resume`` with ``replayFrom: start``: the user messages it replayed."""

    connection: int
    user_message_ids: list[str] = field(default_factory=list)
    state: str | None = None
    """The ``state_update`` snapshot sent before the answer."""
    final: bool = False
    """The verification at the end of the run."""

    def to_json(self) -> dict[str, Any]:
        return {
            "connection": self.connection,
            "userMessageIds": self.user_message_ids,
            "state": self.state,
            "final": self.final,
        }


@dataclass(slots=True)
class ClientReport:
    """What happened: submissions and their attempts, reconnections, what history holds."""

    transport: str
    session_id: str | None = None
    submissions: list[Submission] = field(default_factory=list)
    connections: int = 0
    reconnects: int = 0
    """New connections after the first (stdio: the command was started again)."""
    resyncs: int = 0
    """``initialize`` and ``session/resume`` again on a connection whose Agent forgot it."""
    resumes: list[Resume] = field(default_factory=list)
    user_messages: list[SeenMessage] = field(default_factory=list)
    """Every user message update of the session, live and replayed, in arrival order."""
    history: list[str] | None = None
    """User message ids of the final replay, in order (``None``: no verification)."""
    duplicates: int = 0
    """Messages beyond one per submission (:attr:`Submission.message_ids`), seen anywhere."""
    error: str | None = None
    """Why the run stopped early (the session is gone, the Agent cannot be reached)."""
    stop: Stop | None = None
    """What kind of stop ``error`` is."""
    not_submitted: list[str] = field(default_factory=list)
    """Prompts never submitted because the run stopped early."""

    @property
    def ok(self) -> bool:
        """Every submission confirmed, none inserted twice, and no error."""
        return (
            self.error is None
            and self.duplicates == 0
            and all(submission.confirmed for submission in self.submissions)
        )

    @property
    def exit_status(self) -> int:
        """0: every submission confirmed, each inserted once. 1: a flaw seen (a submission
        inserted more than once or unconfirmed, the session lost, the Agent gone for good).
        2: nothing checked (the Agent could not be started or reached, or is not a v2 Agent)."""
        if self.ok:
            return 0
        if self.stop in UNCHECKED:
            return 2
        return 1

    def user_message_ids(self) -> list[str]:
        """Distinct user message ids seen, in order of first sight."""
        return list(dict.fromkeys(seen.message_id for seen in self.user_messages))

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "ok": self.ok,
            "exitStatus": self.exit_status,
            "transport": self.transport,
            "sessionId": self.session_id,
            "connections": self.connections,
            "reconnects": self.reconnects,
            "resyncs": self.resyncs,
            "submissions": [submission.to_json() for submission in self.submissions],
            "resumes": [resume.to_json() for resume in self.resumes],
            "userMessages": [seen.to_json() for seen in self.user_messages],
            "userMessageIds": self.user_message_ids(),
            "history": self.history,
            "duplicates": self.duplicates,
            "error": self.error,
            "stop": self.stop,
            "notSubmitted": self.not_submitted,
        }


class _Failure(Exception):
    """The connection failed or did not answer in time: connect again and go on."""


class _Fatal(Exception):
    """The run cannot go on (the session is gone, the Agent is not a v2 Agent, unreachable)."""

    def __init__(self, message: str, stop: Stop) -> None:
        super().__init__(message)
        self.stop: Stop = stop


class _Connection:
    """One connection to the Agent: requests by id, answers as futures, updates to a callback."""

    def __init__(
        self,
        number: int,
        endpoint: Endpoint,
        on_update: Callable[[_Connection, dict[str, Any]], None],
    ) -> None:
        self.number = number
        self.endpoint = endpoint
        self._on_update = on_update
        self._pending: dict[int, asyncio.Future[Answer]] = {}
        self.lost = False
        self.resume: Resume | None = None
        """The resume in flight: updates before its answer are its replay."""
        self.replays = 0
        """Resumes sent on this connection: each replay is a stream of updates of its own."""
        self._resume_id: int | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def request(
        self, request_id: int, method: str, params: dict[str, Any]
    ) -> asyncio.Future[Answer]:
        """Send a request; return the future of its answer (``None`` if the connection ends)."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if self.lost:
            future.set_result(None)
            return future
        self._pending[request_id] = future
        self._send({"id": request_id, "method": method, "params": params})
        await self.endpoint.drain()
        return future

    async def call(
        self, request_id: int, method: str, params: dict[str, Any], patience: float
    ) -> dict[str, Any]:
        """Send a request and wait for its answer; :class:`_Failure` if none comes."""
        if method == "session/resume":
            self._resume_id = request_id
        future = await self.request(request_id, method, params)
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), patience)
        except TimeoutError:
            raise _Failure(f"no answer to {method} in {patience:g} s") from None
        finally:
            if self._resume_id == request_id:
                self._resume_id = None
        if answer is None:
            raise _Failure(f"the connection ended during {method}")
        return answer

    def _send(self, message: dict[str, Any]) -> None:
        self.endpoint.send(orjson.dumps({"jsonrpc": "2.0", **message}))

    async def _read(self) -> None:
        try:
            while (received := await self.endpoint.receive()) is not None:
                if isinstance(received, Oversized):
                    log.warning("oversized message from the agent skipped", size=received.size)
                    continue
                self._dispatch(received)
        except Exception as exc:  # a transport failing in any way ends the connection
            log.warning("reading from the agent failed", error=str(exc))
        finally:
            self.lost = True
            self._resume_id = None
            for future in self._pending.values():
                if not future.done():
                    future.set_result(None)
            self._pending.clear()
            log.info("connection ended", connection=self.number)

    def _dispatch(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            log.warning("unparsable message from the agent skipped", data=shorten(data))
            return
        if not isinstance(message, dict):
            log.warning("message from the agent that is not an object skipped", data=shorten(data))
            return
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                # This Client offers no capabilities: no file system, terminals or permissions.
                self._send(
                    {
                        "id": message["id"],
                        "error": {
                            "code": ErrorCode.METHOD_NOT_FOUND.value,
                            "message": f"method not found: {method}",
                        },
                    }
                )
            elif method == "session/update" and isinstance(message.get("params"), dict):
                self._on_update(self, message["params"])
            return
        request_id = message.get("id")
        if type(request_id) is not int:
            log.warning("answer with an id this Client never sent", data=shorten(data))
            return
        if request_id == self._resume_id:
            self._resume_id = None  # what follows is live again
        future = self._pending.pop(request_id, None)
        if future is None or future.done():
            log.warning("answer to an unknown request ignored", id=request_id)
            return
        future.set_result(message)

    @property
    def replaying(self) -> bool:
        return self._resume_id is not None

    async def close(self, grace: float) -> None:
        """End the connection (a spawned command gets EOF, then signals) and stop reading.

        Requests still pending are never answered: their attempts stay ``pending``.
        """
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self.lost:
            self.endpoint.sever(flush=False)
        else:
            self.endpoint.close()
        with contextlib.suppress(Exception):
            await self.endpoint.wait_closed()
        done, _ = await asyncio.wait({self._reader}, timeout=grace)
        if not done:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class _Run:
    """One run of the Client: its connection, session, submissions and report."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.report = ClientReport(options.transport)
        self.connection: _Connection | None = None
        self._ids = itertools.count(1)
        self._trace: TraceFollower | None = None

    # -- connections ---------------------------------------------------------------------------

    async def _connect(self) -> _Connection:
        options = self.options
        await self._drop()
        number = self.report.connections + 1
        endpoint: Endpoint
        try:
            if options.connect is None:
                endpoint = await spawn_agent(
                    options.agent_argv, limit=options.max_message_bytes, grace=options.grace
                )
            elif options.transport == "ws":
                endpoint = await connect_ws(options.connect, limit=options.max_message_bytes)
            else:
                endpoint = await connect_http(options.connect, limit=options.max_message_bytes)
        except Exception as exc:
            raise _Failure(f"cannot connect: {exc}") from exc
        self.report.connections = number
        self.connection = _Connection(number, endpoint, self._on_update)
        log.info("connected", connection=number, transport=options.transport)
        return self.connection

    async def _drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.close(self.options.grace)

    async def _call(
        self, connection: _Connection, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        return await connection.call(next(self._ids), method, params, self.options.setup_timeout)

    async def _initialize(self, connection: _Connection) -> None:
        answer = await self._call(
            connection,
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "info": {"name": "acp-proxy-reference-client", "version": __version__},
            },
        )
        result = _result_of(answer, "initialize")
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            answered = shorten(repr(version), 40)
            raise _Fatal(
                f"not an ACP v2 Agent: initialize answered protocol version {answered} "
                f"(idempotency keys need {PROTOCOL_VERSION})",
                "not_v2",
            )
        capabilities = result.get("capabilities")
        if not isinstance(capabilities, dict) or capabilities.get("session") is None:
            raise _Fatal(
                "not an ACP v2 Agent: its initialize answer has no capabilities.session", "not_v2"
            )

    async def _new_session(self, connection: _Connection) -> None:
        answer = await self._call(
            connection, "session/new", {"cwd": self.options.cwd, "mcpServers": []}
        )
        session_id = _result_of(answer, "session/new").get("sessionId")
        if not isinstance(session_id, str):
            raise _Fatal(f"session/new answered no sessionId: {shorten(answer)}", "unreachable")
        self.report.session_id = session_id
        log.info("session created", session=session_id)

    async def _resume(self, connection: _Connection, *, final: bool = False) -> Resume:
        assert self.report.session_id is not None
        resume = Resume(connection.number, final=final)
        connection.resume = resume
        connection.replays += 1
        try:
            answer = await self._call(
                connection,
                "session/resume",
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
            raise _Fatal(
                f"the agent no longer knows session {self.report.session_id}", "session_lost"
            )
        _result_of(answer, "session/resume")
        self.report.resumes.append(resume)
        log.info(
            "session resumed",
            connection=connection.number,
            replayed_user_messages=len(resume.user_message_ids),
            state=resume.state,
        )
        return resume

    async def _open(self) -> None:
        """The first connection: initialize and a new session."""
        try:
            connection = await self._connect()
            await self._initialize(connection)
            await self._new_session(connection)
        except _Failure as exc:
            raise _Fatal(str(exc), "unreachable") from exc

    async def _reconnect(self, *, final: bool = False) -> _Connection:
        """Connect again (respawn), initialize and resume the session with a full replay."""
        last = ""
        for attempt in range(self.options.max_attempts):
            if attempt:
                await asyncio.sleep(min(MAX_BACKOFF, 0.1 * 2 ** (attempt - 1)))
            try:
                connection = await self._connect()
                await self._initialize(connection)
                await self._resume(connection, final=final)
            except _Failure as exc:
                last = str(exc)
                log.warning("reconnecting failed", error=last, attempt=attempt + 1)
                continue
            self.report.reconnects += 1
            return connection
        raise _Fatal(
            f"could not reconnect in {self.options.max_attempts} tries: {last}", "reconnect_failed"
        )

    async def _resync(self, connection: _Connection) -> _Connection:
        """Initialize and resume again on the same connection (its Agent forgot it)."""
        try:
            await self._initialize(connection)
            await self._resume(connection)
        except _Failure as exc:
            log.warning("resynchronising failed; reconnecting", error=str(exc))
            return await self._reconnect()
        self.report.resyncs += 1
        return connection

    def _on_update(self, connection: _Connection, params: dict[str, Any]) -> None:
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

    # -- submissions ---------------------------------------------------------------------------

    async def _submit(self, submission: Submission) -> None:
        """Deliver one submission: send, wait, resend with the same key until confirmed."""
        assert self.report.session_id is not None
        params = {
            "sessionId": self.report.session_id,
            "idempotencyKey": submission.key,
            "prompt": [{"type": "text", "text": submission.text}],
        }
        sent: list[tuple[_Connection, asyncio.Future[Answer]]] = []
        action: Literal["send", "wait", "resync", "reconnect"] = "send"
        while True:
            if action != "wait":
                if len(submission.attempts) >= self.options.max_attempts:
                    log.warning(
                        "giving up on a submission",
                        key=submission.key,
                        attempts=len(submission.attempts),
                    )
                    return
                connection = await self._ready(action)
                attempt = Attempt(next(self._ids), connection.number)
                submission.attempts.append(attempt)
                future = await connection.request(attempt.request_id, "session/prompt", params)
                future.add_done_callback(functools.partial(_settle, submission, attempt))
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
                    _settle(submission, attempt, future)
            if submission.confirmed:
                return
            current = self.connection
            if current is None or current.lost or sent[-1][1].done():
                # The latest attempt failed: act on it now. Earlier attempts still pending on
                # this connection may yet be answered, and a success among them still counts.
                action = self._after_failure(submission)
                continue
            waiting = {
                attempt.request_id: future
                for attempt, (connection, future) in zip(submission.attempts, sent, strict=True)
                if connection is current and not future.done()
            }
            if await self._answered(waiting):
                action = "wait"
                continue
            for attempt, (_, future) in zip(submission.attempts, sent, strict=True):
                if not future.done():
                    attempt.timed_out = True
            action = "send"

    async def _answered(self, waiting: dict[int, asyncio.Future[Answer]]) -> bool:
        """Wait for an answer to one of ``waiting`` (by request id): ``True`` when one came (or
        the connection ended), ``False`` when they are lost: ``answer_timeout`` passed, or the
        followed trace says every one of them is lost (dropped, or owed by a replaced Agent)."""
        futures: set[asyncio.Future[Any]] = set(waiting.values())
        dropped = None
        if self._trace is not None:
            dropped = asyncio.get_running_loop().create_task(self._trace.lost(waiting))
            futures.add(dropped)
        try:
            done, _ = await asyncio.wait(
                futures, timeout=self.options.answer_timeout, return_when=asyncio.FIRST_COMPLETED
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
                timeout=self.options.answer_timeout,
            )
        return False

    def _after_failure(self, submission: Submission) -> Literal["send", "resync", "reconnect"]:
        """What to do when no attempt on the current connection can still be answered."""
        connection = self.connection
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
        log.warning(
            "prompt not inserted; resending with the same key", key=submission.key, code=code
        )
        return "send"

    async def _ready(self, action: Literal["send", "resync", "reconnect"]) -> _Connection:
        connection = self.connection
        if action == "reconnect" or connection is None or connection.lost:
            return await self._reconnect()
        if action == "resync":
            return await self._resync(connection)
        return connection

    async def _verify(self) -> None:
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
                except _Failure as exc:
                    log.warning("verification failed; reconnecting", error=str(exc))
                    await self._drop()
                    continue
            self.report.history = list(resume.user_message_ids)
            return

    async def _settle(self) -> None:
        """With a followed trace: wait (``answer_timeout`` at most) until the proxy relayed
        every answer this Client got and has nothing held for the Agent or outstanding there."""
        if self._trace is None:
            return
        answered = [
            attempt.request_id
            for submission in self.report.submissions
            for attempt in submission.attempts
            if attempt.outcome == "answered"
        ]
        try:
            await asyncio.wait_for(self._trace.quiet(answered), self.options.answer_timeout)
        except TimeoutError:
            log.warning(
                "the proxy still has requests at the agent; verifying anyway",
                timeout=self.options.answer_timeout,
            )

    async def run(self) -> ClientReport:
        async with contextlib.AsyncExitStack() as stack:
            if self.options.follow_trace is not None:
                self._trace = await stack.enter_async_context(
                    TraceFollower(self.options.follow_trace)
                )
            return await self._run()

    async def _run(self) -> ClientReport:
        try:
            await self._open()
            for number, text in enumerate(self.options.prompts):
                self.report.not_submitted = list(self.options.prompts[number + 1 :])
                submission = Submission(text, str(uuid.uuid4()))
                self.report.submissions.append(submission)
                await self._submit(submission)
            if self.options.verify:
                await self._verify()
        except _Fatal as exc:
            if not self.report.submissions:
                self.report.not_submitted = list(self.options.prompts)
            self.report.error = str(exc)
            self.report.stop = exc.stop
            log.error("the client stopped", error=str(exc))
        finally:
            await self._drop()
        judge(self.report)
        return self.report


def judge(report: ClientReport) -> None:
    """Give each user message seen to its submission; fill their messages and the duplicates.

    A message answered to an attempt is that submission's. Any other belongs to the latest
    submission sent before it was first seen whose text it has (in some stream: live, or one
    replay). So a copy seen only live counts though the final replay leaves it out, and a late
    copy of an earlier submission is not taken for the current one's. This is the ledger's
    ``duplicate_insert`` from the Client's side: one submission, several ``messageId`` s.
    """
    streams: dict[tuple[int, int, str], str] = {}
    for seen in report.user_messages:
        stream = (seen.connection, seen.replay, seen.message_id)
        streams[stream] = streams.get(stream, "") + seen.text if seen.chunk else seen.text
    texts: dict[str, set[str]] = {}
    for (_, _, message_id), text in streams.items():
        texts.setdefault(message_id, set()).add(text)
    owner: dict[str, int] = {}
    for number, submission in enumerate(report.submissions):
        for message_id in submission.answers:
            owner.setdefault(message_id, number)
    for seen in report.user_messages:
        if seen.message_id in owner or seen.submission is None:
            continue
        for number in range(min(seen.submission, len(report.submissions) - 1), -1, -1):
            if report.submissions[number].text in texts[seen.message_id]:
                owner[seen.message_id] = number
                break
    order = list(dict.fromkeys([*report.user_message_ids(), *owner]))  # answers unseen last
    for number, submission in enumerate(report.submissions):
        submission.message_ids = [m for m in order if owner.get(m) == number]
        submission.history_ids = [m for m in report.history or () if owner.get(m) == number]
    report.duplicates = sum(max(0, len(s.message_ids) - 1) for s in report.submissions)


def _settle(submission: Submission, attempt: Attempt, future: asyncio.Future[Answer]) -> None:
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


def _result_of(answer: dict[str, Any], method: str) -> dict[str, Any]:
    """The result object of an answer; an error answer is a :class:`_Failure`."""
    result = answer.get("result")
    if not isinstance(result, dict):
        raise _Failure(f"{method} failed: {shorten(answer.get('error', answer))}")
    return result


def _text_of(content: Any) -> str:
    """The text of a content block or a list of them."""
    blocks = content if isinstance(content, list) else [content]
    return "".join(
        block["text"]
        for block in blocks
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


async def run_client(options: ClientOptions) -> ClientReport:
    """Connect, open a session, deliver every prompt with its own key, and report.

    Never raises for trouble with the Agent or the connection: the report's ``error`` says why
    the run stopped early, and unconfirmed submissions stay unconfirmed.
    """
    return await _Run(options).run()


def render(report: ClientReport) -> str:
    """The report for people: one row per submission, then the verdict."""
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
        lines.append(
            f"  {number:>2}  {_cell(repr(submission.text), 24):<24}  {submission.key[:8]:<8}  "
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
        lines.append("FAIL: " + "; ".join(problems))
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


def client_main(options: ClientOptions, *, as_json: bool) -> int:
    """``acp-proxy client``: run the Client, print its report (for people, or JSON); the exit
    status (:attr:`ClientReport.exit_status`)."""
    report = asyncio.run(run_client(options))
    text = json.dumps(report.to_json(), indent=2) if as_json else render(report)
    sys.stdout.write(text + "\n")
    return report.exit_status
