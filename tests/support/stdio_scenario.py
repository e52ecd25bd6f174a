"""A proxy process over stdio between the test and an Agent: the pieces of an end-to-end scenario.

A proxy is started by the ``start`` fixture (``tests/conftest.py``); the test is the raw Client
on the proxy's stdin/stdout (``initialize``, ``new_session``, ``prompt_request``, ``answer_to``,
``barrier``) or runs the official SDK's Client in-process (``sdk_client_session``,
``SdkClient``; its calls are ``peers.sdk_remote_client``'s ``open_session``, ``sdk_prompt``,
``sdk_state``); ``agent_state`` reads what the Agent saw; ``faults_of`` and ``until_logged`` read
the proxy's ``fault injected`` log lines; ``rule`` is one rule of a fault file
(``harness.fault_file`` writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
from acp import PROTOCOL_VERSION, Client, spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.core import ClientSideConnection
from harness import (
    RAW_AGENT,
    SDK_AGENT,
    TIMEOUT,
    ProxyProcess,
    Start,
    log_events,
    request,
)
from peers.sdk_remote_client import SimpleClient

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

SWALLOWED = "answer to an injected copy swallowed"


def rule(
    name: str, do: dict[str, Any], schedule: dict[str, Any] | None = None, **when: Any
) -> dict[str, Any]:
    """One rule of a fault file: ``when`` from the keyword arguments."""
    data: dict[str, Any] = {"name": name, "when": when, "do": do}
    if schedule is not None:
        data["schedule"] = schedule
    return data


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


class SdkClient(SimpleClient):
    """The Client side on the official SDK (``SimpleClient``) that also records every message
    it sends and receives, for the tests that check ids and answers on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.wire: list[StreamEvent] = []

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
                "limit": DEFAULT_MAX_MESSAGE_BYTES,
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
