"""Streamable HTTP and WebSocket on both sides, in every pairing with stdio, with the official SDK.

The SDK Client (over HTTP, WebSocket, or stdio by launching the proxy) talks through a real proxy
process to the SDK Agent (spawned over stdio, or served over HTTP and WebSocket by uvicorn).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
from pathlib import Path

import aiohttp
import pytest
import websockets
from harness import SDK_AGENT, TIMEOUT, raw_agent, system_pipe_size
from peers.sdk_remote_client import (
    SimpleClient,
    exercise,
    listening_proxy,
    run_sdk_http_agent,
    sdk_client,
    stdio_client,
)
from peers.stalling import ScriptedHttpAgent

from proxy.shell.transports.cookies import MAX_PENDING, CookieRoute, SetCookies


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


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux's pipe sizes")
async def test_the_agents_of_a_listener_keep_the_pipes_the_system_made(tmp_path: Path) -> None:
    """One Agent per link: widening their pipes would take the user's pipe budget a link at a
    time (``PIPE_BYTES``), so a listener's Agents keep the system's own."""
    agent = raw_agent(tmp_path / "capture")
    async with (
        listening_proxy("ws://127.0.0.1:0/acp", agent=agent) as (_proxy, url),
        websockets.connect(url, open_timeout=TIMEOUT) as ws,
    ):
        await ws.send('{"jsonrpc":"2.0","id":1,"method":"_test/pipes"}')
        answer = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
    made = system_pipe_size()
    assert answer["result"] == {"stdin": made, "stdout": made}


# -- cookies the Agent sets ---------------------------------------------------------------------

AGENT_COOKIES = {
    "initialize": "init=1; Path=/",
    "GET": "stream=2",
    "_x/later": "later=3",
    "websocket": "ws=4; HttpOnly",
}


@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_cookies_the_agent_sets_reach_an_http_client_once(upstream: str) -> None:
    """Each Set-Cookie of the Agent reaches the HTTP Client once, on its first response after the
    cookie was set: the initialize answer carries those of the Agent's handshake or initialize
    answer. The proxy's own jar returns them to the Agent as well."""
    async with ScriptedHttpAgent(set_cookies=AGENT_COOKIES) as agent:
        target = agent.url if upstream == "http" else agent.url.replace("http://", "ws://", 1)
        listen = "http://127.0.0.1:0/acp"
        async with (
            listening_proxy(listen, "--upstream", target) as (_proxy, url),
            aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
        ):
            given: list[list[str]] = []
            headers = {"Content-Type": "application/json"}

            async def post(message: dict[str, object]) -> aiohttp.ClientResponse:
                body = json.dumps({"jsonrpc": "2.0", **message})
                async with http.post(url, data=body, headers=headers) as response:
                    given.append(response.headers.getall("Set-Cookie", []))
                    await response.read()
                    return response

            init = await post({"id": 1, "method": "initialize", "params": {}})
            assert init.status == 200
            headers["Acp-Connection-Id"] = init.headers["Acp-Connection-Id"]
            stream_headers = {**headers, "Accept": "text/event-stream"}
            async with http.get(url, headers=stream_headers) as stream:
                given.append(stream.headers.getall("Set-Cookie", []))
                for request_id, method in ((2, "_x/later"), (3, "_x/next")):
                    assert (await post({"id": request_id, "method": method})).status == 202
                    async with asyncio.timeout(TIMEOUT):
                        while f'"id": {request_id}'.encode() not in await stream.content.readline():
                            pass
                # _x/next was POSTed to the Agent after _x/later's answer was read (one POST at a
                # time): a later cookie set on that answer is given by now, or on this response.
                assert (await post({"method": "_x/done"})).status == 202
    if upstream == "http":
        assert "init=1; Path=/" in given[0]
        assert sorted(value for values in given for value in values) == [
            "init=1; Path=/",
            "later=3",
            "stream=2",
        ]
        assert "later=3" in given[-2] + given[-1]
        assert all("init=1" in (cookie or "") for cookie in agent.cookies[1:])  # the jar
    else:
        assert given == [["ws=4; HttpOnly"]] + [[]] * (len(given) - 1)


async def test_cookies_of_a_websocket_agent_reach_a_websocket_client_on_the_101() -> None:
    """The proxy connects the Agent before it answers the upgrade, so its 101 carries the cookies
    the Agent's 101 set."""
    async with ScriptedHttpAgent(set_cookies=AGENT_COOKIES) as agent:
        target = agent.url.replace("http://", "ws://", 1)
        async with (
            listening_proxy("ws://127.0.0.1:0/acp", "--upstream", target) as (_proxy, url),
            websockets.connect(url, proxy=None) as connection,
        ):
            assert connection.response is not None
            assert connection.response.headers.get_all("Set-Cookie") == ["ws=4; HttpOnly"]
            await connection.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize"}))
            answer = json.loads(await asyncio.wait_for(connection.recv(), TIMEOUT))
            assert answer["result"] == {"protocolVersion": 2}


async def test_a_cookie_set_after_a_websocket_clients_101_is_logged_not_lost_silently() -> None:
    """A WebSocket Client has no response left to carry a cookie an HTTP Agent sets on its
    initialize answer: the proxy says so (its jar still returns the cookie to the Agent)."""
    async with (
        ScriptedHttpAgent(set_cookies=AGENT_COOKIES) as agent,
        listening_proxy("ws://127.0.0.1:0/acp", "--upstream", agent.url) as (proxy, url),
        websockets.connect(url, proxy=None) as connection,
    ):
        assert connection.response is not None
        assert connection.response.headers.get_all("Set-Cookie") == []
        await connection.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize"}))
        assert json.loads(await asyncio.wait_for(connection.recv(), TIMEOUT))["id"] == 1
        event = await proxy.logged(
            "the agent set a cookie after the client's last response; not passed on"
        )
        assert event["cookie"] == "init"
        await connection.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "_x/later"}))
        assert json.loads(await asyncio.wait_for(connection.recv(), TIMEOUT))["id"] == 2
    assert "init=1" in (agent.cookies[-1] or "")


async def test_a_client_taking_over_a_kept_agent_gets_its_cookies() -> None:
    """--keep-upstream: the next Client takes over the Agent connection, and with it the cookies
    the Agent set (given on its first response) and every one it sets from then on; none of them
    goes to the Client that left."""
    async with (
        ScriptedHttpAgent(set_cookies=AGENT_COOKIES) as agent,
        listening_proxy("http://127.0.0.1:0/acp", "--keep-upstream", "--upstream", agent.url) as (
            proxy,
            url,
        ),
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        json_type = {"Content-Type": "application/json"}
        async with http.post(url, json=init, headers=json_type) as first:
            assert first.status == 200
            assert "init=1; Path=/" in first.headers.getall("Set-Cookie", [])
            gone = {**json_type, "Acp-Connection-Id": first.headers["Acp-Connection-Id"]}
        async with http.delete(url, headers=gone) as deleted:
            assert deleted.status == 202
        await proxy.logged("client gone; keeping the agent connection for the next client")

        given: list[str] = []
        async with http.post(url, json=init, headers=json_type) as second:
            assert second.status == 200  # answered from the cached initialize
            given += second.headers.getall("Set-Cookie", [])
            headers = {**json_type, "Acp-Connection-Id": second.headers["Acp-Connection-Id"]}
        assert "init=1; Path=/" in given
        async with http.get(url, headers={**headers, "Accept": "text/event-stream"}) as stream:
            later = {"jsonrpc": "2.0", "id": 2, "method": "_x/later"}
            async with http.post(url, json=later, headers=headers) as posted:
                assert posted.status == 202
                given += posted.headers.getall("Set-Cookie", [])
            async with asyncio.timeout(TIMEOUT):
                while b'"id": 2' not in await stream.content.readline():
                    pass
            done = {"jsonrpc": "2.0", "method": "_x/done"}
            async with http.post(url, json=done, headers=headers) as posted:
                assert posted.status == 202
                given += posted.headers.getall("Set-Cookie", [])
        # The Agent set stream=2 on the event stream the proxy opened for the first Client.
        assert sorted(given) == ["init=1; Path=/", "later=3", "stream=2"]


def test_set_cookies_are_given_once_kept_bounded_and_counted_once_closed() -> None:
    """The holder between the two sides: each value taken once, the oldest dropped past the
    bound, and every value set after :meth:`close` counted, not kept."""
    cookies = SetCookies()
    cookies.add(["a=1", "b=2"])
    assert cookies.take() == ["a=1", "b=2"]
    assert cookies.take() == []
    cookies.add(f"c{n}=1" for n in range(MAX_PENDING + 3))
    assert cookies.take() == [f"c{n}=1" for n in range(3, MAX_PENDING + 3)]
    cookies.add(["d=1"])
    cookies.close()
    cookies.add(["e=1", "f=1"])
    assert (cookies.take(), cookies.undelivered) == ([], 3)


def test_a_cookie_route_moves_to_the_next_client_with_the_latest_value_of_each_cookie() -> None:
    """Pointed at a new Client connection, a route gives it the latest value of every cookie set
    so far (at most MAX_PENDING names), closes the old one, and sends it what follows."""
    old, new = SetCookies(), SetCookies()
    route = CookieRoute(old)
    route.add(["a=1", "b=2", "a=3; Path=/"])
    assert old.take() == ["a=1", "b=2", "a=3; Path=/"]
    route.point(new)
    assert new.take() == ["b=2", "a=3; Path=/"]
    route.add(["c=4"])
    assert (old.take(), old.closed, new.take()) == ([], True, ["c=4"])
    route.add(f"n{n}=1" for n in range(MAX_PENDING + 1))
    newest = SetCookies()
    route.point(newest)
    assert newest.take() == [f"n{n}=1" for n in range(1, MAX_PENDING + 1)]
