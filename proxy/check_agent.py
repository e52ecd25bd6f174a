"""``acp-proxy check-agent``: the idempotency RFD's conformance traces, run against any Agent.

Each trace (T0-T7 of the wire brief, section 5) starts the proxy in front of the Agent with a fault
file of its own, talks to it as a Client over ``--transport`` (stdio, ws or http: the transport
between this checker and the proxy; the proxy always spawns the Agent over stdio), provokes the
loss the trace is about, and judges what came back: PASS, FAIL with the reason, or SKIP with the
missing capability. Every trace also checks that the key never appears in what the Agent sends.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import orjson
import yaml

from proxy.endpoint import Endpoint
from proxy.log import get_logger
from proxy.transports.http_upstream import connect_http
from proxy.transports.stdio import AgentProcess, send_signal, spawn_agent
from proxy.transports.websocket import connect_ws

__all__ = ["TRACES", "CheckOptions", "TraceResult", "check_agent", "render", "to_json", "to_junit"]

log = get_logger("proxy.check")

LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What to check, and how."""

    agent_argv: tuple[str, ...]
    transport: str = "stdio"
    answer_timeout: float = 5.0
    """Seconds to wait for one expected message before judging the trace."""
    loss_wait: float = 1.0
    """Seconds to wait for an answer the proxy is meant to have lost (proof it is lost)."""
    traces: tuple[str, ...] = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")


@dataclass
class TraceResult:
    """The verdict of one trace."""

    trace: str
    title: str
    status: str
    reason: str = ""
    seconds: float = 0.0


class Fail(Exception):
    """The Agent broke the trace's rule."""


class Skip(Exception):
    """The Agent lacks what the trace needs."""


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

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id()
        self.send({"id": request_id, "method": method, "params": params})
        answer = await self.until(lambda m: _answers(m, request_id))
        if answer is None:
            raise Fail(f"no answer to {method}" + (" (connection closed)" if self.closed else ""))
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


def _message_id(answer: dict[str, Any], what: str) -> str:
    result = answer.get("result")
    if "error" in answer:
        raise Fail(f"{what} was answered with error {answer['error'].get('code')}")
    if not isinstance(result, dict) or not isinstance(result.get("messageId"), str):
        raise Fail(f"{what}: the answer has no messageId (a v2 prompt response carries one)")
    return str(result["messageId"])


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
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self._proxy.stderr is not None
        async with asyncio.timeout(30):
            while True:
                line = await self._proxy.stderr.readline()
                if not line:
                    raise Fail("the proxy did not start")
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") == "listening":
                        self._url = str(record["url"])
                        break
        asyncio.get_running_loop().create_task(_drain(self._proxy.stderr))

    async def connect(self) -> Conversation:
        """A new Client connection (a respawned proxy on stdio)."""
        endpoint: Endpoint
        if self.transport == "stdio":
            process = await spawn_agent(self._command, limit=LIMIT, grace=1.0)
            self._processes.append(process)
            endpoint = process
        elif self.transport == "ws":
            assert self._url is not None
            endpoint = await connect_ws(self._url, limit=LIMIT)
        else:
            assert self._url is not None
            endpoint = await connect_http(self._url, limit=LIMIT)
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

    def keys_echoed(self, keys: list[str]) -> list[str]:
        echoed = []
        for conversation in self._conversations:
            text = orjson.dumps(conversation.seen).decode()
            echoed += [key for key in keys if key in text]
        return sorted(set(echoed))


_NOOP = [{"name": "none", "when": {"method": "_check-agent/never"}, "do": {"action": "drop"}}]
_LOSE_PROMPT_ANSWER = {
    "name": "lose-prompt-answer",
    "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
    "schedule": {"nth": [1]},
    "do": {"action": "drop"},
}


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _open(conversation: Conversation) -> str:
    init = await conversation.request(
        "initialize",
        {"protocolVersion": 2, "capabilities": {}, "info": {"name": "check-agent", "version": "1"}},
    )
    result = init.get("result")
    if not isinstance(result, dict):
        raise Skip("initialize failed")
    if result.get("protocolVersion") != 2:
        raise Skip(f"the Agent speaks protocol version {result.get('protocolVersion')}, not 2")
    if not isinstance(result.get("capabilities"), dict) or "session" not in result["capabilities"]:
        raise Skip("the Agent does not advertise capabilities.session")
    answer = await conversation.request("session/new", {"cwd": "/", "mcpServers": []})
    session = (answer.get("result") or {}).get("sessionId")
    if not isinstance(session, str):
        raise Fail("session/new gave no sessionId")
    return session


async def _resume(conversation: Conversation, session: str) -> None:
    await conversation.request("initialize", {"protocolVersion": 2, "capabilities": {}})
    answer = await conversation.request(
        "session/resume", {"sessionId": session, "cwd": "/", "replayFrom": {"type": "start"}}
    )
    if "error" in answer:
        code = answer["error"].get("code")
        raise Skip(f"session/resume failed ({code}): the Agent does not keep the session")


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
    session = await _open(conversation)
    for key in ["", "k" * 256, 42, True, {}, []]:
        answer = await conversation.request("session/prompt", _prompt(session, "T0", key))
        code = (answer.get("error") or {}).get("code")
        if code != -32602:
            outcome = "a success" if "result" in answer else f"error {code}"
            raise Fail(f"idempotencyKey {json.dumps(key)[:20]} was answered with {outcome}")
    if conversation.user_messages(session, "T0"):
        raise Fail("a prompt with an invalid key was inserted")
    return "six invalid keys answered -32602, nothing inserted"


async def t1(lab: Lab) -> str:
    await lab.start([_LOSE_PROMPT_ANSWER])
    conversation = await lab.connect()
    session = await _open(conversation)
    first_id = conversation.next_id()
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "A", "K1")}
    )
    lost = await conversation.until(lambda m: _answers(m, first_id), lab.options.loss_wait)
    if lost is not None:
        raise Fail("the proxy did not lose the first answer")
    retry = await conversation.request("session/prompt", _prompt(session, "A", "K1"))
    message_id = _message_id(retry, "the retry")
    _one_insert(conversation, session, "A", message_id)
    return f"the retry got the original messageId {message_id}"


async def t2(lab: Lab) -> str:
    sever = {
        "name": "lose-and-sever",
        "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
        "schedule": {"nth": [1]},
        "do": {"action": "sever", "side": "client", "when": "before"},
    }
    await lab.start([sever], network=True)
    conversation = await lab.connect()
    session = await _open(conversation)
    first_id = conversation.next_id()
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "B", "K2")}
    )
    await conversation.until(lambda m: _answers(m, first_id))
    inserted = conversation.user_messages(session, "B")
    lab.disconnect(conversation)
    again = await lab.connect()
    await _resume(again, session)
    retry = await again.request("session/prompt", _prompt(session, "B", "K2"))
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
    session = await _open(conversation)
    first_id = conversation.next_id()
    conversation.send(
        {"id": first_id, "method": "session/prompt", "params": _prompt(session, "C", "K3")}
    )
    if await conversation.until(lambda m: _answers(m, first_id), lab.options.loss_wait):
        raise Fail("the proxy did not lose the answer")
    inserted = conversation.user_messages(session, "C")
    if conversation.closed or lab.transport == "http":
        # Over Streamable HTTP every initialize opens a new connection: reconnect for it.
        conversation = await lab.connect()
    await _resume(conversation, session)
    replayed_before = conversation.user_messages(session, "C")
    retry = await conversation.request("session/prompt", _prompt(session, "C", "K3"))
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
    session = await _open(conversation)
    await conversation.request("session/prompt", _prompt(session, "long task", "K0"))
    first, second = conversation.next_id(), conversation.next_id()
    conversation.send(
        {"id": first, "method": "session/prompt", "params": _prompt(session, "D", "K4")}
    )
    conversation.send(
        {"id": second, "method": "session/prompt", "params": _prompt(session, "D", "K4")}
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
    await conversation.request("session/prompt", _prompt(session, "long task 2", "K0b"))
    third, fourth = conversation.next_id(), conversation.next_id()
    conversation.send(
        {"id": third, "method": "session/prompt", "params": _prompt(session, "D2", "K4a")}
    )
    conversation.send(
        {"id": fourth, "method": "session/prompt", "params": _prompt(session, "D2", "K4a")}
    )
    conversation.send({"method": "$/cancel_request", "params": {"requestId": third}})
    outcomes = []
    for request_id in (third, fourth):
        answer = await conversation.until(functools.partial(_answers, request_id=request_id))
        if answer is None:
            raise Fail("a cancelled held request was never answered")
        outcomes.append((answer.get("error") or {}).get("code", "success"))
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
    session = await _open(conversation)
    await conversation.request("session/prompt", _prompt(session, "long task", "K0"))
    held = conversation.next_id()
    conversation.send(
        {"id": held, "method": "session/prompt", "params": _prompt(session, "E", "K5")}
    )
    conversation.send({"method": "$/cancel_request", "params": {"requestId": held}})
    answer = await conversation.until(lambda m: _answers(m, held))
    if answer is None or "error" not in answer:
        raise Skip("could not make the Agent answer a keyed prompt with an error (not held)")
    retry = await conversation.request("session/prompt", _prompt(session, "E", "K5"))
    message_id = _message_id(retry, "the resend after an error")
    await conversation.until(lambda m: message_id in conversation.user_messages(session, "E"))
    if message_id not in conversation.user_messages(session, "E"):
        raise Fail("the resend after an error was not inserted as a fresh submission")
    return "after an error the key was unused: the resend inserted a new message"


async def t6(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    first = await _open(conversation)
    answer = await conversation.request("session/new", {"cwd": "/", "mcpServers": []})
    second = (answer.get("result") or {}).get("sessionId")
    if not isinstance(second, str):
        raise Fail("session/new gave no sessionId")
    one = _message_id(await conversation.request("session/prompt", _prompt(first, "F", "K6")), "S1")
    other = _message_id(
        await conversation.request("session/prompt", _prompt(second, "G", "K6")), "S2"
    )
    if one == other:
        raise Fail("the same key in another session was answered as a retry")
    return "the same key in two sessions: two messages"


async def t7(lab: Lab) -> str:
    lose_second = {**_LOSE_PROMPT_ANSWER, "schedule": {"nth": [2]}}
    await lab.start([lose_second])
    conversation = await lab.connect()
    session = await _open(conversation)
    await conversation.request("session/prompt", _prompt(session, "work", "K0"))
    steer = conversation.next_id()
    text = "steer: use staging"
    conversation.send(
        {"id": steer, "method": "session/prompt", "params": _prompt(session, text, "K7")}
    )
    if await conversation.until(lambda m: _answers(m, steer), lab.options.loss_wait) is not None:
        raise Fail("the proxy did not lose the answer")
    retry = await conversation.request("session/prompt", _prompt(session, text, "K7"))
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
KEYS = ["K0", "K0b", "K1", "K2", "K3", "K4", "K4a", "K5", "K6", "K7"]


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
                result.reason = await run(lab)
                echoed = [key for key in lab.keys_echoed(KEYS) if len(key) > 1]
                if echoed:
                    raise Fail(f"the Agent echoed keys: {echoed}")
        except Fail as exc:
            result.status, result.reason = "FAIL", str(exc)
        except Skip as exc:
            result.status, result.reason = "SKIP", str(exc)
        except Exception as exc:  # an Agent that breaks the protocol badly is a FAIL, not a crash
            result.status, result.reason = "FAIL", f"{type(exc).__name__}: {exc}"
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
    counts = {
        status: sum(r.status == status for r in results) for status in ("PASS", "FAIL", "SKIP")
    }
    lines += ["", f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"]
    return "\n".join(lines)


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
        skipped=str(sum(r.status == "SKIP" for r in results)),
    )
    for result in results:
        case = ElementTree.SubElement(
            suite, "testcase", classname="acp.idempotency", name=f"{result.trace} {result.title}",
            time=str(result.seconds),
        )  # fmt: skip
        if result.status == "FAIL":
            ElementTree.SubElement(case, "failure", message=result.reason)
        elif result.status == "SKIP":
            ElementTree.SubElement(case, "skipped", message=result.reason)
    xml: bytes = ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True)
    return xml
