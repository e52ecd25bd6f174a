"""``acp-proxy agent``: a small ACP v2 Agent that implements the idempotency RFD fully.

It is the known-good peer of the retry lab (and, with ``--no-dedupe``, the known-bad one). Per
session it keeps a history of messages and the keys recorded with the user messages:

* ``initialize`` answers protocol version 2 (or the Client's, if lower), ``capabilities.session``.
* ``session/new`` creates a session, active on this connection; ``session/resume`` makes a known
  session active here, replays its history with ``replayFrom: {"type": "start"}``, sends the
  current ``state_update`` and answers ``{}``; prompting a session not active on the connection is
  ``-32002``.
* ``session/prompt``: an ``idempotencyKey`` that is not a 1-255 character string is ``-32602``
  (never treated as omitted). A recorded key is answered with the original ``messageId`` and
  inserts nothing. A key whose prompt is held (waiting for the running turn) joins it: every
  request with that key is answered when it is inserted, with the same outcome. Otherwise the
  prompt is inserted (``user_message``) at once if the session is idle, or held until the turn
  ends; its key is stored in the same write as the message. A turn reports ``running``, an
  ``agent_message`` after ``--turn-ms``, then ``idle`` with ``end_turn``.
* ``$/cancel_request`` of any pending request with a key withdraws the held prompt: every pending
  request with that key gets ``-32800`` and the key stays unused. ``session/cancel`` answers held
  prompts ``-32800`` and ends the turn (``cancelled``); ``session/close`` does that too and
  answers ``{}``.
* Keys are never echoed: message ids are random.
* ``--store DIR``: each session is a JSON file, replaced atomically on every change, so a killed
  and restarted Agent still recognises the keys of the messages it stored. A write that fails
  (the folder gone or made read-only, a full disk) is logged in one line; the request it was for
  is answered ``-32603`` and changes nothing (a prompt is not inserted, its key stays unused; a
  new session is not made), an Agent's reply is kept in memory only.
* ``--no-dedupe``: keys are ignored (every prompt is a new submission): a known-bad Agent.
* ``--fail-prompts N``: the first N valid prompts of the process are answered ``-32603`` and
  insert nothing (their keys stay unused): an Agent's own error, which the proxy relays and its
  ledger records with the key (``acp-proxy check-client``'s C4).

It speaks on stdio, or serves WebSocket and Streamable HTTP with the proxy's own transports (in
TLS too: ``--listen https://`` or ``wss://`` with ``--tls-cert`` and ``--tls-key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import ssl
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import orjson

from proxy.core import acp
from proxy.core.errors import ConfigError, OptionError, StartupError, at_least, os_cause
from proxy.core.jsonrpc import Batch, ErrorCode, Invalid, Kind, Message, parse
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger
from proxy.shell.observers import Fanout
from proxy.shell.server import STDIO, Address, parse_address
from proxy.shell.tls import check_listener, listener_tls
from proxy.shell.transports.http_listener import Listener, ListenerConfig, Refused
from proxy.shell.transports.stdio import open_client_stdio
from proxy.shell.writable import cannot_write_in
from proxy.tools.rpc import encode

__all__ = [
    "AgentOptions",
    "ReferenceAgent",
    "ServedOptions",
    "agent_main",
    "run_served",
    "serve_agent",
    "serve_connections",
]

log = get_logger("proxy.agent")

PROTOCOL_VERSION = 2
MAX_KEY = 255


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedOptions:
    """What a tool that serves Clients as an Agent is told of where and how (the reference
    Agent's options, ``acp-proxy replay agent``'s): the address, its certificate, the bound on
    one message."""

    listen: Address = STDIO
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls: ssl.SSLContext | None = None
    """The certificate served on an ``https://`` or ``wss://`` listener (:mod:`proxy.shell.tls`)."""

    def __post_init__(self) -> None:
        check_listener(self.listen.url, secure=self.listen.secure, served=self.tls is not None)
        at_least("max_message_bytes", self.max_message_bytes, 1)

    @classmethod
    def from_command_line(
        cls,
        *,
        listen: str = "stdio",
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        **settings: Any,
    ) -> Self:
        """The options as the command line gave them: ``listen`` parsed and its certificate's
        files read (an :class:`~proxy.core.errors.OptionError` when it is no address, or they
        cannot be used), the others as given."""
        try:
            address = parse_address(listen, option="--listen")
        except ConfigError as exc:
            raise OptionError(str(exc)) from None
        tls = listener_tls(address.url, secure=address.secure, cert=tls_cert, key=tls_key)
        return cls(listen=address, tls=tls, **settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOptions(ServedOptions):
    """How the reference Agent behaves."""

    store: Path | None = None
    dedupe: bool = True
    turn_ms: float = 50.0
    fail_prompts: int = 0
    """The first valid prompts of the process answered ``-32603``, nothing inserted."""

    def __post_init__(self) -> None:
        ServedOptions.__post_init__(self)  # (a slotted dataclass has no zero-argument super())
        at_least("--turn-ms", self.turn_ms, 0)
        at_least("--fail-prompts", self.fail_prompts, 0)


@dataclass
class _Waiter:
    connection: AgentConnection
    request_id: Any


@dataclass
class _Held:
    """A prompt waiting for the running turn to end; every request of its key waits with it."""

    key: str | None
    prompt: list[Any]
    waiters: list[_Waiter] = field(default_factory=list)


@dataclass
class Session:
    """One conversation: history, recorded keys, held prompts, the running turn."""

    id: str
    cwd: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    """Recorded key -> messageId of the user message inserted with it."""
    held: list[_Held] = field(default_factory=list)
    state: str = "idle"
    stop_reason: str | None = None
    turn: asyncio.Task[None] | None = None
    connection: AgentConnection | None = None
    protocol_version: int | None = None
    """The protocol version agreed with the Client that created it (in the store: what
    ``acp-proxy check-client`` reads to tell a v1 Client)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cwd": self.cwd,
            "messages": self.messages,
            "keys": self.keys,
            "protocolVersion": self.protocol_version,
        }


class SessionStore:
    """Sessions in memory, or one JSON file each in a directory, written atomically.

    The directory is made if missing, and a file is made in it at once: one it cannot write stops
    the Agent as it starts (:class:`~proxy.core.errors.StartupError`), not at its first session.
    """

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        if directory is None:
            return
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError("--store", str(directory), os_cause(exc)) from None
        cause = cannot_write_in(directory, prefix=".session.")
        if cause is not None:
            raise StartupError("--store", str(directory), f"cannot be written: {cause}")

    def load(self, session_id: str) -> Session | None:
        if self._directory is None:
            return None
        path = self._path(session_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        session = Session(data["id"], data["cwd"], data["messages"], data["keys"])
        version = data.get("protocolVersion")
        session.protocol_version = version if isinstance(version, int) else None
        return session

    def save(self, session: Session) -> str | None:
        """Message and key in one write: both are stored, or neither. None when stored; why not
        otherwise (logged), the file left as it was."""
        if self._directory is None:
            return None
        path = self._path(session.id)
        temporary = None
        try:
            fd, temporary = tempfile.mkstemp(dir=self._directory, prefix=".session.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(orjson.dumps(session.to_json()))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
            cause = f"the session could not be stored: {os_cause(exc)}"
            log.error(cause, session=session.id, store=str(self._directory))
            return cause
        return None

    def _path(self, session_id: str) -> Path:
        assert self._directory is not None
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in session_id)
        return self._directory / f"{safe}.json"


class ReferenceAgent:
    """The state shared by every connection of one Agent process."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.store = SessionStore(options.store)
        self.sessions: dict[str, Session] = {}
        self.failures_left = options.fail_prompts
        """Prompts still to be answered ``-32603`` (``--fail-prompts``)."""

    def session(self, session_id: str) -> Session | None:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.store.load(session_id)
            if session is not None:
                self.sessions[session_id] = session
        return session

    async def serve(self, endpoint: Endpoint) -> None:
        """Answer one connection until it closes."""
        await AgentConnection(self, endpoint).run()

    def insert_next(self, session: Session) -> None:
        """Insert the oldest held prompt (if any) and start its turn."""
        if not session.held:
            return
        held = session.held.pop(0)
        message_id = f"msg_{uuid.uuid4().hex}"
        item = {"sessionUpdate": "user_message", "messageId": message_id, "content": held.prompt}
        session.messages.append(item)
        if held.key is not None:
            session.keys[held.key] = message_id
        failed = self.store.save(session)  # the key with the message, in one write
        if failed is not None:  # neither is: not inserted, the key unused
            session.messages.pop()
            if held.key is not None:
                del session.keys[held.key]
            for waiter in held.waiters:
                waiter.connection.answered(
                    waiter.request_id, error=(ErrorCode.INTERNAL_ERROR, failed)
                )
            self.insert_next(session)
            return
        session.state = "running"
        session.stop_reason = None
        target = session.connection
        if target is not None:
            target.update(session.id, item)
            target.update(session.id, {"sessionUpdate": "state_update", "state": "running"})
        for waiter in held.waiters:
            waiter.connection.answered(waiter.request_id, {"messageId": message_id})
        session.turn = asyncio.get_running_loop().create_task(self._turn(session, held))

    async def _turn(self, session: Session, held: _Held) -> None:
        stop = "end_turn"
        try:
            await asyncio.sleep(self.options.turn_ms / 1000)
            reply = {
                "sessionUpdate": "agent_message",
                "messageId": f"msg_{uuid.uuid4().hex}",
                "content": [{"type": "text", "text": f"done: {_text_of(held.prompt)[:200]}"}],
            }
            session.messages.append(reply)
            self.store.save(session)  # if it fails (logged), the reply is in memory only
            if session.connection is not None:
                session.connection.update(session.id, reply)
        except asyncio.CancelledError:
            stop = "cancelled"
        session.turn = None
        session.state = "idle"
        session.stop_reason = stop
        if session.connection is not None:
            session.connection.update(
                session.id, {"sessionUpdate": "state_update", "state": "idle", "stopReason": stop}
            )
        if stop == "end_turn":
            self.insert_next(session)


class AgentConnection:
    """One Client connection to the reference Agent."""

    def __init__(self, agent: ReferenceAgent, endpoint: Endpoint) -> None:
        self.agent = agent
        self.endpoint = endpoint
        self.initialized = False
        self.protocol_version: int | None = None
        """The version ``initialize`` agreed on."""
        self.active: set[str] = set()
        self._pending: dict[Any, tuple[str, _Held]] = {}
        """Pending prompt requests by id (as JSON value): their session and held prompt."""

    async def run(self) -> None:
        try:
            while (received := await self.endpoint.receive()) is not None:
                if isinstance(received, Message | Batch | Invalid):
                    received = received.raw  # parsed by the HTTP listener: read as sent
                if isinstance(received, bytes):
                    self._handle(received)
                    self.endpoint.processed(None)
                    await self.endpoint.drain()
        finally:
            self._forget()
            self.endpoint.close()
            with contextlib.suppress(Exception):
                await self.endpoint.wait_closed()

    def _forget(self) -> None:
        """The connection ended: its sessions stop being active, its held prompts lose it."""
        for session_id in self.active:
            session = self.agent.sessions.get(session_id)
            if session is not None and session.connection is self:
                session.connection = None
        for session_id, held in list(self._pending.values()):
            held.waiters = [w for w in held.waiters if w.connection is not self]
            session = self.agent.sessions.get(session_id)
            if not held.waiters and session is not None and held in session.held:
                session.held.remove(held)  # never inserted: the key stays unused
        self._pending.clear()

    # -- plumbing ------------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self.endpoint.send(encode(message))

    def result(self, request_id: Any, result: dict[str, Any]) -> None:
        self.send({"id": request_id, "result": result})

    def error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self.send({"id": request_id, "error": error})

    def answered(
        self,
        request_id: Any,
        result: dict[str, Any] | None = None,
        *,
        error: tuple[int, str] | None = None,
    ) -> None:
        """Answer a held prompt request (once inserted, or withdrawn)."""
        self._pending.pop(request_id, None)
        if error is not None:
            self.error(request_id, error[0], error[1], {"requestId": request_id})
        else:
            self.result(request_id, result or {})

    def update(self, session_id: str, update: dict[str, Any]) -> None:
        self.send(
            {"method": acp.SESSION_UPDATE, "params": {"sessionId": session_id, "update": update}}
        )

    def _handle(self, raw: bytes) -> None:
        message = parse(raw)
        if isinstance(message, Invalid):
            if not message.response:
                self.error(None, message.reason.error_code, message.detail)
            return
        if isinstance(message, Batch):
            self.error(None, ErrorCode.INVALID_REQUEST, "batches are not supported")
            return
        if message.kind in (Kind.RESPONSE, Kind.ERROR):
            return  # this Agent sends no requests
        params = message.params if isinstance(message.params, dict) else {}
        request_id = message.body.get("id")
        method = message.method
        if message.kind is Kind.NOTIFICATION:
            if method == acp.CANCEL_REQUEST:
                self._cancel_request(params.get("requestId"))
            elif method == acp.SESSION_CANCEL:
                self._session_cancel(params.get("sessionId"), closing=False)
            return
        if method == acp.INITIALIZE:
            self._initialize(request_id, params)
        elif not self.initialized:
            self.error(request_id, ErrorCode.INVALID_REQUEST, "the connection must be initialized")
        elif method == acp.NEW_SESSION:
            self._new(request_id, params)
        elif method == acp.RESUME_SESSION:
            self._resume(request_id, params)
        elif method == acp.PROMPT:
            self._prompt(request_id, params)
        elif method == acp.CLOSE_SESSION:
            self._session_cancel(params.get("sessionId"), closing=True)
            self.active.discard(str(params.get("sessionId")))
            self.result(request_id, {})
        else:
            self.error(request_id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {method}")

    # -- lifecycle -----------------------------------------------------------------------------

    def _initialize(self, request_id: Any, params: dict[str, Any]) -> None:
        requested = params.get("protocolVersion")
        version = min(requested, PROTOCOL_VERSION) if isinstance(requested, int) else 2
        self.initialized = True
        self.protocol_version = version
        self.result(
            request_id,
            {
                "protocolVersion": version,
                "capabilities": {"session": {}},
                "info": {"name": "acp-proxy-reference-agent", "version": "1"},
                "authMethods": [],
            },
        )

    def _new(self, request_id: Any, params: dict[str, Any]) -> None:
        session = Session(f"sess_{uuid.uuid4().hex[:16]}", str(params.get("cwd", "/")))
        session.protocol_version = self.protocol_version
        failed = self.agent.store.save(session)
        if failed is not None:
            self.error(request_id, ErrorCode.INTERNAL_ERROR, failed)
            return
        self.agent.sessions[session.id] = session
        self._activate(session)
        self.result(request_id, {"sessionId": session.id})

    def _activate(self, session: Session) -> None:
        self.active.add(session.id)
        session.connection = self

    def _resume(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        session = self.agent.session(session_id) if isinstance(session_id, str) else None
        if session is None:
            self.error(
                request_id,
                ErrorCode.RESOURCE_NOT_FOUND,
                "unknown session",
                {"sessionId": session_id},
            )
            return
        replay = params.get("replayFrom")
        if replay is not None and replay != {"type": "start"}:
            self.error(request_id, ErrorCode.INVALID_PARAMS, "unsupported replayFrom")
            return
        self._activate(session)
        if replay is not None:
            for item in session.messages:
                self.update(session.id, item)
        state: dict[str, Any] = {"sessionUpdate": "state_update", "state": session.state}
        if session.state == "idle" and session.stop_reason is not None:
            state["stopReason"] = session.stop_reason
        self.update(session.id, state)
        self.result(request_id, {})

    # -- prompts -------------------------------------------------------------------------------

    def _prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or session_id not in self.active:
            data = {"sessionId": session_id}
            message = "session does not exist or is not active"
            self.error(request_id, ErrorCode.RESOURCE_NOT_FOUND, message, data)
            return
        session = self.agent.sessions[session_id]
        prompt = params.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            self.error(request_id, ErrorCode.INVALID_PARAMS, "prompt is a non-empty array")
            return
        key: str | None = None
        if "idempotencyKey" in params and params["idempotencyKey"] is not None:
            value = params["idempotencyKey"]
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY:
                message = "idempotencyKey must be a string of 1 to 255 characters"
                self.error(request_id, ErrorCode.INVALID_PARAMS, message)
                return
            key = value if self.agent.options.dedupe else None
        if self.agent.failures_left > 0:  # --fail-prompts: not inserted, the key stays unused
            self.agent.failures_left -= 1
            self.error(request_id, ErrorCode.INTERNAL_ERROR, "failing on purpose (--fail-prompts)")
            return
        waiter = _Waiter(self, request_id)
        if key is not None:
            recorded = session.keys.get(key)
            if recorded is not None:
                self.result(request_id, {"messageId": recorded})  # a retry: nothing inserted
                return
            for held in session.held:
                if held.key == key:
                    held.waiters.append(waiter)  # answered with the first, same outcome
                    self._pending[request_id] = (session.id, held)
                    return
        held = _Held(key, prompt, [waiter])
        session.held.append(held)
        self._pending[request_id] = (session.id, held)
        if session.turn is None:
            self.agent.insert_next(session)

    # -- cancellation --------------------------------------------------------------------------

    def _cancel_request(self, request_id: Any) -> None:
        """Withdraw the held prompt of a pending request: every request of its key gets -32800."""
        found = self._pending.get(request_id)
        if found is None:
            return  # unknown or already answered: ignored
        session_id, held = found
        session = self.agent.sessions.get(session_id)
        if session is not None and held in session.held:
            session.held.remove(held)
        self._withdraw(held)

    def _withdraw(self, held: _Held) -> None:
        for waiter in held.waiters:
            waiter.connection.answered(
                waiter.request_id,
                error=(ErrorCode.REQUEST_CANCELLED, "Request cancelled"),
            )

    def _session_cancel(self, session_id: Any, *, closing: bool) -> None:
        session = self.agent.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            return
        held, session.held = session.held, []
        for prompt in held:
            self._withdraw(prompt)
        if session.turn is not None:
            session.turn.cancel()
        if closing and session.connection is self:
            session.connection = None


def _text_of(prompt: list[Any]) -> str:
    for block in prompt:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            return str(block["text"])
    return ""


def agent_main(options: AgentOptions) -> int:
    """``acp-proxy agent``: serve on stdio until EOF, or on a listener until SIGINT or SIGTERM;
    the exit status (0), or 1 with one line on stderr when it cannot start (its store cannot be
    made, its address cannot be listened on)."""
    return run_served("agent", options.listen, functools.partial(serve_agent, options))


def run_served(
    name: str, listen: Address, serve: Callable[[asyncio.Event | None], Awaitable[int]]
) -> int:
    """Run ``serve`` (a tool that serves Clients on ``listen``) until it ends: on stdio until EOF,
    on a listener until SIGINT or SIGTERM; its exit status, or 1 with one line on stderr naming
    the tool ``acp-proxy NAME`` when it cannot start."""
    try:
        return asyncio.run(_serve_until_signalled(listen, serve))
    except StartupError as exc:
        sys.stderr.write(f"acp-proxy {name}: {exc}\n")
        return 1


async def _serve_until_signalled(
    listen: Address, serve: Callable[[asyncio.Event | None], Awaitable[int]]
) -> int:
    loop = asyncio.get_running_loop()
    if listen.scheme == "stdio":
        # Ctrl-C ends it as it ends any command: it dies of the signal (130 in a shell), as it
        # does of SIGTERM, instead of asyncio's cancelling its main task.
        loop.add_signal_handler(signal.SIGINT, _die_of, signal.SIGINT)
        return await serve(None)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return await serve(stop)


def _die_of(signum: int) -> None:
    """End the process as the signal's default action does (its status says so)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


async def serve_agent(options: AgentOptions, stop: asyncio.Event | None = None) -> int:
    """Run the reference Agent on stdio (until EOF) or on a listener (until ``stop``)."""
    agent = ReferenceAgent(options)  # a --store it cannot write: StartupError (SessionStore)
    return await serve_connections(
        options.listen,
        agent.serve,
        max_message_bytes=options.max_message_bytes,
        tls=options.tls,
        stop=stop,
    )


async def serve_connections(
    listen: Address,
    serve: Callable[[Endpoint], Coroutine[Any, Any, None]],
    *,
    max_message_bytes: int,
    tls: ssl.SSLContext | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Hand each Client connection to ``serve``: the one on stdio (until it ends), or every one
    a listener on ``listen`` accepts, WebSocket or Streamable HTTP, in TLS with ``tls`` (until
    ``stop``; then the connections still served are cancelled), once the URL served (the port
    picked for port 0) is on stderr: the listener's ``listening`` log line, or below the info
    level ``listening on URL``.
    :class:`~proxy.core.errors.StartupError` when the address cannot be listened on."""
    if listen.scheme == "stdio":
        endpoint = await open_client_stdio(limit=max_message_bytes)
        await serve(endpoint)
        return 0
    stop = stop or asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def on_connection(endpoint: Endpoint, headers: Any, cookies: Any) -> Refused | None:
        task = asyncio.get_running_loop().create_task(serve(endpoint))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return None

    listener = Listener(
        ListenerConfig(
            host=listen.host,
            port=listen.port,
            path=listen.path,
            websocket_only=listen.scheme == "ws",
            max_message_bytes=max_message_bytes,
            allowances=None,  # a test peer: no Host or Origin checks
            tls=tls,
        ),
        on_connection,
        Fanout([]),
    )
    try:
        await listener.start()
    except OSError as exc:
        raise StartupError("--listen", listen.url, os_cause(exc)) from None
    if not log.bind().is_enabled_for(logging.INFO):  # the listener's own line is not shown
        # With port 0 this is the only way to learn the port picked: said at any level.
        sys.stderr.write(f"listening on {listener.url}\n")
        sys.stderr.flush()
    await stop.wait()
    await listener.stop()
    for task in list(tasks):
        task.cancel()
    return 0
