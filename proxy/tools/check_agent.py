"""``acp-proxy check-agent``: the idempotency RFD's conformance traces, run against any Agent.

Each trace (T0-T7 of the wire brief, section 5) starts the proxy in front of the Agent with a fault
file of its own, talks to it as a Client over ``--transport`` (stdio, ws or http: the transport
between this checker and the proxy; the proxy always spawns the Agent over stdio), provokes the
loss the trace is about, and judges what came back: PASS, FAIL with the reason, SKIP with the
missing capability, or ERROR when the check could not be carried out. Every submission has a fresh
UUID key, and every trace checks that none of its keys appears in what the Agent sends. A just
started Agent gets ``startup_timeout`` to answer ``initialize``; a connection that closes early
is explained from the proxy's log (kept in the trace's directory, never shown as is).

T0 invalid keys are ``-32602`` and insert nothing. T1 a retry on the same connection after a lost
answer gets the original ``messageId``. T2 the same after reconnecting and ``session/resume`` (the
proxy keeps the Agent for the next connection: conductor mode). T3 the same after the Agent was
killed and restarted (needs an Agent that stores its sessions). T4 a retry of a held prompt is
answered with it; ``$/cancel_request`` of one answers both ``-32800``. T5 after an error the key is
unused. T6 a key is scoped to its session. T7 a retry of a prompt inserted during active work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import orjson
import yaml

from proxy.core.errors import OptionError
from proxy.core.jsonrpc import ErrorCode
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger
from proxy.shell.transports.http_upstream import connect_http
from proxy.shell.transports.stdio import AgentProcess, send_signal, spawn_agent
from proxy.shell.transports.websocket import connect_ws
from proxy.tools import cannot_run

__all__ = [
    "STATUSES",
    "TRACES",
    "CheckOptions",
    "TraceResult",
    "check_agent",
    "check_agent_main",
    "exit_status",
    "render",
    "to_json",
    "to_junit",
]

log = get_logger("proxy.check")

PROXY_START_TIMEOUT = 30.0
"""Seconds a listening proxy has to say where it listens."""


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What to check, and how."""

    agent_argv: tuple[str, ...]
    transport: str = "stdio"
    answer_timeout: float = 5.0
    """Seconds to wait for one expected message before judging the trace."""
    loss_wait: float = 1.0
    """Seconds to wait for an answer the proxy is meant to have lost (proof it is lost)."""
    startup_timeout: float = 30.0
    """Seconds an Agent just started (or restarted) has to answer ``initialize``: a slow start (an
    ``npx`` download, a cold JIT, a loaded machine) is not a failure of the RFD."""
    traces: tuple[str, ...] = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")

    @classmethod
    def from_command_line(
        cls, *, agent_argv: Sequence[str], traces: Sequence[str] = (), **settings: Any
    ) -> CheckOptions:
        """The options of ``acp-proxy check-agent``: ``traces`` the names of those to run (none:
        every one); :class:`~proxy.core.errors.OptionError` for a name that is not a trace."""
        names = tuple(traces or TRACES)
        unknown = [name for name in names if name not in TRACES]
        if unknown:
            raise OptionError(f"unknown traces {unknown}; known: {list(TRACES)}")
        return cls(agent_argv=tuple(agent_argv), traces=names, **settings)


@dataclass
class TraceResult:
    """The verdict of one trace."""

    trace: str
    title: str
    status: str
    reason: str = ""
    seconds: float = 0.0


class Fail(Exception):
    """The Agent broke the trace's rule (``diagnose``: what the proxy logged explains it)."""

    def __init__(self, reason: str, *, diagnose: bool = False) -> None:
        super().__init__(reason)
        self.diagnose = diagnose


class Skip(Exception):
    """The Agent lacks what the trace needs."""


class Error(Exception):
    """The check could not be carried out (the proxy did not start, a bug of the checker)."""


STATUSES = ("PASS", "FAIL", "SKIP", "ERROR")
"""A trace's verdict; ERROR: the check itself could not be carried out (not the Agent's fault)."""


class Conversation:
    """One Client connection through the proxy, messages kept as they come."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.seen: list[dict[str, Any]] = []
        self._ids = 0
        self.closed = False

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, message: dict[str, Any]) -> None:
        self.endpoint.send(orjson.dumps({"jsonrpc": "2.0", **message}))

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], wait: float | None = None
    ) -> dict[str, Any] | None:
        """The first message (already seen or new) that matches, or None after ``wait``."""
        for message in self.seen:
            if predicate(message):
                return message
        try:
            async with asyncio.timeout(self.timeout if wait is None else wait):
                while True:
                    received = await self.endpoint.receive()
                    if received is None:
                        self.closed = True
                        return None
                    if not isinstance(received, bytes):
                        continue
                    try:
                        message = orjson.loads(received)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(message, dict):
                        self.seen.append(message)
                        if predicate(message):
                            return message
        except TimeoutError:
            return None

    async def request(
        self, method: str, params: dict[str, Any], wait: float | None = None
    ) -> dict[str, Any]:
        """Send a request and wait for its answer (``wait`` seconds, else the answer timeout)."""
        request_id = self.next_id()
        self.send({"id": request_id, "method": method, "params": params})
        answer = await self.until(lambda m: _answers(m, request_id), wait)
        if answer is None:
            if self.closed:
                raise Fail(f"no answer to {method}: the connection closed", diagnose=True)
            seconds = self.timeout if wait is None else wait
            option = "--answer-timeout" if wait is None else "--startup-timeout"
            raise Fail(f"no answer to {method} within {seconds:g} s ({option})", diagnose=True)
        return answer

    def user_messages(self, session: str, text: str | None = None) -> list[str]:
        found = []
        for message in self.seen:
            update = _update(message, session)
            if (
                update is not None
                and update.get("sessionUpdate") == "user_message"
                and (text is None or _text(update.get("content")) == text)
            ):
                found.append(str(update.get("messageId")))
        return list(dict.fromkeys(found))


def _answers(message: dict[str, Any], request_id: Any) -> bool:
    return message.get("id") == request_id and "method" not in message


def _update(message: dict[str, Any], session: str) -> dict[str, Any] | None:
    params = message.get("params")
    if message.get("method") != "session/update" or not isinstance(params, dict):
        return None
    update = params.get("update")
    if params.get("sessionId") != session or not isinstance(update, dict):
        return None
    return update


def _text(content: Any) -> str | None:
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                return str(block["text"])
    return None


def _prompt(session: str, text: str, key: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return params


def _error_code(answer: dict[str, Any]) -> Any:
    """The code of an error answer (the ``error`` member itself when it is not an object)."""
    error = answer.get("error")
    return error.get("code") if isinstance(error, dict) else error


def _error_message(answer: dict[str, Any]) -> str:
    """`` (the message)`` of an error answer, shortened, or nothing."""
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return f" ({message[:200]})" if isinstance(message, str) and message else ""


def _message_id(answer: dict[str, Any], what: str) -> str:
    result = answer.get("result")
    if "error" in answer:
        raise Fail(f"{what} was answered with error {_error_code(answer)}")
    if not isinstance(result, dict) or not isinstance(result.get("messageId"), str):
        raise Fail(f"{what}: the answer has no messageId (a v2 prompt response carries one)")
    return str(result["messageId"])


DETAILS = ("error", "exit_status", "command", "status")
"""Fields of a proxy's log record that say what went wrong, the first one present shown."""


class Lab:
    """The proxy in front of the Agent for one trace, and the Client connections to it."""

    def __init__(self, options: CheckOptions, directory: Path) -> None:
        self.options = options
        self.directory = directory
        self._processes: list[AgentProcess] = []
        self._proxy: asyncio.subprocess.Process | None = None
        self._url: str | None = None
        self._conversations: list[Conversation] = []
        self.transport = options.transport
        self.keys: list[str] = []
        """The idempotency keys this trace sent (never expected back from the Agent)."""
        self._logs: list[Path] = []
        self._link_ended = asyncio.Event()
        """A listening proxy logged the end of a link (what it says of it is in its log now)."""
        self._copying: asyncio.Task[None] | None = None
        """The task copying a listening proxy's stderr into its log file."""

    def key(self, name: str) -> str:
        """A fresh idempotency key for one submission (``name`` says which, in reports)."""
        key = f"{name}-{uuid.uuid4()}"
        self.keys.append(key)
        return key

    def _log_file(self) -> Any:
        path = self.directory / f"proxy-{len(self._logs) + 1}.log"
        self._logs.append(path)
        return path.open("ab", buffering=0)

    async def diagnosis(self) -> str:
        """What the proxies said went wrong (the Agent's exit, a command not found), if anything:
        for a reason that would otherwise only say the connection closed."""
        for process in self._processes:  # a proxy whose connection closed is ending: let it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.process.wait()), 2)
        if self._proxy is not None and self._proxy.returncode is None:  # until the link's end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._link_ended.wait(), 2)
        said: list[str] = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                for line in path.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict) and record.get("level") in ("error", "warning"):
                            detail = next(
                                (record[k] for k in DETAILS if record.get(k) is not None), ""
                            )
                            said.append(
                                f"{record.get('event')}" + (f" ({detail})" if detail else "")
                            )
        for process in self._processes:
            if process.process.returncode not in (None, 0):
                said.append(f"the proxy exited with status {process.process.returncode}")
        return "; ".join(dict.fromkeys(said[-4:]))

    def _faults(self, rules: list[dict[str, Any]]) -> Path:
        path = self.directory / f"faults-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "seed": 1, "rules": rules or _NOOP}))
        return path

    async def start(self, rules: list[dict[str, Any]], *, network: bool = False) -> None:
        """Start the proxy with ``rules`` (``network``: a WebSocket/HTTP listener)."""
        transport = (
            "ws" if network and self.options.transport == "stdio" else self.options.transport
        )
        self._command = [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--log-format",
            "json",
            "--log-level",
            "warning",
            "--faults",
            str(self._faults(rules)),
            "--state",
            str(self.directory / "state.json"),
        ]
        if transport != "stdio":
            self._command += ["--listen", f"{transport}://127.0.0.1:0/acp", "--keep-upstream"]
            self._command += ["--log-level", "info"]
            self.transport = transport
            await self._start_listener()
        else:
            self.transport = "stdio"
        self._command += ["--", *self.options.agent_argv]

    async def _start_listener(self) -> None:
        command = [*self._command, "--", *self.options.agent_argv]
        self._proxy = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, limit=DEFAULT_MAX_MESSAGE_BYTES,
        )  # fmt: skip
        assert self._proxy.stderr is not None
        log_file = self._log_file()
        try:
            async with asyncio.timeout(PROXY_START_TIMEOUT):
                while True:
                    line = await self._proxy.stderr.readline()
                    log_file.write(line)
                    if not line:
                        raise Error("the proxy did not start")
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if record.get("event") == "listening":
                            self._url = str(record["url"])
                            break
        except (Error, TimeoutError) as exc:
            log_file.close()
            if self._proxy.returncode is None:
                send_signal(self._proxy, signal.SIGKILL)
            await self._proxy.wait()
            what = str(exc) or f"the proxy did not listen within {PROXY_START_TIMEOUT:g} s"
            said = await self.diagnosis()
            raise Error(f"{what}: {said or 'it said nothing'}") from None
        self._copying = asyncio.get_running_loop().create_task(
            self._copy(self._proxy.stderr, log_file)
        )

    async def _copy(self, stream: asyncio.StreamReader, into: Any) -> None:
        """The rest of a listening proxy's stderr, into its log file; a link's end is noted."""
        with into:
            while line := await stream.readline():
                into.write(line)
                if b'"link ended"' in line:
                    self._link_ended.set()

    async def connect(self) -> Conversation:
        """A new Client connection (a respawned proxy on stdio)."""
        self._link_ended.clear()  # a diagnosis waits for this connection's link to end
        endpoint: Endpoint
        if self.transport == "stdio":
            with self._log_file() as log_file:  # the proxy's stderr: for diagnosis, not the user
                process = await spawn_agent(
                    self._command,
                    limit=DEFAULT_MAX_MESSAGE_BYTES,
                    grace=1.0,
                    stderr=log_file,
                    announce_exit=False,
                )  # its exit is told in the verdict
            self._processes.append(process)
            endpoint = process
        elif self.transport == "ws":
            assert self._url is not None
            endpoint = await connect_ws(self._url, limit=DEFAULT_MAX_MESSAGE_BYTES)
        else:
            assert self._url is not None
            endpoint = await connect_http(self._url, limit=DEFAULT_MAX_MESSAGE_BYTES)
        conversation = Conversation(endpoint, self.options.answer_timeout)
        self._conversations.append(conversation)
        return conversation

    def disconnect(self, conversation: Conversation) -> None:
        conversation.endpoint.sever(flush=False)

    async def close(self) -> None:
        for conversation in self._conversations:
            conversation.endpoint.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conversation.endpoint.wait_closed(), 5)
        for process in self._processes:
            if process.process.returncode is None:
                process.signal(signal.SIGKILL)
            await process.process.wait()
        if self._proxy is not None and self._proxy.returncode is None:
            send_signal(self._proxy, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proxy.wait(), 10)
            except TimeoutError:
                send_signal(self._proxy, signal.SIGKILL)
                await self._proxy.wait()
        if self._copying is not None:
            await self._copying  # ends with the proxy's stderr

    def keys_echoed(self) -> list[str]:
        """The keys of this trace that appear in what the Agent sent."""
        echoed = []
        for conversation in self._conversations:
            text = orjson.dumps(conversation.seen).decode()
            echoed += [key for key in self.keys if key in text]
        return sorted(set(echoed))


_NOOP = [{"name": "none", "when": {"method": "_check-agent/never"}, "do": {"action": "drop"}}]
_LOSE_PROMPT_ANSWER = {
    "name": "lose-prompt-answer",
    "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
    "schedule": {"nth": [1]},
    "do": {"action": "drop"},
}


async def _open(lab: Lab, conversation: Conversation) -> str:
    init = await conversation.request(
        "initialize",
        {"protocolVersion": 2, "capabilities": {}, "info": {"name": "check-agent", "version": "1"}},
        wait=max(lab.options.startup_timeout, lab.options.answer_timeout),
    )
    result = init.get("result")
    if "error" in init:
        code, message = _error_code(init), _error_message(init)
        if code == ErrorCode.INTERNAL_ERROR:  # the Agent failing, or the proxy giving up on it
            raise Fail(f"initialize was answered with error {code}{message}", diagnose=True)
        raise Skip(f"initialize was refused with error {code}{message}")
    if not isinstance(result, dict):
        raise Fail("initialize was answered without a result object")
    if result.get("protocolVersion") != 2:
        raise Skip(f"the Agent speaks protocol version {result.get('protocolVersion')}, not 2")
    if not isinstance(result.get("capabilities"), dict) or "session" not in result["capabilities"]:
        raise Skip("the Agent does not advertise capabilities.session")
    return await _new_session(conversation)


async def _new_session(conversation: Conversation) -> str:
    answer = await conversation.request("session/new", {"cwd": "/", "mcpServers": []})
    result = answer.get("result")
    session = result.get("sessionId") if isinstance(result, dict) else None
    if not isinstance(session, str):
        raise Fail("session/new gave no sessionId")
    return session


async def _resume(lab: Lab, conversation: Conversation, session: str) -> None:
    startup = max(lab.options.startup_timeout, lab.options.answer_timeout)
    await conversation.request("initialize", {"protocolVersion": 2, "capabilities": {}}, startup)
    answer = await conversation.request(
        "session/resume", {"sessionId": session, "cwd": "/", "replayFrom": {"type": "start"}}
    )
    if "error" in answer:
        code = _error_code(answer)
        if code == -32601:
            raise Fail("session/resume is not implemented (-32601), though capabilities.session is")
        raise Skip(f"session/resume failed ({code}): the Agent does not keep the session")


async def _lost(lab: Lab, conversation: Conversation, request_id: int) -> None:
    """The answer to ``request_id`` must be lost (the trace's rule dropped it)."""
    answer = await conversation.until(lambda m: _answers(m, request_id), lab.options.loss_wait)
    if answer is None:
        return
    if "error" in answer:  # the rule drops a success, the answer a prompt the Agent took gets
        raise Fail(f"the keyed prompt was answered with error {_error_code(answer)}, no messageId")
    raise Fail("the proxy did not lose the first answer")


def _one_insert(conversation: Conversation, session: str, text: str, message_id: str) -> None:
    inserted = conversation.user_messages(session, text)
    if len(inserted) > 1:
        raise Fail(f"{len(inserted)} user messages for one submission: {inserted}")
    if inserted and inserted[0] != message_id:
        raise Fail(f"the retry got {message_id}, but the message inserted was {inserted[0]}")


# -- the traces ----------------------------------------------------------------------------------


async def t0(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    for key in ["", "k" * 256, 42, True, {}, []]:
        answer = await conversation.request("session/prompt", _prompt(session, "T0", key))
        code = _error_code(answer)
        if code != -32602:
            outcome = "a success" if "result" in answer else f"error {code}"
            raise Fail(f"idempotencyKey {json.dumps(key)[:20]} was answered with {outcome}")
    if conversation.user_messages(session, "T0"):
        raise Fail("a prompt with an invalid key was inserted")
    return "six invalid keys answered -32602, nothing inserted"


async def t1(lab: Lab) -> str:
    await lab.start([_LOSE_PROMPT_ANSWER])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    first_id, key = conversation.next_id(), lab.key("K1")
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "A", key)}
    )
    await _lost(lab, conversation, first_id)
    retry = await conversation.request("session/prompt", _prompt(session, "A", key))
    message_id = _message_id(retry, "the retry")
    _one_insert(conversation, session, "A", message_id)
    return f"the retry got the original messageId {message_id}"


async def t2(lab: Lab) -> str:
    sever = {
        "name": "lose-and-sever",
        "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "sever", "side": "client", "moment": "before"},
    }
    await lab.start([sever], network=True)
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    first_id, key = conversation.next_id(), lab.key("K2")
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "B", key)}
    )
    await conversation.until(lambda m: _answers(m, first_id))
    inserted = conversation.user_messages(session, "B")
    lab.disconnect(conversation)
    again = await lab.connect()
    await _resume(lab, again, session)
    retry = await again.request("session/prompt", _prompt(session, "B", key))
    message_id = _message_id(retry, "the retry after resume")
    replayed = again.user_messages(session, "B")
    if len(replayed) > 1:
        raise Fail(f"{len(replayed)} copies of the submission in the session: {replayed}")
    if inserted and message_id != inserted[0]:
        raise Fail(f"the retry got {message_id}, the first attempt inserted {inserted[0]}")
    return f"after reconnecting and resuming, the retry got {message_id}"


async def t3(lab: Lab) -> str:
    # The Agent answered (so it inserted, and stored, the message): the answer is lost and the
    # Agent killed at that moment; the proxy starts a new one on the same connection.
    answered = {"direction": "to_client", "kind": "response", "method": "session/prompt"}
    lose = {"name": "lose", "when": answered, "schedule": {"nth": [1]}, "do": {"action": "drop"}}
    kill = {
        "name": "kill-agent",
        "when": answered,
        "schedule": {"nth": [1]},
        "do": {"action": "kill_agent", "respawn": True},
    }
    await lab.start([{**lose, "continue": True}, kill])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    first_id, key = conversation.next_id(), lab.key("K3")
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "C", key)}
    )
    await _lost(lab, conversation, first_id)
    inserted = conversation.user_messages(session, "C")
    if conversation.closed or lab.transport == "http":
        # Over Streamable HTTP every initialize opens a new connection: reconnect for it.
        conversation = await lab.connect()
    await _resume(lab, conversation, session)
    replayed_before = conversation.user_messages(session, "C")
    retry = await conversation.request("session/prompt", _prompt(session, "C", key))
    message_id = _message_id(retry, "the retry after the restart")
    everything = sorted(set(inserted) | set(replayed_before) | {message_id})
    if replayed_before and message_id not in replayed_before:
        raise Fail(f"history holds {replayed_before} but the retry inserted {message_id}")
    if len(set(replayed_before)) > 1:
        raise Fail(f"history holds {len(replayed_before)} copies of the submission")
    return f"after the Agent restarted, one copy of the submission: {everything[-1]}"


async def t4(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    await conversation.request("session/prompt", _prompt(session, "long task", lab.key("K0")))
    first, second, key = conversation.next_id(), conversation.next_id(), lab.key("K4")
    conversation.send(
        {"id": first, "method": "session/prompt", "params": _prompt(session, "D", key)}
    )
    conversation.send(
        {"id": second, "method": "session/prompt", "params": _prompt(session, "D", key)}
    )
    answers = [
        await conversation.until(functools.partial(_answers, request_id=i)) for i in (first, second)
    ]
    if any(answer is None for answer in answers):
        raise Fail("a request for the held prompt was never answered")
    ids = {_message_id(answer, "a held prompt") for answer in answers if answer is not None}
    if len(ids) != 1:
        raise Fail(f"the two requests with one key got different messageIds: {sorted(ids)}")
    _one_insert(conversation, session, "D", ids.pop())
    # variant a: $/cancel_request of one request of a held key answers both -32800
    await conversation.request("session/prompt", _prompt(session, "long task 2", lab.key("K0b")))
    third, fourth, key = conversation.next_id(), conversation.next_id(), lab.key("K4a")
    conversation.send(
        {"id": third, "method": "session/prompt", "params": _prompt(session, "D2", key)}
    )
    conversation.send(
        {"id": fourth, "method": "session/prompt", "params": _prompt(session, "D2", key)}
    )
    conversation.send({"method": "$/cancel_request", "params": {"requestId": third}})
    outcomes = []
    for request_id in (third, fourth):
        answer = await conversation.until(functools.partial(_answers, request_id=request_id))
        if answer is None:
            raise Fail("a cancelled held request was never answered")
        outcomes.append(_error_code(answer) if "error" in answer else "success")
    if outcomes == ["success", "success"]:
        return "retries of a held prompt share its answer (the second prompt was not held)"
    if outcomes != [-32800, -32800]:
        raise Fail(f"after $/cancel_request the key's requests got {outcomes}, not -32800 both")
    if conversation.user_messages(session, "D2"):
        raise Fail("the withdrawn prompt was inserted")
    return "held prompt retries share one answer; a cancel withdraws them all with -32800"


async def t5(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    await conversation.request("session/prompt", _prompt(session, "long task", lab.key("K0")))
    held, key = conversation.next_id(), lab.key("K5")
    conversation.send(
        {"id": held, "method": "session/prompt", "params": _prompt(session, "E", key)}
    )
    conversation.send({"method": "$/cancel_request", "params": {"requestId": held}})
    answer = await conversation.until(lambda m: _answers(m, held))
    if answer is None or "error" not in answer:
        raise Skip("could not make the Agent answer a keyed prompt with an error (not held)")
    retry = await conversation.request("session/prompt", _prompt(session, "E", key))
    message_id = _message_id(retry, "the resend after an error")
    await conversation.until(lambda m: message_id in conversation.user_messages(session, "E"))
    if message_id not in conversation.user_messages(session, "E"):
        raise Fail("the resend after an error was not inserted as a fresh submission")
    return "after an error the key was unused: the resend inserted a new message"


async def t6(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    first = await _open(lab, conversation)
    second = await _new_session(conversation)
    key = lab.key("K6")
    one = _message_id(await conversation.request("session/prompt", _prompt(first, "F", key)), "S1")
    other = _message_id(
        await conversation.request("session/prompt", _prompt(second, "G", key)), "S2"
    )
    if one == other:
        raise Fail("the same key in another session was answered as a retry")
    return "the same key in two sessions: two messages"


async def t7(lab: Lab) -> str:
    lose_second = {**_LOSE_PROMPT_ANSWER, "schedule": {"nth": [2]}}
    await lab.start([lose_second])
    conversation = await lab.connect()
    session = await _open(lab, conversation)
    await conversation.request("session/prompt", _prompt(session, "work", lab.key("K0")))
    steer, key = conversation.next_id(), lab.key("K7")
    text = "steer: use staging"
    conversation.send(
        {"id": steer, "method": "session/prompt", "params": _prompt(session, text, key)}
    )
    await _lost(lab, conversation, steer)
    retry = await conversation.request("session/prompt", _prompt(session, text, key))
    message_id = _message_id(retry, "the retry")
    _one_insert(conversation, session, text, message_id)
    return f"the retry of a prompt sent during active work got {message_id}"


TRACES: dict[str, tuple[str, Callable[[Lab], Awaitable[str]]]] = {
    "T0": ("invalid keys are rejected with -32602", t0),
    "T1": ("retry on the same connection", t1),
    "T2": ("retry after session/resume on a new connection", t2),
    "T3": ("retry after an Agent restart with a stored session", t3),
    "T4": ("retry while the prompt is held; cancel of a held key", t4),
    "T5": ("retry after an error", t5),
    "T6": ("same key in another session", t6),
    "T7": ("retry of a prompt inserted during active work", t7),
}


@contextlib.asynccontextmanager
async def _lab(options: CheckOptions) -> AsyncIterator[Lab]:
    with tempfile.TemporaryDirectory(prefix="acp-check-") as directory:
        lab = Lab(options, Path(directory))
        try:
            yield lab
        finally:
            await lab.close()


async def check_agent(options: CheckOptions) -> list[TraceResult]:
    """Run the traces one after the other, each with a proxy and an Agent of its own."""
    results = []
    for name in options.traces:
        title, run = TRACES[name]
        started = time.monotonic()
        result = TraceResult(name, title, "PASS")
        try:
            async with _lab(options) as lab:
                try:
                    result.reason = await run(lab)
                    echoed = lab.keys_echoed()
                    if echoed:
                        raise Fail(f"the Agent echoed keys: {echoed}")
                except Fail as exc:
                    result.status, result.reason = "FAIL", str(exc)
                    if exc.diagnose:
                        said = await lab.diagnosis()
                        result.reason += f"; the proxy says: {said}" if said else ""
                if lab.transport != options.transport:
                    result.title += f" (over {lab.transport}: a reconnect needs a listener)"
        except Skip as exc:
            result.status, result.reason = "SKIP", str(exc)
        except Error as exc:
            result.status, result.reason = "ERROR", str(exc)
        except Exception as exc:  # a bug of the checker (or what an Agent did that it missed)
            log.exception("the check itself failed", trace=name)
            result.status, result.reason = "ERROR", f"checker error: {type(exc).__name__}: {exc}"
        result.seconds = round(time.monotonic() - started, 3)
        log.info("trace done", trace=name, status=result.status, reason=result.reason)
        results.append(result)
    return results


def render(results: list[TraceResult], options: CheckOptions) -> str:
    """A table for people."""
    lines = [f"check-agent over {options.transport}: {' '.join(options.agent_argv)}", ""]
    for result in results:
        lines.append(f"{result.trace}  {result.status:<4}  {result.title}")
        if result.reason:
            lines.append(f"          {result.reason}")
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    summary = f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
    if counts["ERROR"]:
        summary += f", {counts['ERROR']} could not be checked"
    lines += ["", summary]
    if results and counts["SKIP"] == len(results):
        lines.append("nothing was checked: every trace was skipped (exit status 2)")
    return "\n".join(lines)


def exit_status(results: list[TraceResult]) -> int:
    """1 when a trace failed; else 2 when one could not be checked, or every one was skipped
    (nothing was checked, which CI should not take for a pass); else 0."""
    if any(result.status == "FAIL" for result in results):
        return 1
    if any(result.status == "ERROR" for result in results):
        return 2
    return 2 if results and all(result.status == "SKIP" for result in results) else 0


def to_json(results: list[TraceResult]) -> str:
    """The results as JSON."""
    return json.dumps([asdict(result) for result in results], indent=2)


def to_junit(results: list[TraceResult], options: CheckOptions) -> bytes:
    """JUnit XML, one test case per trace, for CI dashboards."""
    suite = ElementTree.Element(
        "testsuite",
        name=f"acp-check-agent-{options.transport}",
        tests=str(len(results)),
        failures=str(sum(r.status == "FAIL" for r in results)),
        errors=str(sum(r.status == "ERROR" for r in results)),
        skipped=str(sum(r.status == "SKIP" for r in results)),
    )
    for result in results:
        case = ElementTree.SubElement(
            suite, "testcase", classname="acp.idempotency", name=f"{result.trace} {result.title}",
            time=str(result.seconds),
        )  # fmt: skip
        if result.status == "FAIL":
            ElementTree.SubElement(case, "failure", message=result.reason)
        elif result.status == "ERROR":
            ElementTree.SubElement(case, "error", message=result.reason)
        elif result.status == "SKIP":
            ElementTree.SubElement(case, "skipped", message=result.reason)
    xml: bytes = ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True)
    return xml


def check_agent_main(options: CheckOptions, *, as_json: bool, junit: Path | None) -> int:
    """``acp-proxy check-agent``: run the traces, print the results (a table, or JSON), write
    them as JUnit XML to ``junit`` if given; the exit status (:func:`exit_status`), 2 when the
    Agent cannot be run."""
    why = cannot_run(options.agent_argv)
    if why is not None:
        sys.stderr.write(f"error: {why}\n")
        return 2
    results = asyncio.run(check_agent(options))
    sys.stdout.write((to_json(results) if as_json else render(results, options)) + "\n")
    if junit is not None:
        junit.write_bytes(to_junit(results, options))
    return exit_status(results)
