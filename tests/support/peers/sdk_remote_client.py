"""The official ACP Python SDK as a remote Client: Streamable HTTP and WebSocket, for the tests.

Import it as ``from peers.sdk_remote_client import ...`` (``tests`` is on pytest's and mypy's
path).

- :func:`connect_http` and :func:`connect_ws` connect an SDK Client to a URL and yield the SDK's
  ``ClientSideConnection`` (``initialize``, ``new_session``, ``prompt``, ``cancel``, ...); on
  exit they close it (HTTP: the SSE streams are cancelled and the connection DELETEd; WebSocket:
  close 1000).
- :func:`run_sdk_http_agent` starts ``sdk_http_agent.py`` and yields once it has printed its
  ``LISTENING`` line (never a sleep); :func:`run_node_agent` likewise the TypeScript SDK's
  Agent, ``node/agent.mjs`` (:data:`NODE_AGENT_MISSING` says why it cannot run, if it cannot).
- :func:`listening_proxy` runs ``acp-proxy run --listen URL``; :func:`sdk_client` connects the
  SDK Client to it over HTTP or WebSocket; :func:`stdio_client` has the SDK Client launch
  ``acp-proxy run --upstream URL`` as its Agent, over stdio.
- :class:`SimpleClient` is a minimal Client: records agent message chunks, allows permissions.
- :func:`open_session`, :func:`sdk_prompt` and :func:`sdk_state` are the SDK Client's calls to
  the SDK Agent (``peers/sdk_agent.py``), on any transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from acp import PROTOCOL_VERSION, Client, connect_to_agent, spawn_agent_process
from acp._transport import Transport
from acp.client.connection import ClientSideConnection
from acp.connection import StreamObserver
from acp.http import create_http_stream
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    Implementation,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallUpdate,
)
from acp.ws import create_websocket_stream
from acp.ws.client import MemoryAcpCookieStore
from harness import SDK_AGENT, TIMEOUT, ProxyProcess

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

HTTP_AGENT = Path(__file__).parent / "sdk_http_agent.py"
NODE_AGENT = Path(__file__).parent / "node" / "agent.mjs"
LISTENING = "LISTENING "


def _node_agent_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (the TypeScript SDK's Agent runs on it)"
    sdk = NODE_AGENT.parent / "node_modules" / "@agentclientprotocol" / "sdk" / "package.json"
    if not sdk.is_file():
        return "the TypeScript SDK is not installed: run npm ci --prefix tests/support/peers/node"
    return None


NODE_AGENT_MISSING = _node_agent_missing()
"""Why :func:`run_node_agent` cannot run here, or None (``.ci/run`` installs what it needs)."""


def ws_url(url: str) -> str:
    """``url`` with an ``http``/``https`` scheme turned into ``ws``/``wss`` (others unchanged)."""
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            return ws + url.removeprefix(http)
    return url


class SimpleClient:
    """A minimal SDK Client: records ``(session id, text)`` of each agent message chunk and
    answers every permission request with option ``allow`` (else the first option)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.updates: list[tuple[str, Any]] = []
        self._news = asyncio.Event()

    def texts(self) -> list[str]:
        return [text for _, text in self.chunks]

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait (``harness.TIMEOUT`` at most) until ``predicate()`` holds, checked per update."""
        async with asyncio.timeout(TIMEOUT):
            while not predicate():
                self._news.clear()
                await self._news.wait()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
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
        ids = [option.option_id for option in options]
        choice = "allow" if "allow" in ids else ids[0]
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=choice))

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


async def open_session(conn: ClientSideConnection) -> str:
    """``initialize`` (checked: the SDK Agent answers, in this protocol version) and one
    ``session/new`` with the SDK Client; the new session's id."""
    async with asyncio.timeout(TIMEOUT):
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_info=Implementation(name="pytest", version="0"),
        )
        assert init.protocol_version == PROTOCOL_VERSION
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
    """The SDK Agent's own record (``peers/sdk_agent.py``), asked by the SDK Client."""
    return await asyncio.wait_for(conn.ext_method("sdk_agent/state", {}), TIMEOUT)


@contextlib.asynccontextmanager
async def connect_http(
    url: str,
    client: Any = None,
    *,
    headers: dict[str, str] | None = None,
    observers: Sequence[StreamObserver] = (),
    http_client: httpx2.AsyncClient | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client over Streamable HTTP to ``url`` (e.g. ``http://127.0.0.1:PORT/acp``).

    Nothing is sent until the first call (``initialize`` must come first). ``http_client``
    replaces the SDK's own ``httpx2.AsyncClient(http2=True, timeout=None)``, which speaks
    HTTP/1.1 on ``http://`` (and offers HTTP/2 on ``https://``); ``tls``: the trust of that
    same client toward an ``https://`` URL; ``headers`` go on every request.
    """
    async with contextlib.AsyncExitStack() as stack:
        if http_client is None and tls is not None:  # closed here: the SDK closes only its own
            http_client = httpx2.AsyncClient(http2=True, timeout=None, verify=tls)
            stack.push_async_callback(http_client.aclose)
        transport = create_http_stream(url, client=http_client, headers=headers)
        async with _connected(transport, client, observers) as conn:
            yield conn


@contextlib.asynccontextmanager
async def connect_ws(
    url: str,
    client: Any = None,
    *,
    headers: dict[str, str] | None = None,
    observers: Sequence[StreamObserver] = (),
    cookie_store: MemoryAcpCookieStore | None = None,
    max_size: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client over WebSocket to ``url`` (``ws://`` or ``http://``, converted; ``wss://``
    or ``https://`` in TLS).

    The handshake happens on entry (a refused upgrade raises here); ``initialize`` must still be
    the first call. The SDK's WebSocket client keeps the ``websockets`` default of at most 1 MiB
    per received message (a larger one closes the socket with 1009): pass ``max_size`` to raise
    it, or ``tls`` to trust a CA of the test's own, which builds the transport from the SDK's
    private ``_WebSocketTransport`` and skips the cookie store.
    """
    if max_size is None and tls is None:
        transport = await create_websocket_stream(
            ws_url(url), headers=headers, cookie_store=cookie_store
        )
    else:
        from acp.ws.client import _WebSocketTransport
        from websockets.asyncio.client import connect as ws_connect

        socket = await ws_connect(
            ws_url(url),
            additional_headers=headers,
            max_size=max_size if max_size is not None else 2**20,
            ssl=tls,
        )
        transport = _WebSocketTransport(socket)
    async with _connected(transport, client, observers) as conn:
        yield conn


@contextlib.asynccontextmanager
async def _connected(
    transport: Transport, client: Any, observers: Sequence[StreamObserver]
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client (``client``, or a :class:`SimpleClient`) on ``transport``, closed on exit."""
    conn = connect_to_agent(
        cast(Client, client if client is not None else SimpleClient()),
        transport,
        observers=list(observers),
    )
    try:
        yield conn
    finally:
        await conn.close()


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
    kind: str, url: str, client: SimpleClient, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client over ``kind`` (http or ws) to ``url`` (``tls``: its trust for a URL in
    TLS)."""
    connect = connect_ws if kind == "ws" else connect_http
    async with connect(url, client, tls=tls) as conn:
        yield conn


@contextlib.asynccontextmanager
async def stdio_client(
    upstream: str | None, client: SimpleClient, *options: str
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client launching ``acp-proxy run OPTIONS --upstream URL`` as its agent (without
    ``upstream``: ``acp-proxy run OPTIONS -- SDK_AGENT``)."""
    target = ["--upstream", upstream] if upstream is not None else ["--", *SDK_AGENT]
    async with spawn_agent_process(
        cast(Client, client),
        sys.executable,
        "-m",
        "proxy",
        "run",
        *options,
        *target,
        transport_kwargs={"limit": DEFAULT_MAX_MESSAGE_BYTES, "stderr": None},
    ) as (conn, _process):
        yield conn


@dataclass
class HttpAgent:
    """A running ``sdk_http_agent.py``."""

    url: str
    """``http://127.0.0.1:PORT/acp``, as the agent printed it."""
    process: asyncio.subprocess.Process

    @property
    def ws_url(self) -> str:
        return ws_url(self.url)


def run_sdk_http_agent(*args: str) -> contextlib.AbstractAsyncContextManager[HttpAgent]:
    """Start ``sdk_http_agent.py ARGS`` (stderr inherited) and yield once it is listening.

    Waits ``harness.TIMEOUT`` at most for the line. On exit the agent gets SIGTERM, then SIGKILL
    if it has not stopped within ``harness.TIMEOUT``.
    Anything it writes to stdout after the ``LISTENING`` line fails the exit.
    """
    return _run_listening_agent(sys.executable, str(HTTP_AGENT), *args)


def run_node_agent(*args: str) -> contextlib.AbstractAsyncContextManager[HttpAgent]:
    """Start the TypeScript SDK's Agent, ``node/agent.mjs ARGS``, as :func:`run_sdk_http_agent`
    does (only where :data:`NODE_AGENT_MISSING` is None)."""
    return _run_listening_agent("node", str(NODE_AGENT), *args)


@contextlib.asynccontextmanager
async def _run_listening_agent(*argv: str) -> AsyncIterator[HttpAgent]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    name = Path(argv[1]).name
    assert process.stdout is not None
    try:
        async with asyncio.timeout(TIMEOUT):
            line = (await process.stdout.readline()).decode()
        if not line.startswith(LISTENING):
            msg = f"{name} did not start: first stdout line {line!r}"
            raise RuntimeError(msg)
        yield HttpAgent(url=line.removeprefix(LISTENING).strip(), process=process)
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            async with asyncio.timeout(TIMEOUT):
                rest = await process.stdout.read()
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
    if rest:
        msg = f"{name} wrote more than its LISTENING line to stdout: {rest!r}"
        raise AssertionError(msg)


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
