"""Session-scoped messages toward an HTTP Agent: ``Acp-Session-Id`` and the session's SSE stream.

Toward an Agent served over Streamable HTTP the proxy puts ``Acp-Session-Id`` on every POST whose
message names a session, whatever its method, and opens a session's stream the first time a
message to or from the Agent names it: a session made before the proxy existed can be loaded or
resumed through it, and its updates, its permission requests and its answers reach the Client.

Real HTTP Agents: the Python SDK's server (``sdk_http_agent.py``), the same behind the TypeScript
server's rule on the header (``--require-session-header``), and the TypeScript SDK's own server
(``node/agent.mjs``, skipped where node or its modules are missing; ``.ci/run`` installs them).
The last part replays, with an Agent of ours, the load and resume cases of the Python SDK's own
HTTP loopback tests with the proxy between its Client and its server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import uvicorn
from acp import PROTOCOL_VERSION, Agent, RequestError
from acp.client.connection import ClientSideConnection
from acp.http.asgi import create_asgi_app
from acp.schema import (
    AgentCapabilities,
    AgentMessageChunk,
    AllowedOutcome,
    InitializeResponse,
    LoadSessionResponse,
    PermissionOption,
    PromptResponse,
    ResumeSessionResponse,
    TextContentBlock,
    ToolCallUpdate,
)
from harness import TIMEOUT, ProxyProcess, log_events, notification, request
from peers.sdk_remote_client import (
    NODE_AGENT_MISSING,
    HttpAgent,
    SimpleClient,
    connect_http,
    listening_proxy,
    run_node_agent,
    run_sdk_http_agent,
    sdk_client,
    stdio_client,
)
from peers.stalling import ScriptedHttpAgent

from proxy.core.jsonrpc import Message
from proxy.shell.metrics import Metrics
from proxy.shell.transports import http_upstream

AGENTS = ["python", "python-gated", "typescript"]
"""The Python SDK's server; the same requiring the header as the TS one does; the TS one."""


@contextlib.asynccontextmanager
async def http_agent(kind: str) -> AsyncIterator[HttpAgent]:
    """A running HTTP Agent of ``kind`` (one of :data:`AGENTS`)."""
    if kind == "typescript":
        if NODE_AGENT_MISSING is not None:
            pytest.skip(NODE_AGENT_MISSING)
        async with run_node_agent() as agent:
            yield agent
        return
    flags = ["--require-session-header"] if kind == "python-gated" else []
    async with run_sdk_http_agent(*flags) as agent:
        yield agent


@contextlib.asynccontextmanager
async def through_proxy(
    client_kind: str, upstream: str, client: SimpleClient
) -> AsyncIterator[ClientSideConnection]:
    """The SDK Client reaching ``upstream`` through a proxy: it launches the proxy over stdio,
    or reaches the proxy's ``--listen`` over HTTP or WebSocket."""
    if client_kind == "stdio":
        async with stdio_client(upstream, client) as conn:
            yield conn
        return
    listen = f"{client_kind}://127.0.0.1:0/acp"
    async with (
        listening_proxy(listen, "--upstream", upstream) as (_proxy, url),
        sdk_client(client_kind, url, client) as conn,
    ):
        yield conn


def said(client: SimpleClient, session: str, value: str) -> Callable[[], bool]:
    """Whether the Agent has said ``value`` in ``session`` to ``client``."""
    return lambda: (session, value) in client.chunks


async def made_elsewhere(url: str) -> list[str]:
    """Two sessions made and prompted straight at the Agent, on a connection of their own that
    has ended before any proxy runs: their ids."""
    client = SimpleClient()
    async with connect_http(url, client) as conn:
        async with asyncio.timeout(TIMEOUT):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            sessions = []
            for _ in range(2):
                session = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
                await conn.prompt(
                    session_id=session,
                    prompt=[TextContentBlock(type="text", text="echo before the proxy")],
                )
                await client.until(said(client, session, "before the proxy"))
                sessions.append(session)
    return sessions


@pytest.mark.parametrize("client_kind", ["stdio", "http", "ws"])
@pytest.mark.parametrize("agent_kind", AGENTS)
async def test_a_session_made_before_the_proxy_is_loaded_resumed_and_prompted_through_it(
    agent_kind: str, client_kind: str
) -> None:
    """One session made before the proxy existed is loaded, another resumed, through the proxy:
    the replayed history and the resume's update reach the Client, then each is prompted, and
    the Agent's ``session/request_permission`` is answered and its updates arrive."""
    async with http_agent(agent_kind) as agent:
        loaded, resumed = await made_elsewhere(agent.url)
        client = SimpleClient()
        async with through_proxy(client_kind, agent.url, client) as conn:
            async with asyncio.timeout(TIMEOUT):
                init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
                assert init.agent_capabilities is not None
                assert init.agent_capabilities.load_session

                await conn.load_session(cwd="/tmp", session_id=loaded, mcp_servers=[])
                await client.until(said(client, loaded, "before the proxy"))
                await conn.resume_session(cwd="/tmp", session_id=resumed, mcp_servers=[])
                await client.until(said(client, resumed, "resumed"))

                for session in (loaded, resumed):
                    answer = await conn.prompt(
                        session_id=session,
                        prompt=[TextContentBlock(type="text", text="permission")],
                    )
                    assert answer.stop_reason == "end_turn"
                    await client.until(said(client, session, "permission: selected allow"))


@pytest.mark.parametrize("agent_kind", ["python-gated", "typescript"])
async def test_every_message_naming_a_session_carries_its_header(agent_kind: str) -> None:
    """Methods no list names (``session/set_model``, ``session/delete``, ``session/fork``, an
    extension request and notification with ``params.sessionId``) reach an Agent that requires
    ``Acp-Session-Id`` whenever ``params.sessionId`` is there: each request is answered by the
    Agent itself, not refused at the HTTP level (-32603 with the 400)."""
    async with http_agent(agent_kind) as agent:
        proxy = await ProxyProcess.start([], "--log-format", "json", "--upstream", agent.url)
        try:
            await proxy.send(request(0, "initialize", {"protocolVersion": PROTOCOL_VERSION}))
            assert "result" in await proxy.recv_json()
            await proxy.send(request(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
            session = (await proxy.recv_json())["result"]["sessionId"]
            named = {"sessionId": session}
            await proxy.send_json(
                {"jsonrpc": "2.0", "method": "_probe/note", "params": {"sessionId": session}}
            )
            calls = [
                ("session/set_model", {**named, "modelId": "m"}),
                ("session/delete", named),
                ("session/fork", {**named, "cwd": "/tmp", "mcpServers": []}),
                ("_probe/ask", named),
            ]
            for number, (method, params) in enumerate(calls, start=2):
                await proxy.send(request(number, method, params))
                answer = await proxy.recv_json()
                assert answer["id"] == number
                assert answer.get("error", {}).get("code") != -32603, (method, answer)
            assert not log_events(proxy.stderr, "the agent refused a POST"), proxy.stderr
        finally:
            await proxy.stop()


async def relay_to(upstream: http_upstream.HttpUpstream, *messages: bytes) -> list[object]:
    """Send ``messages`` (``initialize`` first) through ``upstream``: the ids answered."""
    for message in messages:
        upstream.send(message)
    answered = []
    for _ in [message for message in messages if "id" in json.loads(message)]:
        answer = await asyncio.wait_for(upstream.receive(), TIMEOUT)
        assert isinstance(answer, Message)  # parsed to be routed: the relay takes the parse
        answered.append(json.loads(answer.raw)["id"])
    return answered


async def test_each_post_carries_the_session_its_message_names() -> None:
    """Every POST whose message has ``params.sessionId``, a request or a notification of any
    method, carries ``Acp-Session-Id`` equal to it, and no other POST does; the stream of each
    session is opened, and its GET answered, before the first message naming it is POSTed."""
    async with ScriptedHttpAgent() as agent:
        upstream = await http_upstream.connect_http(agent.url, limit=1 << 20)
        try:
            answered = await relay_to(
                upstream,
                request(1, "initialize", {"protocolVersion": 2}),
                notification("_x/note", {"sessionId": "s1"}),
                request(2, "session/set_model", {"sessionId": "s1", "modelId": "m"}),
                request(3, "_x/other", {"sessionId": "s2"}),
                request(4, "_x/plain", {}),
                request(5, "session/fork", {"sessionId": "s3", "cwd": "/"}),
            )
            assert answered == [1, 2, 3, 4, 5]
            assert agent.posted_sessions == [None, "s1", "s1", "s2", None, "s3"]
            assert agent.session_streams == ["s1", "s2", "s3"]
        finally:
            upstream.close()
            await asyncio.wait_for(upstream.wait_closed(), TIMEOUT)


async def test_session_streams_toward_an_agent_are_bounded() -> None:
    """No more than ``max_sessions`` session streams are open at once on a connection: a message
    naming one more session is POSTed all the same, with its header, and counted."""
    metrics = Metrics()
    async with ScriptedHttpAgent() as agent:
        upstream = await http_upstream.connect_http(
            agent.url, limit=1 << 20, max_sessions=2, observer=metrics
        )
        try:
            answered = await relay_to(
                upstream,
                request(1, "initialize", {"protocolVersion": 2}),
                *(request(n, "_x/named", {"sessionId": f"s{n}"}) for n in (2, 3, 4)),
            )
            assert answered == [1, 2, 3, 4]
            assert agent.session_streams == ["s2", "s3"]
            assert agent.posted_sessions == [None, "s2", "s3", "s4"]
            counted = metrics.registry.get_sample_value(
                "acp_proxy_limit_reached_total", {"limit": "sessions", "where": "upstream"}
            )
            assert counted is not None
            assert counted >= 1
        finally:
            upstream.close()
            await asyncio.wait_for(upstream.wait_closed(), TIMEOUT)


# -- the Python SDK's own HTTP loopback cases, with the proxy in between -------------------------


class SavedSessionAgent:
    """Loads or resumes any session id, never made by ``session/new`` here (the Python SDK's own
    loopback tests use such an Agent): a load first says ``history`` chunks ``history-N``; a
    prompt says ``hello`` and asks the Client's permission; the extension request ``_push``
    says ``pushed`` in ``params.session``, as an Agent at work on its own would. ``refuse`` makes
    load and resume fail. One instance serves every connection (they come one at a time)."""

    def __init__(self, history: int = 0) -> None:
        self.history = history
        self.refuse = False
        self.permissions: list[str] = []
        """The option the Client chose, for each permission asked."""
        self._conn: Any = None

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=protocol_version,
            agent_capabilities=AgentCapabilities(load_session=True),
        )

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        for number in range(self.history):
            await self._chunk(session_id, f"history-{number}")
        if self.refuse:
            raise RequestError(-32000, "load failed")
        return LoadSessionResponse()

    async def resume_session(
        self, session_id: str, cwd: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        if self.refuse:
            raise RequestError(-32000, "resume failed")
        return ResumeSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        await self._chunk(session_id, "hello")
        answer = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id="t1", title="run"),
            options=[PermissionOption(option_id="allow", name="Allow", kind="allow_once")],
        )
        assert isinstance(answer.outcome, AllowedOutcome)
        self.permissions.append(answer.outcome.option_id)
        return PromptResponse(stop_reason="end_turn")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert method == "push"
        await self._chunk(params["session"], "pushed")
        return {}

    async def _chunk(self, session_id: str, value: str) -> None:
        chunk = AgentMessageChunk(content=TextContentBlock(text=value))
        await self._conn.session_update(session_id=session_id, update=chunk)


class _Server(uvicorn.Server):
    """uvicorn that tells when it listens (or gave up starting)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.up.set()


@contextlib.asynccontextmanager
async def serve(agent: SavedSessionAgent) -> AsyncIterator[str]:
    """The Python SDK's ASGI server for ``agent``, under uvicorn on this event loop: its URL."""
    app = create_asgi_app(lambda conn: cast(Agent, agent))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
    server = _Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        async with asyncio.timeout(TIMEOUT):
            await server.up.wait()
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/acp"
    finally:
        server.should_exit = True
        async with asyncio.timeout(TIMEOUT):
            await serving


@contextlib.asynccontextmanager
async def loopback(
    agent: SavedSessionAgent, client_kind: str, upstream: str, client: SimpleClient
) -> AsyncIterator[ClientSideConnection]:
    """The Python SDK's Client (``client_kind``: http or ws) to the proxy, the proxy to the SDK's
    server serving ``agent`` over ``upstream`` (http or ws)."""
    async with serve(agent) as url:
        target = url if upstream == "http" else url.replace("http://", "ws://", 1)
        async with through_proxy(client_kind, target, client) as conn:
            yield conn


@pytest.mark.parametrize("history", [0, 1100])
@pytest.mark.parametrize("upstream", ["http", "ws"])
@pytest.mark.parametrize("client_kind", ["http", "ws"])
async def test_a_saved_session_is_loaded_twice_and_prompted_through_the_proxy(
    client_kind: str, upstream: str, history: int
) -> None:
    """``session/load`` of a session this connection never made, twice: the history comes
    before the answer each time, an update the Agent then sends on its own arrives, and a prompt
    streams its update and its permission request (over ``--upstream http://`` it hung there:
    the session's stream was never opened)."""
    agent = SavedSessionAgent(history)
    client = SimpleClient()
    async with loopback(agent, client_kind, upstream, client) as conn:
        async with asyncio.timeout(TIMEOUT):
            init = await conn.initialize(protocol_version=1)
            assert init.agent_capabilities is not None
            assert init.agent_capabilities.load_session
            for attempt in range(2):
                client.chunks.clear()
                loaded = await conn.load_session(cwd="/", session_id="saved-session")
                assert loaded == LoadSessionResponse()
                assert client.texts() == [f"history-{number}" for number in range(history)]
                await conn.ext_method("push", {"session": "saved-session"})
                await client.until(lambda: "pushed" in client.texts())
                result = await conn.prompt(session_id="saved-session", prompt=[])
                assert result.stop_reason == "end_turn"
                assert agent.permissions == ["allow"] * (attempt + 1)
                assert client.texts()[-1] == "hello"


@pytest.mark.parametrize("upstream", ["http", "ws"])
@pytest.mark.parametrize("client_kind", ["http", "ws"])
async def test_a_failed_load_can_be_retried_and_keeps_the_loaded_session(
    client_kind: str, upstream: str
) -> None:
    """A refused ``session/load`` reaches the Client as the Agent's error and can be retried; a
    later refused reload leaves the loaded session usable."""
    agent = SavedSessionAgent(history=1)
    async with loopback(agent, client_kind, upstream, SimpleClient()) as conn:
        async with asyncio.timeout(TIMEOUT):
            await conn.initialize(protocol_version=1)
            agent.refuse = True
            with pytest.raises(RequestError, match="load failed"):
                await conn.load_session(cwd="/", session_id="saved-session")
            agent.refuse = False
            agent.history = 0
            await conn.load_session(cwd="/", session_id="saved-session")
            agent.refuse = True
            with pytest.raises(RequestError, match="load failed"):
                await conn.load_session(cwd="/", session_id="saved-session")
            result = await conn.prompt(session_id="saved-session", prompt=[])
            assert result.stop_reason == "end_turn"


@pytest.mark.parametrize("upstream", ["http", "ws"])
@pytest.mark.parametrize("client_kind", ["http", "ws"])
async def test_a_resumed_session_is_prompted_through_the_proxy(
    client_kind: str, upstream: str
) -> None:
    """A refused ``session/resume`` can be retried; an update the Agent sends on its own for the
    resumed session arrives, and its prompt streams its update and its permission request (over
    ``--upstream http://`` it hung)."""
    agent = SavedSessionAgent()
    client = SimpleClient()
    async with loopback(agent, client_kind, upstream, client) as conn:
        async with asyncio.timeout(TIMEOUT):
            await conn.initialize(protocol_version=1)
            agent.refuse = True
            with pytest.raises(RequestError, match="resume failed"):
                await conn.resume_session(cwd="/", session_id="saved-session")
            agent.refuse = False
            resumed = await conn.resume_session(cwd="/", session_id="saved-session")
            assert resumed == ResumeSessionResponse()
            await conn.ext_method("push", {"session": "saved-session"})
            await client.until(lambda: "pushed" in client.texts())
            result = await conn.prompt(session_id="saved-session", prompt=[])
            assert result.stop_reason == "end_turn"
            assert agent.permissions == ["allow"]
            assert client.texts()[-1] == "hello"
