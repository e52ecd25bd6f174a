"""Streamable HTTP and WebSocket on both sides, in every pairing with stdio, with the official SDK.

The SDK Client (over HTTP, WebSocket, or stdio by launching the proxy) talks through a real proxy
process to the SDK Agent (spawned over stdio, or served over HTTP and WebSocket by uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import websockets
from acp import PROTOCOL_VERSION, Client, spawn_agent_process
from acp.client.connection import ClientSideConnection
from acp.schema import TextContentBlock
from harness import TIMEOUT, ProxyProcess
from peers.sdk_remote_client import SimpleClient, connect_http, connect_ws, run_sdk_http_agent

SDK_AGENT = [sys.executable, str(Path(__file__).parent / "peers" / "sdk_agent.py")]
LIMIT = 64 * 1024 * 1024


@contextlib.asynccontextmanager
async def listening_proxy(
    listen: str, *options: str, agent: list[str] | None = None
) -> AsyncIterator[tuple[ProxyProcess, str]]:
    """A proxy listening on ``listen`` (port 0); yields it and the URL it logged."""
    proxy = await ProxyProcess.start(
        agent or [], "--log-format", "json", "--listen", listen, *options
    )
    try:
        event = await proxy.logged("listening")
        yield proxy, event["url"]
    finally:
        await proxy.stop()


@contextlib.asynccontextmanager
async def sdk_client(
    kind: str, url: str, client: SimpleClient
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client over ``kind`` (http or ws) to ``url``."""
    connect = connect_ws if kind == "ws" else connect_http
    async with connect(url, client) as conn:
        yield conn


@contextlib.asynccontextmanager
async def stdio_client(upstream: str, client: SimpleClient) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client launching ``acp-proxy run --upstream URL`` as its agent."""
    async with spawn_agent_process(
        cast(Client, client),
        sys.executable,
        "-m",
        "proxy",
        "run",
        "--upstream",
        upstream,
        transport_kwargs={"limit": LIMIT, "stderr": None},
    ) as (conn, _process):
        yield conn


async def exercise(conn: ClientSideConnection, client: SimpleClient) -> None:
    """initialize, session/new, prompts, an agent-to-client request, and a cancelled prompt."""
    async with asyncio.timeout(TIMEOUT):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        assert init.protocol_version == PROTOCOL_VERSION
        session = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        other = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        assert session != other

        answer = await conn.prompt(
            session_id=session, prompt=[TextContentBlock(type="text", text="echo hello")]
        )
        assert answer.stop_reason == "end_turn"
        # Over HTTP the update travels on another stream than the answer: wait for it.
        await client.until(lambda: (session, "hello") in client.chunks)

        answer = await conn.prompt(
            session_id=other, prompt=[TextContentBlock(type="text", text="permission")]
        )
        assert answer.stop_reason == "end_turn"
        # the agent saw our answer
        await client.until(lambda: (other, "permission: selected allow") in client.chunks)

        waiting = asyncio.get_running_loop().create_task(
            conn.prompt(session_id=session, prompt=[TextContentBlock(type="text", text="wait")])
        )
        await client.until(lambda: (session, "waiting") in client.chunks)
        waiting.cancel()  # the SDK sends $/cancel_request under its own id
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await client.until(lambda: any(text.startswith("cancelled") for _, text in client.chunks))
        [report] = [text for _, text in client.chunks if text.startswith("cancelled")]
        details = json.loads(report.removeprefix("cancelled "))
        assert details["id"] in details["cancel_request_ids"]  # the cancel named the agent's id

        answer = await conn.prompt(
            session_id=session, prompt=[TextContentBlock(type="text", text="echo after")]
        )
        assert answer.stop_reason == "end_turn"


@pytest.mark.parametrize("downstream", ["http", "ws"])
async def test_network_client_to_spawned_stdio_agent(downstream: str) -> None:
    """An SDK Client over HTTP or WebSocket reaches an Agent the proxy spawns over stdio."""
    async with listening_proxy(f"{downstream}://127.0.0.1:0/acp", agent=SDK_AGENT) as (_proxy, url):
        client = SimpleClient()
        async with sdk_client(downstream, url, client) as conn:
            await exercise(conn, client)


async def test_http_listener_accepts_the_websocket_upgrade() -> None:
    """An http:// listener serves WebSocket Clients on the same endpoint."""
    async with listening_proxy("http://127.0.0.1:0/acp", agent=SDK_AGENT) as (_proxy, url):
        client = SimpleClient()
        async with sdk_client("ws", url, client) as conn:
            await exercise(conn, client)


@pytest.mark.parametrize("scheme", ["ws", "http"])
async def test_websocket_clients_are_not_given_compression(scheme: str) -> None:
    """A Client offering permessage-deflate gets a plain WebSocket, as the Agent side is: a fault
    proxy does not re-compress what it relays, and a link holds no zlib state (some 100 KiB)."""
    async with listening_proxy(f"{scheme}://127.0.0.1:0/acp", agent=SDK_AGENT) as (_proxy, url):
        ws_url = url.replace("http://", "ws://", 1)
        async with websockets.connect(ws_url, compression="deflate") as connection:
            assert connection.response is not None
            assert "Sec-WebSocket-Extensions" not in connection.response.headers


@pytest.mark.parametrize("downstream", ["http", "ws"])
@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_network_client_to_network_agent(downstream: str, upstream: str) -> None:
    """Every pairing of HTTP and WebSocket, each side terminated by the proxy."""
    async with run_sdk_http_agent() as agent:
        target = agent.url if upstream == "http" else agent.ws_url
        async with listening_proxy(f"{downstream}://127.0.0.1:0/acp", "--upstream", target) as (
            _proxy,
            url,
        ):
            client = SimpleClient()
            async with sdk_client(downstream, url, client) as conn:
                await exercise(conn, client)


@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_stdio_client_to_network_agent(upstream: str) -> None:
    """A stdio Client launching the proxy reaches an Agent served over HTTP or WebSocket."""
    async with run_sdk_http_agent() as agent:
        target = agent.url if upstream == "http" else agent.ws_url
        client = SimpleClient()
        async with stdio_client(target, client) as conn:
            await exercise(conn, client)


async def test_each_network_connection_gets_its_own_agent() -> None:
    """Two Clients at once: two links, two spawned Agents, no crosstalk."""
    async with listening_proxy("http://127.0.0.1:0/acp", agent=SDK_AGENT) as (proxy, url):
        first, second = SimpleClient(), SimpleClient()
        async with sdk_client("ws", url, first) as one, sdk_client("http", url, second) as two:
            await asyncio.gather(exercise(one, first), exercise(two, second))
        started = [line for line in proxy.stderr.splitlines() if '"agent started"' in line]
        assert len(started) == 2
