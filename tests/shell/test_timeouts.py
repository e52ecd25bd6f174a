"""Every wait on a peer is bounded: each timeout of ``acp-proxy run`` fires against a real loopback
peer that stalls, tells the Client clearly, and leaves the proxy (and where it can, the link)
serving.

The peers (``tests/support/peers/stalling.py``): a TCP port whose accept queue is full (connect hangs),
a server that accepts and never answers, a Streamable HTTP Agent that hangs on chosen POSTs, on
DELETE or on its streams, and the raw Agent leaving ``initialize`` unanswered. Timeouts are set
short through the options; the test waits on the outcome itself, never on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import websockets
from harness import TIMEOUT, ProxyProcess, log_events, raw_agent, request
from peers.stalling import ScriptedHttpAgent, silent_server, unaccepting_server
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from proxy.core.jsonrpc import Message
from proxy.shell.transports.http_upstream import connect_http

SHORT = "0.3"
"""Seconds, for the timeout under test."""
INITIALIZE = {"protocolVersion": 2, "capabilities": {}}
INTERNAL_ERROR = -32603


@contextlib.asynccontextmanager
async def proxy(agent: list[str], *options: str) -> AsyncIterator[ProxyProcess]:
    """``acp-proxy run`` with JSON logs; killed at the end if still running."""
    process = await ProxyProcess.start(agent, "--log-format", "json", *options)
    try:
        yield process
    finally:
        await process.stop()


async def listening(process: ProxyProcess) -> str:
    """The URL the proxy listens on."""
    return str((await process.logged("listening"))["url"])


async def call(
    connection: ClientConnection, number: object, method: str, params: Any = None
) -> Any:
    """Send a request over a WebSocket; its answer."""
    await connection.send(request(number, method, params).decode())
    async with asyncio.timeout(TIMEOUT):
        return json.loads(await connection.recv())


async def closed_with(connection: ClientConnection) -> int | None:
    """Wait until the proxy closes ``connection``; the close code."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(TIMEOUT):
            await connection.recv()
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


def assert_error(answer: Any, number: object, text: str) -> dict[str, Any]:
    """``answer`` is the JSON-RPC error -32603 for request ``number``, with ``text`` in it."""
    assert answer["id"] == number, answer
    assert answer["error"]["code"] == INTERNAL_ERROR, answer
    assert text in answer["error"]["message"], answer
    error: dict[str, Any] = answer["error"]
    return error


# -- connect ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stall", ["connect", "handshake"])
async def test_connect_timeout_closes_the_websocket_client_and_the_proxy_goes_on(
    stall: str,
) -> None:
    """A WebSocket Agent whose TCP connect, or whose handshake, never completes: after
    --connect-timeout the Client's WebSocket is closed with 1011 and the failure is logged; the
    next Client meets the same, from a proxy still serving."""
    async with contextlib.AsyncExitStack() as stack:
        if stall == "connect":
            port = stack.enter_context(unaccepting_server())
        else:
            port = await stack.enter_async_context(silent_server())
        upstream = f"ws://127.0.0.1:{port}/acp"
        options = ["--listen", "ws://127.0.0.1:0/acp", "--upstream", upstream]
        process = await stack.enter_async_context(proxy([], *options, "--connect-timeout", SHORT))
        url = await listening(process)
        for attempt in (1, 2):
            async with ws_connect(url) as connection:
                assert await closed_with(connection) == 1011
            failed = await process.logged("could not connect to the agent", attempt)
            assert "Timeout" in failed["error"] or "timed out" in failed["error"]
        assert process.process.returncode is None


async def test_a_websocket_client_that_leaves_while_the_agent_is_connected_ends_quietly() -> None:
    """The upgrade is answered once the Agent is connected (its 101 carries the Agent's cookies):
    a Client that hangs up before is logged and forgotten; the proxy goes on serving."""
    accepted = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()  # the proxy is connecting the Agent: its handshake is never answered
        await reader.read()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, contextlib.AsyncExitStack() as stack:
        options = ["--listen", "ws://127.0.0.1:0/acp", "--upstream", f"ws://127.0.0.1:{port}/acp"]
        process = await stack.enter_async_context(proxy([], *options, "--connect-timeout", SHORT))
        url = urlsplit(await listening(process))
        _, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(
            f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        await writer.drain()
        await asyncio.wait_for(accepted.wait(), TIMEOUT)
        writer.close()  # before the Agent's connection fails, and so before any answer
        await process.logged("could not connect to the agent")
        await process.logged("the client left before its upgrade was answered")
        async with ws_connect(url.geturl()) as connection:
            assert await closed_with(connection) == 1011  # the next Client is served
        assert process.process.returncode is None


async def test_connect_timeout_to_an_http_agent_answers_the_initialize() -> None:
    """An HTTP Agent whose TCP connect never completes: the Client's initialize is answered
    -32603 (the POST failed with 504) after --connect-timeout; the proxy goes on serving."""
    with unaccepting_server() as port:
        upstream = f"http://127.0.0.1:{port}/acp"
        options = ["--listen", "ws://127.0.0.1:0/acp", "--upstream", upstream]
        async with proxy([], *options, "--connect-timeout", SHORT) as process:
            url = await listening(process)
            for attempt in (1, 2):
                async with ws_connect(url) as connection:
                    answer = await call(connection, "init", "initialize", INITIALIZE)
                    error = assert_error(answer, "init", "the POST to the agent timed out")
                    assert error["data"] == {
                        "status": 504,
                        "body": f"could not connect within {float(SHORT):g} s",
                    }
                    assert await closed_with(connection) is not None  # no connection was made
                await process.logged("POST to the agent timed out", attempt)


# -- initialize ------------------------------------------------------------------------------------


def silent_on_initialize(tmp_path: Path) -> list[str]:
    """The raw Agent, answering every request but ``initialize``."""
    return raw_agent(tmp_path / "agent-saw.jsonl", "--no-answer", "initialize")


async def test_initialize_timeout_over_stdio_answers_an_error_and_the_link_goes_on(
    tmp_path: Path,
) -> None:
    """The Agent does not answer initialize: after --initialize-timeout the Client gets -32603
    for it (and a log line); its next request is relayed and answered as usual."""
    agent = silent_on_initialize(tmp_path)
    trace = tmp_path / "trace.jsonl"
    async with proxy(agent, "--initialize-timeout", SHORT, "--trace", str(trace)) as process:
        await process.send(request("init", "initialize", INITIALIZE))
        assert_error(
            await process.recv_json(), "init", f"did not answer initialize within {SHORT} s"
        )
        logged = await process.logged(
            "the agent did not answer initialize in time; the client got an error"
        )
        assert (logged["id"], logged["timeout_s"]) == ('"init"', float(SHORT))
        await process.send(request(2, "_x/ping"))
        assert (await process.recv_json())["id"] == 2
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    [timed_out] = [r for r in records if r.get("disposition") == "timed_out"]
    assert {k: v for k, v in timed_out.items() if k not in ("time", "link")} == {
        "event": "message",
        "disposition": "timed_out",
        "direction": "to_client",
        "kind": "error",
        "method": "initialize",
        "id": "init",
        "forwarded_id": 0,
        "timeout_ms": float(SHORT) * 1000,
    }


async def test_initialize_timeout_over_websocket(tmp_path: Path) -> None:
    """The same over a WebSocket listener: the error, then the link still relays."""
    options = ["--listen", "ws://127.0.0.1:0/acp", "--initialize-timeout", SHORT]
    async with (
        proxy(silent_on_initialize(tmp_path), *options) as process,
        ws_connect(await listening(process)) as connection,
    ):
        answer = await call(connection, 1, "initialize", INITIALIZE)
        assert_error(answer, 1, "did not answer initialize")
        assert (await call(connection, 2, "_x/ping"))["id"] == 2


async def test_initialize_timeout_over_http_answers_504(tmp_path: Path) -> None:
    """Over Streamable HTTP the initialize POST gets 504 with a JSON-RPC error for its id (no
    connection is made); the listener goes on serving other Clients."""
    options = ["--listen", "http://127.0.0.1:0/acp", "--initialize-timeout", SHORT]
    async with proxy(silent_on_initialize(tmp_path), *options) as process:
        url = await listening(process)
        async with aiohttp.ClientSession() as http:
            body = request("init", "initialize", INITIALIZE)
            headers = {"Content-Type": "application/json"}
            async with (
                asyncio.timeout(TIMEOUT),
                http.post(url, data=body, headers=headers) as answer,
            ):
                assert answer.status == 504
                assert "Acp-Connection-Id" not in answer.headers
                assert_error(await answer.json(), "init", "did not answer initialize within")
        await process.logged("the agent did not answer initialize in time")
        async with ws_connect(url.replace("http://", "ws://", 1)) as connection:
            assert (await call(connection, 2, "_x/ping"))["id"] == 2


# -- HTTP exchanges with an HTTP Agent -------------------------------------------------------------


async def test_http_timeout_answers_the_request_and_the_connection_goes_on() -> None:
    """A POST the HTTP Agent never answers: after --http-timeout the Client gets -32603 for
    that request (data: status 504) and a log line; later requests are relayed as usual."""
    async with ScriptedHttpAgent(hang_on=frozenset({"_x/hang"})) as agent:
        async with proxy([], "--upstream", agent.url, "--http-timeout", SHORT) as process:
            await process.send(request("init", "initialize", INITIALIZE))
            assert (await process.recv_json())["id"] == "init"
            await process.send(request(7, "_x/hang"))
            error = assert_error(await process.recv_json(), 7, "the POST to the agent timed out")
            assert error["data"] == {"status": 504, "body": f"no answer within {float(SHORT):g} s"}
            await process.logged("POST to the agent timed out")
            await process.send(request(8, "_x/ping"))
            assert await process.recv_json() == {
                "jsonrpc": "2.0",
                "id": 8,
                "result": {"method": "_x/ping"},
            }
        assert agent.methods == ["initialize", "_x/hang", "_x/ping"]


async def test_http_timeout_bounds_the_delete_when_a_client_leaves() -> None:
    """An HTTP Agent that never answers the DELETE: the link still ends after --http-timeout."""
    async with ScriptedHttpAgent(hang_delete=True) as agent:
        options = ["--listen", "ws://127.0.0.1:0/acp", "--upstream", agent.url]
        async with proxy([], *options, "--http-timeout", SHORT) as process:
            async with ws_connect(await listening(process)) as connection:
                assert (await call(connection, 1, "initialize", INITIALIZE))["id"] == 1
            await process.logged("link ended")
            assert agent.deletes == 1


async def test_http_timeout_bounds_a_stream_that_never_opens() -> None:
    """An HTTP Agent that never answers the GET of its connection stream: after --http-timeout
    the stream is given up, the link ends and the Client's WebSocket is closed."""
    async with ScriptedHttpAgent(hang_stream=True) as agent:
        options = ["--listen", "ws://127.0.0.1:0/acp", "--upstream", agent.url]
        async with proxy([], *options, "--http-timeout", SHORT) as process:
            async with ws_connect(await listening(process)) as connection:
                assert (await call(connection, 1, "initialize", INITIALIZE))["id"] == 1
                assert await closed_with(connection) is not None
            ended = await process.logged("a stream from the agent ended")
            assert ended["session"] is None
            assert log_events(process.stderr, "the agent's connection stream ended")


async def test_http_timeout_bounds_the_wait_for_a_sessions_stream() -> None:
    """A message naming a session waits for the GET of that session's stream to be answered
    before it is POSTed; an Agent that never answers that GET delays the message by
    --http-timeout at most, and the message still reaches it, with its Acp-Session-Id (the GET
    is tried again once the message is accepted)."""
    async with ScriptedHttpAgent(hang_session_streams=True) as agent:
        async with proxy([], "--upstream", agent.url, "--http-timeout", SHORT) as process:
            await process.send(request("init", "initialize", INITIALIZE))
            assert (await process.recv_json())["id"] == "init"
            await process.send(request(7, "_x/ping", {"sessionId": "sess-1"}))
            assert (await process.recv_json())["id"] == 7
            ended = await process.logged("a stream from the agent ended")
            assert ended["session"] == "sess-1"
        assert set(agent.session_streams) == {"sess-1"}  # once more after the POST, maybe
        assert agent.posted_sessions == [None, "sess-1"]


async def test_a_callers_bound_on_closing_an_http_upstream_holds() -> None:
    """Closing waits for the last POST; a caller that bounds that wait gets its TimeoutError
    (the wait used to swallow the cancel and go on waiting), and a sever then ends it at once."""
    async with ScriptedHttpAgent(hang_on=frozenset({"_x/hang"})) as agent:
        upstream = await connect_http(agent.url, limit=1 << 20, http_timeout=3600)
        upstream.send(request("init", "initialize", INITIALIZE))
        answer = await asyncio.wait_for(upstream.receive(), TIMEOUT)
        assert isinstance(answer, Message)
        assert json.loads(answer.raw)["id"] == "init"
        upstream.send(request(7, "_x/hang"))
        upstream.close()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(upstream.wait_closed(), 0.2)
        upstream.sever(flush=False)
        await asyncio.wait_for(upstream.wait_closed(), TIMEOUT)
