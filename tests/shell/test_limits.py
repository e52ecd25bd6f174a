"""What one peer can make the proxy hold, bounded (DESIGN 10): each limit reached and answered.

Each test runs a real proxy (a process, or the control API on this test's loop) on loopback and
checks the answer the peer gets, what the proxy then holds, and the count in
``acp_proxy_limit_reached_total{limit,where}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import TIMEOUT, ProxyProcess, captured, log_events, raw_agent
from listener_client import (
    CONNECTION_ID,
    HTTP_LISTEN,
    Http,
    Reply,
    notification,
    request,
    roundtrip,
)
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from proxy.control import ControlClient
from proxy.core.engine import FaultEngine
from proxy.core.events import Side
from proxy.core.observations import Connected
from proxy.shell.admin import AdminServer
from proxy.shell.limits import EVENT_BACKLOG
from proxy.shell.link import Link
from proxy.shell.metrics import Metrics
from proxy.shell.trace import EventFeed

LIMITED = "acp_proxy_limit_reached_total"


@contextlib.asynccontextmanager
async def limited(
    tmp_path: Path, *options: str, agent_flags: tuple[str, ...] = ()
) -> AsyncIterator[tuple[ProxyProcess, Http, ControlClient]]:
    """A proxy on ``127.0.0.1:0`` with its control API and ``options``, in front of the raw
    Agent; yields it, an HTTP client of its listener (a connection per request, so that no
    keep-alive socket the proxy closes is reused) and its control client."""
    agent = raw_agent(tmp_path / "capture", *agent_flags)
    proxy = await ProxyProcess.start(
        agent,
        *("--log-format", "json", "--listen", HTTP_LISTEN, "--admin", "127.0.0.1:0"),
        *options,
    )
    try:
        url = (await proxy.logged("listening"))["url"]
        admin = (await proxy.logged("control API listening"))["url"]
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            yield proxy, Http(session, url), ControlClient(admin)
    finally:
        await proxy.stop()


async def counted(control: ControlClient, limit: str, where: str) -> float:
    """``acp_proxy_limit_reached_total`` of one limit now."""
    return await asyncio.wait_for(
        asyncio.to_thread(control.metric, LIMITED, limit=limit, where=where), TIMEOUT
    )


def refused_with(reply: Reply, status: int, naming: str, request_id: Any = None) -> None:
    """``reply`` is ``status`` with a JSON-RPC error for ``request_id`` whose message names
    ``naming``."""
    assert reply.status == status, reply
    body = reply.json()
    assert body["id"] == request_id, body
    assert naming in body["error"]["message"], body


# -- links -------------------------------------------------------------------------------------


async def test_a_client_past_max_links_is_refused_before_any_agent_starts(tmp_path: Path) -> None:
    """--max-links 2: a third initialize gets 503, Retry-After and a JSON-RPC error for its id,
    a WebSocket upgrade 503 (no upgrade made); no Agent is started for either, each refusal is
    counted, and once a Client leaves a new one is served."""
    async with limited(tmp_path, "--max-links", "2") as (proxy, http, control):
        first = await http.initialize("a")
        await http.initialize("b")
        third = await http.post(request("c", "initialize", {"protocolVersion": 1}))
        refused_with(third, 503, "--max-links", "c")
        assert third.headers["Retry-After"] == "5"
        assert CONNECTION_ID not in third.headers
        with pytest.raises(InvalidStatus) as upgrade:
            async with ws_connect("ws" + http.url.removeprefix("http"), open_timeout=TIMEOUT):
                pass
        assert upgrade.value.response.status_code == 503
        assert upgrade.value.response.headers["Retry-After"] == "5"
        assert len(log_events(proxy.stderr, "agent started")) == 2
        assert await counted(control, "links", "listener") == 2
        (logged,) = log_events(proxy.stderr, "client refused: the links are at --max-links")[:1]
        assert logged["max_links"] == 2

        assert (await http.delete(connection=first)).status == 202
        await proxy.logged("link ended")
        await http.initialize("d")
        assert len(log_events(proxy.stderr, "agent started")) == 3


# -- idle HTTP connections ---------------------------------------------------------------------

IDLE = TIMEOUT / 6
"""--idle-timeout of the idle tests: past it a connection nobody touches is ended, well within
TIMEOUT; long enough that a Client of these tests has opened its stream or sent its request
before, on a busy machine too."""


async def test_an_idle_http_connection_is_ended_and_its_agent_stopped(tmp_path: Path) -> None:
    """A connection with no request, no stream and nothing pending for --idle-timeout is ended
    as a DELETE would end it: its Agent stopped, 404 afterwards, logged and counted. A connection
    whose Client reads its stream, or awaits an answer, is not idle: both outlive it."""
    options = ("--idle-timeout", str(IDLE))
    flags = ("--no-answer", "_x/hang")
    async with limited(tmp_path, *options, agent_flags=flags) as (proxy, http, control):
        streamed = await http.initialize("streamed")
        async with http.stream(streamed) as stream:
            waiting = await http.initialize("waiting")
            hang = await http.post(request("h", "_x/hang"), connection=waiting)
            assert hang.status == 202, hang
            idle = await http.initialize("idle")  # the last made, so the last due

            ended = await proxy.logged("idle client connection ended")
            assert ended["connection"] == idle[:8]
            assert (await http.post(request(1, "_test/probe"), connection=idle)).status == 404
            await proxy.logged("link ended")  # its Agent was stopped

            await roundtrip(http, stream, streamed, "still-served")
            note = await http.post(notification("_x/note"), connection=waiting)
            assert note.status == 202, note
        assert len(log_events(proxy.stderr, "idle client connection ended")) == 1
        assert await counted(control, "idle", "listener") == 1


# -- sessions per connection -------------------------------------------------------------------


async def test_a_connection_past_max_sessions_is_refused_with_429(tmp_path: Path) -> None:
    """--max-sessions 2: a POST naming a third session, a session/new, or a GET of a third
    session's stream get 429 with a JSON-RPC error naming the limit; the sessions the connection
    has go on, nothing refused reaches the Agent, each refusal is counted."""
    async with limited(tmp_path, "--max-sessions", "2") as (proxy, http, control):
        connection = await http.initialize()
        for session in ("s1", "s2"):
            seen = notification("session/cancel", {"sessionId": session})
            assert (await http.post(seen, connection=connection, session=session)).status == 202
        third = notification("session/cancel", {"sessionId": "s3"})
        refused_with(
            await http.post(third, connection=connection, session="s3"), 429, "--max-sessions"
        )
        new = request(7, "session/new", {"cwd": "/", "mcpServers": []})
        refused_with(await http.post(new, connection=connection), 429, "--max-sessions", 7)
        refused_with(await http.get(connection=connection, session="s4"), 429, "--max-sessions")

        async with http.stream(connection, "s1"), http.stream(connection) as main:
            again = notification("session/cancel", {"sessionId": "s1"})
            assert (await http.post(again, connection=connection, session="s1")).status == 202
            await roundtrip(http, main, connection, "after")  # the Agent has read all before
        seen_by_agent = b"\n".join(captured(tmp_path / "capture"))
        assert b"s3" not in seen_by_agent
        assert b"session/new" not in seen_by_agent
        assert await counted(control, "sessions", "listener") == 3
        assert (
            len(log_events(proxy.stderr, "session refused: the connection is at --max-sessions"))
            == 1
        )


# -- header time and idle sockets --------------------------------------------------------------


async def eof_within_timeout(reader: asyncio.StreamReader) -> bytes:
    """Everything the proxy sends on a raw connection until it closes it."""
    return await asyncio.wait_for(reader.read(), TIMEOUT)


@contextlib.asynccontextmanager
async def raw_connections(
    port: int, heads: list[bytes]
) -> AsyncIterator[list[asyncio.StreamReader]]:
    """One raw TCP connection to ``port`` per head, each having sent its head and no more."""
    writers = []
    readers = []
    try:
        for head in heads:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writers.append(writer)
            readers.append(reader)
            if head:
                writer.write(head)
                await writer.drain()
        yield readers
    finally:
        for writer in writers:
            writer.close()


def port_of(url: str) -> int:
    """The port of ``http://HOST:PORT/...``."""
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


async def test_a_connection_without_a_request_head_in_time_is_closed(tmp_path: Path) -> None:
    """--header-timeout: on the listener and on the control API, a connection that sends half a
    request line (a slowloris), or nothing, is closed once the timeout has passed, and counted;
    one that sent a whole request is answered and then, idle, closed too. A request whose head
    came in time (an SSE stream) is never cut."""
    async with limited(tmp_path, "--header-timeout", "1") as (proxy, http, control):
        connection = await http.initialize()
        async with http.stream(connection) as stream:
            for port in (port_of(http.url), port_of(control.base_url)):
                heads = [
                    b"GET /acp HTT",
                    b"",
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                ]
                async with raw_connections(port, heads) as (slow, silent, served):
                    assert await eof_within_timeout(slow) == b""
                    assert await eof_within_timeout(silent) == b""
                    answered = await eof_within_timeout(served)
                    assert answered.startswith(b"HTTP/1.1 "), answered[:100]
            await roundtrip(http, stream, connection, "the stream lives on")
        assert await counted(control, "header_time", "listener") >= 2
        assert await counted(control, "header_time", "admin") >= 2
        assert (
            len(
                log_events(
                    proxy.stderr, "connection closed: no request head within --header-timeout"
                )
            )
            == 2
        )


# -- /api/events subscribers -------------------------------------------------------------------


class NoLinks:
    """The runtime of a control API with nothing to act on."""

    def links(self) -> list[Link]:
        return []

    def restart(self, downtime: float) -> None:
        pass


@contextlib.asynccontextmanager
async def control_api(feed: EventFeed, metrics: Metrics) -> AsyncIterator[AdminServer]:
    """A control API on this test's loop, on ``127.0.0.1:0``."""
    engine = FaultEngine([], random.Random(1))
    admin = AdminServer(NoLinks(), engine, metrics, feed, initial_rules=[])
    await admin.start("127.0.0.1", 0)
    try:
        yield admin
    finally:
        await admin.stop()


RECORD = Connected(Side.CLIENT, "http")
"""An observation the feed turns into a trace record."""


def test_an_event_subscriber_that_does_not_read_is_dropped_at_its_backlog() -> None:
    """A subscriber whose backlog is full when the next record comes is dropped (its backlog let
    go, counted); one that takes its records is not, however many; past max_subscribers none is
    taken."""
    metrics = Metrics()
    feed = EventFeed(max_subscribers=2, backlog=8, observer=metrics)
    reader, idler = feed.subscribe(), feed.subscribe()
    assert reader is not None
    assert idler is not None
    assert feed.subscribe() is None
    for number in range(100):
        feed.observe(RECORD)
        assert reader.events.get_nowait().startswith(b"data: {")
        assert idler.dropped.is_set() == (number >= 8)
        assert idler.events.qsize() == (0 if number >= 8 else number + 1)
    assert not reader.dropped.is_set()
    dropped = metrics.registry.get_sample_value(
        LIMITED, {"limit": "event_backlog", "where": "admin"}
    )
    assert dropped == 1
    assert feed.subscribe() is not None  # the dropped one's place is free


async def test_api_events_refuses_a_subscriber_too_many_and_ends_a_dropped_stream() -> None:
    """Over HTTP: past --max-event-subscribers a GET /api/events gets 503 with Retry-After; a
    subscriber dropped for its backlog gets a last comment saying why, then the end."""
    metrics = Metrics()
    feed = EventFeed(max_subscribers=1, observer=metrics)
    async with control_api(feed, metrics) as admin, aiohttp.ClientSession() as http:
        async with http.get(admin.url + "/api/events") as subscribed:
            assert subscribed.status == 200
            async with http.get(admin.url + "/api/events") as refused:
                assert refused.status == 503
                assert refused.headers["Retry-After"] == "5"
                assert "--max-event-subscribers" in (await refused.json())["error"]
            for _ in range(EVENT_BACKLOG + 1):  # all at once: the stream takes none meanwhile
                feed.observe(RECORD)
            rest = await asyncio.wait_for(subscribed.content.read(), TIMEOUT)
        assert rest.startswith(b": dropped: 1024 records waited"), rest[:200]
        assert b"data:" not in rest
        assert (
            metrics.registry.get_sample_value(
                LIMITED, {"limit": "event_subscribers", "where": "admin"}
            )
            == 1
        )


# -- descriptors ---------------------------------------------------------------------------------


OPEN_FILES = 64
"""RLIMIT_NOFILE of the proxy in the descriptor test."""


def few_descriptors() -> None:
    """In the child before the proxy runs: a low limit on open files."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


async def test_out_of_descriptors_is_one_line_and_the_proxy_recovers(tmp_path: Path) -> None:
    """With few descriptors, more connections than it can hold: the proxy says so once (not a
    traceback per failed accept), the connections it has go on being served on both ports, and
    once the extra connections close a new Client is served."""
    agent = raw_agent(tmp_path / "capture")
    proxy = await ProxyProcess.start(
        agent,
        *("--log-format", "json", "--listen", HTTP_LISTEN, "--admin", "127.0.0.1:0"),
        *("--header-timeout", str(TIMEOUT * 4)),  # the flood stays until the test closes it
        preexec_fn=few_descriptors,
    )
    try:
        url = (await proxy.logged("listening"))["url"]
        admin = (await proxy.logged("control API listening"))["url"]
        connector = aiohttp.TCPConnector(limit=1)  # one kept-alive connection per port
        async with (
            aiohttp.ClientSession(connector=connector) as listener_client,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as admin_client,
        ):
            http = Http(listener_client, url)
            connection = await http.initialize()
            async with admin_client.get(admin + "/healthz") as healthz:
                assert healthz.status == 200
            flood = []
            try:
                for _ in range(OPEN_FILES + 16):
                    flood.append(await asyncio.open_connection("127.0.0.1", port_of(url)))
                await proxy.logged("out of file descriptors: new connections wait")
                failed = 0.0
                while failed < 2:  # accept() failed again after asyncio's pause
                    async with admin_client.get(admin + "/metrics") as metrics:
                        assert metrics.status == 200  # a connection it has, on the admin port
                        failed = sample(await metrics.text(), "descriptors", "listener")
                probe = await http.post(request(1, "_test/probe"), connection=connection)
                assert probe.status == 202, probe  # and on the listener
            finally:
                for _reader, writer in flood:
                    writer.close()
            await proxy.logged("accepting connections again")
            async with aiohttp.ClientSession() as fresh:
                await Http(fresh, url).initialize()
        out = log_events(proxy.stderr, "out of file descriptors: new connections wait")
        assert len(out) == 1, out
        assert out[0]["open_files_limit"] == OPEN_FILES
        assert "Traceback" not in proxy.stderr
    finally:
        await proxy.stop()


def sample(exposition: str, limit: str, where: str) -> float:
    """The value of ``acp_proxy_limit_reached_total{limit,where}`` in a scrape."""
    wanted = f'{LIMITED}{{limit="{limit}",where="{where}"}} '
    for line in exposition.splitlines():
        if line.startswith(wanted):
            return float(line.removeprefix(wanted))
    raise AssertionError(f"no {wanted} in the scrape")
