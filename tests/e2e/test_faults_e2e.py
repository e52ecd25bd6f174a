"""Every stdio fault action end to end: a real proxy process between real Client and Agent peers.

Each test writes a fault file into ``tmp_path``, starts ``python -m proxy run --faults FILE`` and
checks what *each* side saw: the Client through the proxy's stdout (the test itself as a raw
Client, or the official ACP SDK's Client in-process), the Agent through its own record (the
scripted raw Agent's capture file, or the SDK Agent's ``_sdk_agent/state``). The proxy's log
(``--log-format json`` on stderr) is read for the ``fault injected`` lines.

Nothing waits by sleeping: a "never arrives" is shown by a later message that does arrive first
(per direction the proxy keeps order), a log line is awaited on the proxy's stderr as it comes,
within ``TIMEOUT``. Only timer-based faults (``delay``, ``after_ms``) depend on the clock, and
only as lower bounds or with a wide margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
import yaml
from acp import PROTOCOL_VERSION, Client, RequestError, spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.core import ClientSideConnection
from acp.schema import AgentMessageChunk, Implementation, TextContentBlock
from harness import (
    PEERS,
    RAW_AGENT,
    TIMEOUT,
    ProxyProcess,
    captured,
    log_events,
    notification,
    raw_agent,
    request,
    say,
)

from proxy.tools.report import report_main

SDK_AGENT = [sys.executable, str(PEERS / "sdk_agent.py")]
"""argv of the Agent built on the official SDK (see ``tests/support/peers/sdk_agent.py``)."""
LIMIT = 64 * 1024 * 1024
SWALLOWED = "answer to an injected copy swallowed"

Start = Callable[..., Awaitable["ProxyProcess"]]


# -- fault files ---------------------------------------------------------------------------------


def rule(
    name: str, do: dict[str, Any], schedule: dict[str, Any] | None = None, **when: Any
) -> dict[str, Any]:
    """One rule of a fault file: ``when`` from the keyword arguments."""
    data: dict[str, Any] = {"name": name, "when": when, "do": do}
    if schedule is not None:
        data["schedule"] = schedule
    return data


def fault_file(
    directory: Path, *rules: dict[str, Any], seed: int | None = None, name: str = "faults.yaml"
) -> Path:
    """Write a fault file (YAML, or JSON when ``name`` ends in ``.json``); its path."""
    data: dict[str, Any] = {"version": 1}
    if seed is not None:
        data["seed"] = seed
    data["rules"] = list(rules)
    path = directory / name
    if name.endswith(".json"):
        path.write_text(json.dumps(data, indent=2))
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- the proxy as a subprocess, with the test as raw Client ---------------------------------------


@contextlib.asynccontextmanager
async def proxies() -> AsyncIterator[Start]:
    """Start proxies (JSON logs) in front of Agents; kill whatever is left at the end."""
    started: list[ProxyProcess] = []

    async def _start(agent: list[str], *options: str) -> ProxyProcess:
        proxy = await ProxyProcess.start(agent, "--log-format", "json", *options)
        started.append(proxy)
        return proxy

    try:
        yield _start
    finally:
        for proxy in started:
            await proxy.stop()


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Start proxies in front of Agents for one test."""
    async with proxies() as _start:
        yield _start


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """The file the scripted raw Agent records every line it reads into."""
    return tmp_path / "agent-saw.jsonl"


def exits_with(status: int, agent: list[str]) -> list[str]:
    """``agent`` run by a shell that exits with ``status`` once the Agent has exited."""
    return ["sh", "-c", f'"$0" "$@"; exit {status}', *agent]


def raw_agent_per_process(directory: Path) -> list[str]:
    """The raw Agent, recording into ``directory/PID.jsonl``: one capture per Agent process."""
    directory.mkdir(exist_ok=True)
    return [
        "sh",
        "-c",
        'exec "$0" "$1" "$2/$$.jsonl"',
        sys.executable,
        str(RAW_AGENT),
        str(directory),
    ]


def with_id(line: bytes, old: object, new: object) -> bytes:
    """``line`` (as :func:`encode` writes it) with its ``id`` member replaced."""
    before = b'"id":' + json.dumps(old).encode()
    assert line.count(before) == 1, line
    return line.replace(before, b'"id":' + json.dumps(new).encode())


def is_answer(message: Any, request_id: object) -> bool:
    """Whether ``message`` is the response (result or error) to ``request_id``, type included."""
    return (
        isinstance(message, dict)
        and "method" not in message
        and "id" in message
        and type(message["id"]) is type(request_id)
        and message["id"] == request_id
    )


async def lines_until_answer(proxy: ProxyProcess, request_id: object) -> tuple[Any, list[bytes]]:
    """Read until the answer to ``request_id``: (that answer, every line read before it)."""
    before: list[bytes] = []
    while True:
        line = await proxy.recv()
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if is_answer(message, request_id):
                return message, before
        before.append(line)


async def barrier(proxy: ProxyProcess, token: str) -> list[bytes]:
    """A request answered by the Agent; the lines the Client read before its answer.

    Once it is answered the Agent has read everything sent before it, and (per direction the proxy
    keeps order) the Client has been given everything the Agent wrote before it.
    """
    await proxy.send(request(token, "_test/barrier"))
    _, before = await lines_until_answer(proxy, token)
    return before


async def answer_to(proxy: ProxyProcess, request_id: object) -> tuple[Any, list[Any]]:
    """The answer to ``request_id`` and the messages that came before it, all parsed."""
    found, before = await lines_until_answer(proxy, request_id)
    return found, [json.loads(line) for line in before]


# -- the proxy's log -------------------------------------------------------------------------------


def faults_of(text: str, rule_name: str) -> list[dict[str, Any]]:
    """The ``fault injected`` log records of one rule."""
    return [r for r in log_events(text, "fault injected") if r.get("rule") == rule_name]


class Logs(Protocol):
    """A process's stderr, collected as it comes."""

    news: asyncio.Event
    """Set whenever more has been collected."""

    @property
    def stderr(self) -> str:
        """Everything collected so far."""
        ...


async def until_logged(logs: Logs, event: str, count: int = 1) -> None:
    """Wait until ``event`` has been logged ``count`` times."""
    async with asyncio.timeout(TIMEOUT):
        while len(log_events(logs.stderr, event)) < count:
            logs.news.clear()
            await logs.news.wait()


# -- ACP with the SDK Agent behind the proxy, the test as raw Client -----------------------------


async def initialize(proxy: ProxyProcess, request_id: object = "init") -> None:
    """``initialize`` the Agent (checked)."""
    params = {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": {}}
    await proxy.send(request(request_id, "initialize", params))
    answer, _ = await answer_to(proxy, request_id)
    assert answer["result"]["agentInfo"]["name"] == "sdk-agent", answer


async def new_session(proxy: ProxyProcess, request_id: object = "new") -> str:
    """``session/new``; the new session's id."""
    await proxy.send(request(request_id, "session/new", {"cwd": os.getcwd(), "mcpServers": []}))
    answer, _ = await answer_to(proxy, request_id)
    return str(answer["result"]["sessionId"])


async def sdk_agent_session(start: Start, faults: Path, *options: str) -> tuple[ProxyProcess, str]:
    """A proxy with ``faults`` (and ``options``) in front of the SDK Agent, and a session's id.

    The Agent is initialized and the session new (:func:`initialize`, :func:`new_session`).
    """
    proxy = await start(SDK_AGENT, "--faults", str(faults), *options)
    await initialize(proxy)
    return proxy, await new_session(proxy)


def prompt_request(request_id: object, session: str, text: str, key: str | None = None) -> bytes:
    """A ``session/prompt`` of one text block, keyed when ``key`` is given."""
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return request(request_id, "session/prompt", params)


def chunk_texts(messages: list[Any]) -> list[str]:
    """The texts of the agent message chunks among ``messages``."""
    return [
        m["params"]["update"]["content"]["text"]
        for m in messages
        if isinstance(m, dict)
        and m.get("method") == "session/update"
        and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


async def agent_state(proxy: ProxyProcess, request_id: object) -> dict[str, Any]:
    """The SDK Agent's own record (pid, requests, prompts) via ``_sdk_agent/state``."""
    await proxy.send(request(request_id, "_sdk_agent/state", {}))
    answer, _ = await answer_to(proxy, request_id)
    return cast(dict[str, Any], answer["result"])


# -- the SDK Client in-process, the proxy and the SDK Agent as subprocesses -----------------------


class SdkClient:
    """The Client side on the official SDK: records every message and every agent chunk."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.wire: list[StreamEvent] = []
        self._news = asyncio.Event()

    def observe(self, event: StreamEvent) -> None:
        self.wire.append(event)
        self._news.set()

    def received(self) -> list[dict[str, Any]]:
        """The messages that came from the proxy, in order."""
        return [e.message for e in self.wire if e.direction is StreamDirection.INCOMING]

    def sent_ids(self, method: str) -> list[Any]:
        """The ids of the requests of ``method`` the SDK Client sent, in order."""
        return [
            e.message["id"]
            for e in self.wire
            if e.direction is StreamDirection.OUTGOING and e.message.get("method") == method
        ]

    def answers_to(self, request_id: object) -> list[dict[str, Any]]:
        """The responses that came back under ``request_id``."""
        return [m for m in self.received() if is_answer(m, request_id)]

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds (checked after every recorded event)."""
        async with asyncio.timeout(TIMEOUT):
            while not predicate():
                self._news.clear()
                await self._news.wait()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.chunks.append(update.content.text)
            self._news.set()


class Stderr:
    """Collects a subprocess's stderr while it runs."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self._buffer = bytearray()
        self.news = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._collect(stream))

    async def _collect(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._buffer += chunk
            self.news.set()

    @property
    def stderr(self) -> str:
        """What was written so far."""
        return self._buffer.decode("utf-8", "replace")

    async def close(self) -> None:
        """Wait for the end of the stream (the process has exited), or give up."""
        try:
            await asyncio.wait_for(self._task, TIMEOUT)
        finally:
            self._task.cancel()


@contextlib.asynccontextmanager
async def sdk_client_session(
    client: SdkClient, *options: str
) -> AsyncIterator[tuple[ClientSideConnection, asyncio.subprocess.Process, Stderr]]:
    """The SDK Client launching ``python -m proxy run OPTIONS -- SDK_AGENT`` as its Agent.

    Yields the connection, the proxy process and its stderr (JSON logs, and the Agent's). On
    leaving, the proxy's stdin is closed and the proxy waited for, as a real Client does.
    """
    stderr: Stderr | None = None
    try:
        async with spawn_agent_process(
            cast(Client, client),
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--log-format",
            "json",
            *options,
            "--",
            *SDK_AGENT,
            transport_kwargs={
                "limit": LIMIT,
                "stderr": asyncio.subprocess.PIPE,
                "shutdown_timeout": TIMEOUT,
            },
            observers=[client.observe],
        ) as (conn, process):
            assert process.stderr is not None
            stderr = Stderr(process.stderr)
            yield conn, process, stderr
    finally:
        if stderr is not None:
            await stderr.close()


async def open_session(conn: ClientSideConnection) -> str:
    """``initialize`` and ``session/new`` with the SDK Client; the session id."""
    async with asyncio.timeout(TIMEOUT):
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_info=Implementation(name="pytest", version="0"),
        )
        assert init.agent_info is not None
        assert init.agent_info.name == "sdk-agent"
        return (await conn.new_session(cwd=os.getcwd(), mcp_servers=[])).session_id


async def sdk_prompt(conn: ClientSideConnection, session: str, text: str) -> str:
    """One prompt of one text block with the SDK Client; the stop reason."""
    response = await asyncio.wait_for(
        conn.prompt(session_id=session, prompt=[TextContentBlock(text=text)]), TIMEOUT
    )
    return str(response.stop_reason)


async def sdk_state(conn: ClientSideConnection) -> dict[str, Any]:
    """The SDK Agent's own record, asked by the SDK Client."""
    return await asyncio.wait_for(conn.ext_method("sdk_agent/state", {}), TIMEOUT)


# == drop ==========================================================================================


async def test_dropped_response_reaches_the_agent_but_never_the_client(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """drop on a response: the Agent answered the prompt, the Client gets only the next answer."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-prompt-answer",
            {"action": "drop"},
            None,
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    first = request(
        1, "session/prompt", {"sessionId": "S", "prompt": [{"type": "text", "text": "one"}]}
    )
    second = request(2, "_x/next", {"n": 2})
    await proxy.send(first, second)

    answer = await proxy.recv_json()
    assert answer["id"] == 2  # the next response the Client reads is the later request's
    assert await barrier(proxy, "b") == []
    # The Agent got the prompt (under the proxy's id 0) and the later request, and answered both.
    assert captured(capture)[:2] == [with_id(first, 1, 0), with_id(second, 2, 1)]
    (fault,) = faults_of(proxy.stderr, "lose-prompt-answer")
    assert (fault["action"], fault["direction"], fault["kind"]) == ("drop", "to_client", "response")
    assert fault["method"] == "session/prompt"


async def test_dropped_request_never_reaches_the_agent(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """drop on a request: the Agent never sees it (no id is minted for it), the Client no answer."""
    faults = fault_file(
        tmp_path,
        rule("lose-request", {"action": "drop"}, None, direction="to_agent", method="_x/lost"),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(request("lost", "_x/lost", {"a": 1}))
    assert await barrier(proxy, "b") == []  # no answer for "lost" came first
    assert captured(capture) == [request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "lose-request")) == 1


async def test_sdk_dropped_prompt_response_leaves_the_sdk_client_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the 1st prompt's answer is lost, though the Agent ran it; the 2nd's comes."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-first-prompt-answer",
            {"action": "drop"},
            {"nth": [1]},
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        first = asyncio.create_task(  # noqa: TID251 - the test cancels and awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="echo one")])
        )
        await client.until(lambda: "one" in client.chunks)  # the Agent acted on the prompt
        assert await sdk_prompt(conn, session, "echo two") == "end_turn"
        state = await sdk_state(conn)
        assert not first.done()  # its answer would have come before the 2nd one's

        first_id, second_id = client.sent_ids("session/prompt")
        assert client.answers_to(first_id) == []
        assert len(client.answers_to(second_id)) == 1
        assert [(p["text"]) for p in state["prompts"]] == ["echo one", "echo two"]
        assert client.chunks == ["one", "two"]
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(faults_of(stderr.stderr, "lose-first-prompt-answer")) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == delay =========================================================================================


async def test_delayed_messages_are_overtaken_and_still_arrive(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """delay: both ways, a held message arrives after a later undelayed one, byte for byte."""
    faults = fault_file(
        tmp_path,
        rule(
            "slow-request",
            {"action": "delay", "ms": 300},
            None,
            direction="to_agent",
            method="_x/slow",
        ),
        rule(
            "slow-update",
            {"action": "delay", "ms": 300},
            None,
            direction="to_client",
            method="_x/late",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))

    slow, fast = request("slow", "_x/slow", {"n": 1}), request("fast", "_x/fast", {"n": 2})
    await proxy.send(slow, fast)
    assert (await proxy.recv_json())["id"] == "fast"
    assert (await proxy.recv_json())["id"] == "slow"
    # The Agent read the later request first: it got id 1, the held one id 0.
    assert captured(capture) == [with_id(fast, "fast", 1), with_id(slow, "slow", 0)]

    late, early = notification("_x/late", {"n": 1}), notification("_x/early", {"n": 2})
    await proxy.send(say(late, early))
    assert await proxy.recv() == early
    assert await proxy.recv() == late
    assert await barrier(proxy, "b") == []
    assert len(faults_of(proxy.stderr, "slow-request")) == 1
    assert len(faults_of(proxy.stderr, "slow-update")) == 1


async def test_a_delayed_request_is_logged_traced_and_reported_when_it_left(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """delay, as a user sees it afterwards: the debug log and the trace say the request was held
    when it arrived and relayed when its timer fired, after the request that overtook it. The
    rule holds its answer too (an answer takes its request's method): the answer's duration
    counts both holds. ``report`` counts each message once, and both as held by the rule."""
    faults = fault_file(
        tmp_path,
        rule("slow-request", {"action": "delay", "ms": 300}, None, method="_x/slow"),
    )
    trace = tmp_path / "trace.jsonl"
    proxy = await start(
        raw_agent(capture), "--faults", str(faults), "--trace", str(trace), "--log-level", "debug"
    )
    await proxy.send(request("slow", "_x/slow"), request("fast", "_x/fast"))
    assert (await proxy.recv_json())["id"] == "fast"
    assert (await proxy.recv_json())["id"] == "slow"
    await proxy.close_stdin()
    assert await proxy.wait() == 0

    lines = [json.loads(text) for text in proxy.stderr.splitlines() if text.startswith("{")]
    logged = [
        (line["event"], line.get("method"), line.get("hold"))
        for line in lines
        if line.get("event") in ("held", "relayed") and line.get("direction") == "to_agent"
    ]
    hold = logged[0][2]
    assert logged == [
        ("held", "_x/slow", hold),
        ("relayed", "_x/fast", None),
        ("relayed", "_x/slow", hold),
    ]

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    to_agent = [
        (r["event"], r["method"], r.get("hold"))
        for r in records
        if r.get("direction") == "to_agent"
    ]
    assert to_agent == [
        ("fault", "_x/slow", None),
        ("held", "_x/slow", hold),
        ("message", "_x/fast", None),
        ("message", "_x/slow", hold),
    ]
    [answer] = [r for r in records if r["event"] == "message" and r.get("id") == "slow"][1:]
    assert (answer["kind"], answer["disposition"]) == ("response", "relayed")
    assert answer["duration_ms"] >= 600.0  # the request's hold and its own
    assert "hold" in answer

    output, status = report_main([trace], as_json=True)
    assert status == 0
    summary = json.loads(output)
    assert summary["totals"]["messages_held"] == summary["totals"]["messages_held_sent"] == 2
    assert summary["totals"]["messages_not_relayed"] == 0
    assert [
        (m["direction"], m["kind"], m["method"], m["rules"], m["sent"])
        for m in summary["messages"]["held"]
    ] == [
        ("to_agent", "request", "_x/slow", "slow-request", 1),
        ("to_client", "response", "_x/slow", "slow-request", 1),
    ]
    slow = [
        m
        for m in summary["messages"]["relayed"]
        if (m["direction"], m["method"]) == ("to_agent", "_x/slow")
    ]
    assert [m["count"] for m in slow] == [1]


# == error =========================================================================================


async def test_error_answers_under_the_clients_id_and_nothing_reaches_the_agent(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """error: the Client gets code, message and data under its exact id; the Agent sees nothing."""
    data = {"retryAfterMs": 5, "reasons": ["test", None]}
    faults = fault_file(
        tmp_path,
        rule(
            "refuse",
            {"action": "error", "code": -32042, "message": "refused by the test", "data": data},
            None,
            direction="to_agent",
            method="_x/refused",
        ),
        name="faults.json",
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(request("7", "_x/refused", {"a": 1}), request(7, "_x/refused"))
    error = {"code": -32042, "message": "refused by the test", "data": data}
    string_answer = await proxy.recv_json()
    assert string_answer == {"jsonrpc": "2.0", "id": "7", "error": error}
    int_answer = await proxy.recv_json()
    assert int_answer == {"jsonrpc": "2.0", "id": 7, "error": error}
    assert type(int_answer["id"]) is int

    # A notification of that method cannot be answered: the rule lets it through.
    note = notification("_x/refused", {"b": 2})
    await proxy.send(note)
    assert await barrier(proxy, "b") == []
    assert captured(capture) == [note, request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "refuse")) == 2


async def test_sdk_client_gets_the_injected_error_and_the_sdk_agent_no_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the SDK Client's prompt raises the configured error; the Agent got none."""
    faults = fault_file(
        tmp_path,
        rule(
            "refuse-prompts",
            {"action": "error", "code": -32099, "message": "try later", "data": {"retry": True}},
            None,
            direction="to_agent",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        with pytest.raises(RequestError) as raised:
            await sdk_prompt(conn, session, "echo never")
        assert (raised.value.code, str(raised.value)) == (-32099, "try later")
        assert raised.value.data == {"retry": True}
        state = await sdk_state(conn)
    assert state["prompts"] == []
    assert [method for _, method in state["requests"]] == [
        "initialize",
        "session/new",
        "_sdk_agent/state",
    ]
    assert client.chunks == []
    assert len(faults_of(stderr.stderr, "refuse-prompts")) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == duplicate =====================================================================================


async def test_duplicated_request_reaches_the_agent_twice_and_is_answered_once(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """duplicate on a request: two copies under two ids, one answer relayed, the other swallowed."""
    faults = fault_file(
        tmp_path,
        rule(
            "replay",
            {"action": "duplicate", "copies": 1},
            None,
            direction="to_agent",
            method="_x/twice",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    sent = request("d", "_x/twice", {"key": "k-1", "text": "once please"})
    await proxy.send(sent)
    answer = await proxy.recv_json()
    assert answer == {
        "jsonrpc": "2.0",
        "id": "d",
        "result": {"method": "_x/twice", "size": len(with_id(sent, "d", 0))},
    }
    assert await barrier(proxy, "b") == []  # exactly one answer for "d"
    first, second, _ = captured(capture)
    assert first == with_id(sent, "d", 0)
    assert second == with_id(sent, "d", 1)
    await until_logged(proxy, SWALLOWED)
    (swallowed,) = log_events(proxy.stderr, SWALLOWED)
    assert (swallowed["id"], swallowed["copy_id"]) == ('"d"', "1")
    assert len(faults_of(proxy.stderr, "replay")) == 1


async def test_duplicated_notification_arrives_several_times_byte_for_byte(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """duplicate on a notification: the Client gets it 1 + copies times, identical, gap_ms apart."""
    faults = fault_file(
        tmp_path,
        rule(
            "echo-update",
            {"action": "duplicate", "copies": 2, "gap_ms": 20},
            None,
            direction="to_client",
            kind="notification",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","n":"\\u00e9"}}'
    await proxy.send(say(update))
    assert [await proxy.recv() for _ in range(3)] == [update] * 3
    assert await barrier(proxy, "b") == []
    assert len(faults_of(proxy.stderr, "echo-update")) == 1


async def test_sdk_agent_runs_a_duplicated_prompt_twice_and_the_sdk_client_gets_one_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SDK both sides: the Agent runs each prompt twice (2 ids); the Client sees one answer each."""
    faults = fault_file(
        tmp_path,
        rule(
            "replay-prompts",
            {"action": "duplicate", "copies": 1, "gap_ms": 10},
            None,
            direction="to_agent",
            method="session/prompt",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, _, stderr):
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, "echo twice") == "end_turn"
        await client.until(lambda: client.chunks.count("twice") == 2)  # both copies ran
        await until_logged(stderr, SWALLOWED)
        assert await sdk_prompt(conn, session, "echo again") == "end_turn"
        await client.until(lambda: client.chunks.count("again") == 2)
        await until_logged(stderr, SWALLOWED, 2)
        state = await sdk_state(conn)

    prompts = state["prompts"]
    assert [p["text"] for p in prompts] == ["echo twice"] * 2 + ["echo again"] * 2
    assert len({p["id"] for p in prompts}) == 4  # every copy under its own id
    for prompt_id in client.sent_ids("session/prompt"):
        assert len(client.answers_to(prompt_id)) == 1
    assert len(faults_of(stderr.stderr, "replay-prompts")) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


# == sever =========================================================================================


@pytest.mark.parametrize(
    ("side", "when"),
    [
        ("agent", "before"),
        ("agent", "after"),
        ("client", "before"),
        ("client", "after"),
        ("both", "before"),
        ("both", "after"),
    ],
)
async def test_sever_cuts_the_side_before_or_after_forwarding(
    start: Start, capture: Path, tmp_path: Path, side: str, when: str
) -> None:
    """sever: the Agent gets it only when after; the Client's stdout ends; the Agent's status."""
    faults = fault_file(
        tmp_path,
        rule(
            "cut",
            {"action": "sever", "side": side, "when": when},
            None,
            direction="to_agent",
            method="_x/cut",
        ),
    )
    proxy = await start(exits_with(5, raw_agent(capture)), "--faults", str(faults))
    assert await barrier(proxy, "before") == []
    cut = request("cut", "_x/cut", {"n": 1})
    await proxy.send(cut)
    assert await proxy.at_eof()  # no answer to "cut", nothing at all
    assert await proxy.wait() == 5
    expected = [request(0, "_test/barrier")]
    if when == "after":
        expected.append(with_id(cut, "cut", 1))
    assert captured(capture) == expected
    if (side, when) == ("client", "after"):
        # The Agent answered "cut"; the answer met a closed Client and was dropped.
        (undelivered,) = log_events(proxy.stderr, "message for a closed peer dropped")
        assert (undelivered["direction"], undelivered["kind"]) == ("to_client", "response")
    assert len(faults_of(proxy.stderr, "cut")) == 1


# == kill_agent ====================================================================================


async def test_sdk_kill_agent_ends_the_proxy_with_137_and_the_prompt_unanswered(
    tmp_path: Path,
) -> None:
    """kill_agent: SIGKILL to the SDK Agent mid-prompt; exit 137, the prompt never answered."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill",
            {"action": "kill_agent"},
            None,
            direction="to_agent",
            kind="notification",
            method="_x/kill",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, process, stderr):
        session = await open_session(conn)
        state = await sdk_state(conn)
        pending = asyncio.create_task(  # noqa: TID251 - the test awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.chunks)  # the Agent is working on it
        await conn.ext_notification("x/kill", {})
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 128 + signal.SIGKILL
        with pytest.raises(ConnectionError):  # the SDK's word for "the agent went away"
            await asyncio.wait_for(pending, TIMEOUT)
        (prompt_id,) = client.sent_ids("session/prompt")
        assert client.answers_to(prompt_id) == []
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)
    (fault,) = faults_of(stderr.stderr, "kill")
    assert fault["action"] == "kill_agent"


async def test_sdk_kill_agent_with_respawn_keeps_the_client_and_starts_a_fresh_agent(
    tmp_path: Path,
) -> None:
    """kill_agent respawn: the pipe stays open, a new Agent answers, the old prompt never."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill-and-respawn",
            {"action": "kill_agent", "respawn": True},
            None,
            direction="to_agent",
            kind="notification",
            method="_x/kill",
        ),
    )
    client = SdkClient()
    async with sdk_client_session(client, "--faults", str(faults)) as (conn, process, stderr):
        session = await open_session(conn)
        old = await sdk_state(conn)
        pending = asyncio.create_task(  # noqa: TID251 - the test cancels and awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.chunks)
        await conn.ext_notification("x/kill", {})

        new = await sdk_state(conn)  # waits while the Agent is down, then meets the new one
        assert new["pid"] != old["pid"]
        assert [method for _, method in new["requests"]] == ["_sdk_agent/state"]  # uninitialised
        with pytest.raises(ProcessLookupError):
            os.kill(old["pid"], 0)
        # The new Agent serves a whole new conversation; the old prompt stays unanswered.
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, "echo reborn") == "end_turn"
        assert not pending.done()
        (old_prompt, new_prompt) = client.sent_ids("session/prompt")
        assert client.answers_to(old_prompt) == []
        assert len(client.answers_to(new_prompt)) == 1
        assert process.returncode is None
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
    assert process.returncode == 0
    assert client.chunks == ["waiting", "reborn"]
    assert len(faults_of(stderr.stderr, "kill-and-respawn")) == 1


async def test_kill_agent_waits_after_ms_and_sends_the_configured_signal(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """kill_agent after_ms: the Agent answers for after_ms, then gets the signal (TERM: 143)."""
    faults = fault_file(
        tmp_path,
        rule(
            "kill-later",
            {"action": "kill_agent", "signal": "TERM", "after_ms": 300},
            None,
            direction="to_agent",
            method="_x/kill",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    started = time.monotonic()
    await proxy.send(notification("_x/kill"))
    assert await barrier(proxy, "still-alive") == []
    assert await proxy.at_eof()
    assert await proxy.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - started >= 0.3  # never before after_ms
    assert captured(capture) == [notification("_x/kill"), request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "kill-later")) == 1


# == restart_proxy =================================================================================


async def test_restart_proxy_forgets_the_pending_request_and_meets_a_fresh_agent(
    start: Start, tmp_path: Path
) -> None:
    """restart_proxy: the request is never answered, the next ones reach a new Agent, ids go on."""
    faults = fault_file(
        tmp_path,
        rule(
            "restart",
            {"action": "restart_proxy", "downtime_ms": 50},
            {"nth": [1]},
            direction="to_agent",
            method="session/prompt",
        ),
    )
    agents = tmp_path / "agents"
    proxy = await start(raw_agent_per_process(agents), "--faults", str(faults))
    first = request("a", "_x/first")
    await proxy.send(first)
    assert (await proxy.recv_json())["id"] == "a"

    lost = request("p", "session/prompt", {"sessionId": "S", "prompt": []})
    after = request("c", "_x/after")
    await proxy.send(lost, after)
    assert (await proxy.recv_json())["id"] == "c"  # never "p"
    assert await barrier(proxy, "d") == []
    await proxy.close_stdin()
    assert await proxy.wait() == 0

    started = [record["pid"] for record in log_events(proxy.stderr, "agent started")]
    assert len(started) == 2
    assert sorted(p.name for p in agents.iterdir()) == sorted(f"{pid}.jsonl" for pid in started)
    old, new = (captured(agents / f"{pid}.jsonl") for pid in started)
    assert old[0] == with_id(first, "a", 0)
    assert old[1:] in ([], [with_id(lost, "p", 1)])  # stopped at once: it may not have read it
    # The fresh Agent's first message: the proxy kept counting (1 went to the prompt).
    assert new == [with_id(after, "c", 2), request(3, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "restart")) == 1
    assert [r["what"] for r in log_events(proxy.stderr, "restarting")] == ["proxy"]


# == corrupt =======================================================================================


def check_corrupted(mode: str, original: bytes, got: bytes) -> None:
    """``got`` is ``original`` corrupted as ``mode`` says: never JSON, never a newline."""
    assert b"\n" not in got
    assert got != original
    if mode == "invalid_utf8":
        with pytest.raises(UnicodeDecodeError):
            got.decode("utf-8")
        quote = original.index(b'"') + 1
        assert got == original[:quote] + b"\xc3\x28" + original[quote:]
    else:
        with pytest.raises(ValueError):  # noqa: PT011 (any JSON error)
            json.loads(got)
    if mode == "truncate":
        assert got == original[: len(original) // 2]
    if mode == "garbage":
        assert len(got) == min(len(original), 256)
        assert all(0x21 <= byte < 0x7F for byte in got)


@pytest.mark.parametrize("mode", ["truncate", "garbage", "invalid_utf8"])
async def test_corrupt_sends_malformed_bytes_in_place_of_the_message(
    start: Start, capture: Path, tmp_path: Path, mode: str
) -> None:
    """corrupt: both ways the peer gets one malformed line instead of the message; framing holds."""
    faults = fault_file(
        tmp_path,
        rule(
            "to-client",
            {"action": "corrupt", "mode": mode},
            None,
            direction="to_client",
            method="_x/bad",
        ),
        rule(
            "to-agent",
            {"action": "corrupt", "mode": mode},
            None,
            direction="to_agent",
            method="_x/bad",
        ),
        seed=5,
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    bad = notification("_x/bad", {"text": "caf\u00e9 " + "x" * 300, "n": [1, 2, 3]})
    good = notification("_x/good", {"n": 1})

    await proxy.send(say(bad, good))
    check_corrupted(mode, bad, await proxy.recv())
    assert await proxy.recv() == good  # the next message is whole: no newline was injected

    await proxy.send(bad, good)
    assert await barrier(proxy, "b") == []
    saw = captured(capture)
    check_corrupted(mode, bad, saw[-3])
    assert saw[-2:] == [good, request(0, "_test/barrier")]
    assert len(faults_of(proxy.stderr, "to-client")) == 1
    assert len(faults_of(proxy.stderr, "to-agent")) == 1


# == schedules through a real process ==============================================================


async def test_only_the_second_prompt_response_is_dropped(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """schedule nth [2]: of three prompts the Agent answers all, the Client gets the 1st and 3rd."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-second",
            {"action": "drop"},
            {"nth": [2]},
            direction="to_client",
            kind="response",
            method="session/prompt",
        ),
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    for n in (1, 2, 3):
        await proxy.send(request(n, "session/prompt", {"sessionId": "S", "n": n}))
    assert [(await proxy.recv_json())["id"] for _ in range(2)] == [1, 3]
    assert await barrier(proxy, "b") == []
    assert [json.loads(line)["params"]["n"] for line in captured(capture)[:3]] == [1, 2, 3]
    assert len(faults_of(proxy.stderr, "lose-second")) == 1


@pytest.mark.parametrize(
    ("schedule", "dropped"),
    [
        ({"nth": [2, 5]}, {2, 5}),
        ({"every": 3}, {3, 6, 9}),
        ({"after": 2, "times": 3}, {3, 4, 5}),
        ({"after": 1, "every": 4}, {5, 9}),
        ({"nth": [1, 2, 3, 4], "times": 2}, {1, 2}),
    ],
)
async def test_schedules_pick_the_occurrences(
    start: Start, capture: Path, tmp_path: Path, schedule: dict[str, Any], dropped: set[int]
) -> None:
    """schedule nth/after/times/every: exactly those of 10 notifications are dropped."""
    faults = fault_file(
        tmp_path, rule("pick", {"action": "drop"}, schedule, direction="to_client", method="_x/n")
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults))
    await proxy.send(say(*(notification("_x/n", {"i": i}) for i in range(1, 11))))
    received = {json.loads(line)["params"]["i"] for line in await barrier(proxy, "b")}
    assert set(range(1, 11)) - received == dropped
    assert len(faults_of(proxy.stderr, "pick")) == len(dropped)


# == --seed ========================================================================================


COIN_FLIPS = 20


def coin_file(directory: Path, seed: int | None) -> Path:
    """A fault file dropping each ``_x/coin`` notification to the Client with probability 0.5."""
    coin = rule(
        "coin",
        {"action": "drop"},
        {"probability": 0.5},
        direction="to_client",
        method="_x/coin",
    )
    return fault_file(directory, coin, seed=seed)


async def coin_drops(proxy: ProxyProcess) -> set[int]:
    """Make the raw Agent send ``COIN_FLIPS`` coins; the ones that never reached the Client."""
    await proxy.send(say(*(notification("_x/coin", {"i": i}) for i in range(COIN_FLIPS))))
    received = {json.loads(line)["params"]["i"] for line in await barrier(proxy, "b")}
    assert len(faults_of(proxy.stderr, "coin")) == COIN_FLIPS - len(received)
    return set(range(COIN_FLIPS)) - received


async def test_same_seed_same_faults_other_seed_other_faults(start: Start, tmp_path: Path) -> None:
    """--seed: probability 0.5 over 20 messages drops the same ones for the same seed only."""
    faults = coin_file(tmp_path, seed=99)

    async def dropped(index: int, *seed: str) -> set[int]:
        capture = tmp_path / f"agent-{index}.jsonl"
        return await coin_drops(await start(raw_agent(capture), "--faults", str(faults), *seed))

    first, again, other, from_file, explicit = await asyncio.gather(
        dropped(0, "--seed", "11"),
        dropped(1, "--seed", "11"),
        dropped(2, "--seed", "12"),
        dropped(3),
        dropped(4, "--seed", "99"),
    )
    assert first == again
    assert 0 < len(first) < COIN_FLIPS
    assert other != first
    assert from_file == explicit  # the file's seed is used when --seed is not given
    assert from_file != first  # ...and --seed overrides it


async def test_the_logged_random_seed_reproduces_a_run_without_a_seed(
    start: Start, tmp_path: Path
) -> None:
    """No seed given: the seed drawn is logged once, and --seed with it gives the same faults."""
    faults = coin_file(tmp_path, seed=None)
    proxy = await start(raw_agent(tmp_path / "run-1.jsonl"), "--faults", str(faults))
    dropped = await coin_drops(proxy)
    seeds = [
        record["seed"]
        for record in log_events(proxy.stderr, "no seed given; pass --seed to reproduce this run")
    ]
    assert len(seeds) == 1, f"several seeds logged, only one was used: {seeds}"
    again = await start(
        raw_agent(tmp_path / "run-2.jsonl"), "--faults", str(faults), "--seed", str(seeds[0])
    )
    assert await coin_drops(again) == dropped


# == --state =======================================================================================


async def test_state_file_keeps_counters_across_proxy_restarts(
    start: Start, tmp_path: Path
) -> None:
    """--state: "drop the 1st keyed prompt response" fires once across two runs of the proxy."""
    faults = fault_file(
        tmp_path,
        rule(
            "lose-first-keyed",
            {"action": "drop"},
            {"nth": [1]},
            direction="to_client",
            kind="response",
            method="session/prompt",
            idempotency_key="present",
        ),
    )
    keyed = request(1, "session/prompt", {"sessionId": "S", "idempotencyKey": "k-1", "prompt": []})

    async def first_answer_lost(state: Path, capture: Path) -> bool:
        proxy = await start(raw_agent(capture), "--faults", str(faults), "--state", str(state))
        await proxy.send(keyed)
        lost = await barrier(proxy, "b") == []
        assert captured(capture)[0] == with_id(keyed, 1, 0)  # the Agent got it either way
        await proxy.close_stdin()
        assert await proxy.wait() == 0
        return lost

    state = tmp_path / "state.json"
    assert await first_answer_lost(state, tmp_path / "run-1.jsonl")
    assert state.exists()
    assert not await first_answer_lost(state, tmp_path / "run-2.jsonl")
    # Without the state file, a new run would have dropped it again.
    assert await first_answer_lost(tmp_path / "fresh-state.json", tmp_path / "run-3.jsonl")


# == --watch =======================================================================================


def replace_file(path: Path, text: str) -> None:
    """Replace ``path`` in one step, so the watcher never reads half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def test_watch_reloads_rules_and_keeps_the_last_good_ones(
    start: Start, capture: Path, tmp_path: Path
) -> None:
    """--watch: an edited file's rules apply once reloaded; a broken edit is refused, rules kept."""
    faults = fault_file(
        tmp_path, rule("drop-a", {"action": "drop"}, None, direction="to_client", method="_x/a")
    )
    proxy = await start(raw_agent(capture), "--faults", str(faults), "--watch")
    a, b = notification("_x/a"), notification("_x/b")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "1") == [b]

    dropping_b = rule(
        "drop-b-instead", {"action": "drop"}, None, direction="to_client", method="_x/b"
    )
    replace_file(faults, yaml.safe_dump({"version": 1, "rules": [dropping_b]}))
    await until_logged(proxy, "fault files reloaded")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "2") == [a]

    replace_file(faults, "version: 1\nrules:\n  - name: broken\n    do:\n      action: explode\n")
    refused = "fault file reload refused; keeping the last good rules"
    await until_logged(proxy, refused)
    await proxy.send(say(a, b))
    assert await barrier(proxy, "3") == [a]  # still dropping _x/b
    (error,) = log_events(proxy.stderr, refused)
    assert "rule 'broken'" in error["error"]
    assert "explode" in error["error"]
    assert len(log_events(proxy.stderr, "fault files reloaded")) == 1
    assert len(faults_of(proxy.stderr, "drop-a")) == 1
    assert len(faults_of(proxy.stderr, "drop-b-instead")) == 2


@pytest.mark.parametrize("in_place", [False, True], ids=["replaced", "written-in-place"])
async def test_watch_sees_an_edit_that_keeps_the_size_and_the_mtime(
    start: Start, capture: Path, tmp_path: Path, in_place: bool
) -> None:
    """An edit of the same size whose mtime is set back (a coarse clock, ``touch -r``) is seen:
    by the file's identity when it is replaced, by its ctime when it is written in place; a
    touch or a chmod alone reloads nothing."""
    a, b = notification("_x/a"), notification("_x/b")

    def dropping(method: str) -> str:
        return yaml.safe_dump(
            {
                "version": 1,
                "rules": [rule("drop-it", {"action": "drop"}, None, method=method)],
            }
        )

    faults = tmp_path / "faults.yaml"
    faults.write_text(dropping("_x/a"))
    proxy = await start(raw_agent(capture), "--faults", str(faults), "--watch")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "1") == [b]
    touched = os.stat(faults).st_mtime_ns + 5_000_000_000
    os.utime(faults, ns=(touched, touched))  # a touch and a chmod change no rule
    faults.chmod(0o600)
    await until_logged(proxy, "fault files touched, their contents unchanged: nothing reloaded")
    before = os.stat(faults)
    text = dropping("_x/b")
    assert len(text) == before.st_size
    if in_place:
        faults.write_text(text)
    else:
        replace_file(faults, text)
    os.utime(faults, ns=(before.st_atime_ns, before.st_mtime_ns))
    await until_logged(proxy, "fault files reloaded")
    await proxy.send(say(a, b))
    assert await barrier(proxy, "2") == [a]
    assert len(log_events(proxy.stderr, "fault files reloaded")) == 1


# == a bad fault file ==============================================================================


async def test_run_refuses_a_bad_fault_file_before_starting_the_agent(
    start: Start, tmp_path: Path
) -> None:
    """run with a bad fault file: exit 2, every error located on stderr, no Agent ever started."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\n"
        "rules:\n"
        "  - name: slow\n"
        "    do:\n"
        "      action: delay\n"
        "      ms: -5\n"
        "  - name: typo\n"
        "    when:\n"
        "      kind: reqest\n"
        "    do:\n"
        "      action: drop\n"
    )
    marker = tmp_path / "agent-ran"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proxy = await start(agent, "--faults", str(bad))
    assert await proxy.at_eof()
    assert await proxy.wait() == 2
    assert f"{bad}:6: rule 'slow': do.ms:" in proxy.stderr
    assert f"{bad}:9: rule 'typo': when.kind:" in proxy.stderr
    assert not marker.exists()
