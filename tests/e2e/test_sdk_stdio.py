"""End to end over stdio, with the official ACP Python SDK as the Client and as the Agent.

The SDK Client runs in the test process and launches ``python -m proxy run -- python
tests/support/peers/sdk_agent.py`` as if it were the Agent; the proxy spawns the SDK Agent. Both are real
subprocesses, and their stderr is pytest's (shown when a test fails).

The Client and the Agent each send one raw request with a string id before the SDK speaks (the
"preambles"), so the integer ids the SDK allocates differ from the ones the proxy mints on the
next hop: a proxy that forwarded ids or ``$/cancel_request`` untranslated would misroute.

The raw tests drive the proxy with JSON lines written by the test itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from acp import PROTOCOL_VERSION, Client, spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.core import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallUpdate,
)
from harness import PEERS, TIMEOUT
from peers.sdk_remote_client import open_session, sdk_prompt

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

AGENT = PEERS / "sdk_agent.py"
PROXY_ARGS = ["-m", "proxy", "run", "--"]
"""After ``sys.executable``: the proxy, then the Agent's command."""
MIB = 1024 * 1024

CLIENT_PREAMBLE_ID = "client-preamble"
AGENT_PREAMBLE_ID = "agent-preamble"  # what tests/support/peers/sdk_agent.py --preamble sends
BIG_PATTERN = "0123456789abcdefghijklmnopqrstuvwxyz\u00e9\u4e2d"  # sdk_agent.big_text's pattern


def big_text(size: int) -> str:
    """What the Agent sends for ``big SIZE``."""
    return (BIG_PATTERN * (size // len(BIG_PATTERN) + 1))[:size]


def digest(text: str) -> str:
    """What the Agent reports for a prompt it does not otherwise understand."""
    return f"len={len(text)} sha256={hashlib.sha256(text.encode()).hexdigest()}"


# -- the SDK Client ------------------------------------------------------------------------------


class RecordingClient:
    """The Client side on the SDK: records what arrives and answers permission requests.

    ``choices`` are the option ids it picks, one per permission request (``None``: cancelled).
    """

    def __init__(self, *choices: str | None) -> None:
        self.chunks: list[tuple[str, str]] = []
        """(session id, text) of each agent message chunk, in arrival order."""
        self.permission_requests: list[tuple[str, str, list[str]]] = []
        """(session id, tool call id, option ids) of each permission request."""
        self.extension_requests: list[str] = []
        self.wire: list[StreamEvent] = []
        """Every JSON-RPC message the SDK sent or received, as it saw it."""
        self._choices = list(choices)
        self._news = asyncio.Event()

    def observe(self, event: StreamEvent) -> None:
        self.wire.append(event)
        self._news.set()

    def received(self) -> list[dict[str, Any]]:
        """The messages that came from the proxy, in order."""
        return [e.message for e in self.wire if e.direction is StreamDirection.INCOMING]

    def sent(self) -> list[dict[str, Any]]:
        """The messages the SDK Client wrote, in order."""
        return [e.message for e in self.wire if e.direction is StreamDirection.OUTGOING]

    def texts(self) -> list[str]:
        return [text for _, text in self.chunks]

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds (checked on every recorded event)."""
        async with asyncio.timeout(TIMEOUT):
            while not predicate():
                self._news.clear()
                await self._news.wait()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.chunks.append((session_id, update.content.text))
            self._news.set()

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        self.permission_requests.append(
            (session_id, tool_call.tool_call_id, [option.option_id for option in options])
        )
        choice = self._choices.pop(0)
        outcome = DeniedOutcome() if choice is None else AllowedOutcome(option_id=choice)
        return RequestPermissionResponse(outcome=outcome)

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.extension_requests.append(method)
        return {"from": "client"}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        self.extension_requests.append(method)


@contextlib.asynccontextmanager
async def proxied_sdk_agent(
    client: RecordingClient, caplog: pytest.LogCaptureFixture, *agent_args: str
) -> AsyncIterator[tuple[ClientSideConnection, asyncio.subprocess.Process]]:
    """The SDK Client connected to the proxy, which runs the SDK Agent; both with preambles.

    On a clean exit, also checks that the SDK Client logged no complaint: a line on the proxy's
    stdout that is not a JSON-RPC object makes it log an error and skip the line.
    """
    async with spawn_agent_process(
        cast(Client, client),
        sys.executable,
        *PROXY_ARGS,
        sys.executable,
        str(AGENT),
        "--preamble",
        *agent_args,
        transport_kwargs={
            "limit": DEFAULT_MAX_MESSAGE_BYTES,
            "stderr": None,
            "shutdown_timeout": TIMEOUT,
        },
        observers=[client.observe],
    ) as (conn, process):
        assert process.stdin is not None
        preamble = {"jsonrpc": "2.0", "id": CLIENT_PREAMBLE_ID, "method": "_sdk_agent/state"}
        process.stdin.write(json.dumps(preamble).encode() + b"\n")
        yield conn, process
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert complaints == []


# -- through the proxy, the SDK on both ends -----------------------------------------------------


async def test_initialize_sessions_and_prompts_in_a_row(caplog: pytest.LogCaptureFixture) -> None:
    """initialize, two session/new and three prompts in a row work, each prompt's update arriving."""
    client = RecordingClient()
    async with proxied_sdk_agent(client, caplog) as (conn, _):
        first = await open_session(conn)
        second = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        assert first != second.session_id

        assert await sdk_prompt(conn, first, "echo one") == "end_turn"
        assert client.chunks == [(first, "one")]
        assert await sdk_prompt(conn, second.session_id, "echo two") == "end_turn"
        assert await sdk_prompt(conn, first, "echo three") == "end_turn"

    assert client.chunks == [(first, "one"), (second.session_id, "two"), (first, "three")]


async def test_string_ids_return_exactly_both_ways(caplog: pytest.LogCaptureFixture) -> None:
    """A string request id comes back as the same string, in both directions."""
    client = RecordingClient()
    async with proxied_sdk_agent(client, caplog) as (conn, _):
        await open_session(conn)
        state = await asyncio.wait_for(conn.ext_method("sdk_agent/state", {}), TIMEOUT)

    # The Client's raw request was answered under its own string id.
    answers = [m for m in client.received() if m.get("id") == CLIENT_PREAMBLE_ID]
    assert len(answers) == 1
    assert answers[0]["result"]["pid"] == state["pid"]
    # The Agent's raw request reached the Client under a proxy id, the answer came back as sent.
    assert client.extension_requests == ["sdk_agent/hello"]
    hello = next(m for m in client.received() if m.get("method") == "_sdk_agent/hello")
    assert hello["id"] != AGENT_PREAMBLE_ID
    assert state["response_ids"] == [AGENT_PREAMBLE_ID]


async def test_agent_permission_request_answered_by_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """session/request_permission reaches the Client and the Agent acts on the Client's answer."""
    client = RecordingClient("reject", "allow", None)
    async with proxied_sdk_agent(client, caplog) as (conn, _):
        session = await open_session(conn)
        for _ in range(3):
            assert await sdk_prompt(conn, session, "permission") == "end_turn"

    assert client.permission_requests == [(session, "call-1", ["allow", "reject"])] * 3
    assert client.chunks == [
        (session, "permission: selected reject"),
        (session, "permission: selected allow"),
        (session, "permission: cancelled"),
    ]


async def test_cancel_request_reaches_agent_under_its_own_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancelling a running prompt cancels it in the Agent (-32800); the connection goes on."""
    client = RecordingClient()
    async with proxied_sdk_agent(client, caplog) as (conn, _):
        session = await open_session(conn)
        waiting = asyncio.create_task(  # noqa: TID251 - the test cancels and awaits it
            conn.prompt(session_id=session, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.texts())
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        (client_id,) = [
            m["id"]
            for m in client.sent()
            if m.get("method") == "session/prompt" and m["params"]["prompt"][0]["text"] == "wait"
        ]

        def cancelled_report() -> dict[str, Any] | None:
            reports = [t for t in client.texts() if t.startswith("cancelled ")]
            return json.loads(reports[0].removeprefix("cancelled ")) if reports else None

        def answered_cancelled() -> bool:
            return any(
                m.get("id") == client_id and m.get("error", {}).get("code") == -32800
                for m in client.received()
            )

        await client.until(lambda: cancelled_report() is not None and answered_cancelled())
        report = cancelled_report()
        assert report is not None
        cancels = [m for m in client.sent() if m.get("method") == "$/cancel_request"]
        assert [m["params"]["requestId"] for m in cancels] == [client_id]
        # The Agent got the prompt under the proxy's id and the cancel named that same id.
        assert report["cancel_request_ids"] == [report["id"]]
        assert report["id"] != client_id

        assert await sdk_prompt(conn, session, "echo still here") == "end_turn"
        assert client.chunks[-1] == (session, "still here")


async def test_multi_mib_messages_cross_intact(caplog: pytest.LogCaptureFixture) -> None:
    """A 5 MiB prompt reaches the Agent intact, and a 5 MiB session update reaches the Client."""
    text = big_text(5 * MIB) + ' {"id":7,"requestId":3} \\ " \n\t \u2028 end'
    client = RecordingClient()
    async with proxied_sdk_agent(client, caplog) as (conn, _):
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, text) == "end_turn"
        assert client.chunks == [(session, digest(text))]

        assert await sdk_prompt(conn, session, f"big {5 * MIB}") == "end_turn"
        assert len(client.chunks) == 2
        assert client.chunks[1] == (session, big_text(5 * MIB))

        assert await sdk_prompt(conn, session, "echo small") == "end_turn"
        assert client.chunks[2] == (session, "small")


async def test_client_close_ends_proxy_and_agent(caplog: pytest.LogCaptureFixture) -> None:
    """When the SDK Client closes, the Agent and then the proxy exit, with the Agent's status."""
    client = RecordingClient()
    async with proxied_sdk_agent(client, caplog, "--exit-status", "3") as (conn, process):
        session = await open_session(conn)
        assert await sdk_prompt(conn, session, "echo bye") == "end_turn"
        state = await asyncio.wait_for(conn.ext_method("sdk_agent/state", {}), TIMEOUT)
        assert process.returncode is None

    # The context closed the proxy's stdin and waited; a proxy that had to be terminated
    # would show -15, and one that did not wait for its Agent would leave it running.
    assert process.returncode == 3
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)
    # Everything the proxy wrote on stdout was a JSON-RPC 2.0 object (and the SDK logged no
    # unparsable line, checked by proxied_sdk_agent).
    received = client.received()
    assert len(received) >= 5
    assert all(m.get("jsonrpc") == "2.0" for m in received)


# -- a raw Client, the SDK Agent -----------------------------------------------------------------


class RawClient:
    """The proxy (running the SDK Agent) driven by JSON lines the test writes itself."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._stdin = process.stdin
        self._stdout = process.stdout

    def send(self, message: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def receive(self) -> dict[str, Any]:
        """The next line from the proxy, which must be one JSON-RPC 2.0 object."""
        line = await asyncio.wait_for(self._stdout.readline(), TIMEOUT)
        assert line.endswith(b"\n"), f"stdout ended: {line!r}"
        message = json.loads(line)
        assert isinstance(message, dict)
        assert message["jsonrpc"] == "2.0"
        return message

    async def open_session(self) -> str:
        """initialize under the id ``"init"``, session/new under ``1``; the session id.

        In raw lines, not with the SDK Client (``peers.sdk_remote_client.open_session``): the
        tests choose the ids and check the ones that come back."""
        self.send(
            {
                "jsonrpc": "2.0",
                "id": "init",
                "method": "initialize",
                "params": {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": {}},
            }
        )
        init = await self.receive()
        assert init["id"] == "init"
        assert init["result"]["protocolVersion"] == PROTOCOL_VERSION
        self.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "session/new",
                "params": {"cwd": os.getcwd(), "mcpServers": []},
            }
        )
        new = await self.receive()
        assert type(new["id"]) is int
        assert new["id"] == 1
        return str(new["result"]["sessionId"])

    def prompt(self, request_id: object, session_id: str, text: str) -> None:
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        self.send(
            {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
        )

    async def chunk(self, session_id: str) -> str:
        """The next message, which must be an agent message chunk in ``session_id``."""
        message = await self.receive()
        assert message["method"] == "session/update"
        assert message["params"]["sessionId"] == session_id
        update = message["params"]["update"]
        assert update["sessionUpdate"] == "agent_message_chunk"
        return str(update["content"]["text"])

    async def close(self) -> tuple[int, bytes]:
        """Close the proxy's stdin; its exit status and whatever it still wrote on stdout."""
        self._stdin.close()
        rest = await asyncio.wait_for(self._stdout.read(), TIMEOUT)
        return await asyncio.wait_for(self.process.wait(), TIMEOUT), rest


@pytest.fixture
async def raw_client() -> AsyncIterator[RawClient]:
    """The proxy running the SDK Agent (no preamble), spoken to in raw JSON lines."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *PROXY_ARGS,
        sys.executable,
        str(AGENT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=DEFAULT_MAX_MESSAGE_BYTES,
    )
    try:
        yield RawClient(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_raw_agent_request_while_client_request_pending(raw_client: RawClient) -> None:
    """An Agent request arrives under id 0 while the Client's own id 0 is pending; both resolve."""
    session = await raw_client.open_session()
    raw_client.prompt(0, session, "permission")

    request = await raw_client.receive()
    assert request["method"] == "session/request_permission"
    assert type(request["id"]) is int
    assert request["id"] == 0  # the proxy's first id toward the Client
    assert request["params"]["sessionId"] == session
    assert [o["optionId"] for o in request["params"]["options"]] == ["allow", "reject"]

    raw_client.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {"outcome": {"outcome": "selected", "optionId": "reject"}},
        }
    )
    # The Agent saw the Client's answer; then the prompt's own answer comes back under id 0.
    assert await raw_client.chunk(session) == "permission: selected reject"
    response = await raw_client.receive()
    assert type(response["id"]) is int
    assert response["id"] == 0
    assert response["result"]["stopReason"] == "end_turn"

    status, rest = await raw_client.close()
    assert (status, rest) == (0, b"")


async def test_raw_cancel_request_with_string_id(raw_client: RawClient) -> None:
    """$/cancel_request naming the Client's string id cancels the Agent's request, answered -32800."""
    session = await raw_client.open_session()
    raw_client.prompt("w", session, "wait")
    assert await raw_client.chunk(session) == "waiting"

    raw_client.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "w"}})
    report = json.loads((await raw_client.chunk(session)).removeprefix("cancelled "))
    assert type(report["id"]) is int  # the proxy's id on the Agent's side...
    assert report["cancel_request_ids"] == [report["id"]]  # ...is the one the cancel named
    response = await raw_client.receive()
    assert response["id"] == "w"
    assert response["error"]["code"] == -32800

    # The id is free again once answered.
    raw_client.prompt("w", session, "echo again")
    assert await raw_client.chunk(session) == "again"
    response = await raw_client.receive()
    assert response["id"] == "w"
    assert response["result"]["stopReason"] == "end_turn"

    status, rest = await raw_client.close()
    assert (status, rest) == (0, b"")
