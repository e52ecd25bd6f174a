"""What one peer can make the proxy hold, end to end through a real proxy: pending requests per
link (``--max-pending``), bytes in flight across the proxy (``--max-inflight-bytes``), and the
last message of an idle link, released once relayed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import sys
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from floods import delaying_fault_file, ended, flood, network_agent
from floods import setup as stalled_peers_setup
from harness import (
    INFLIGHT_BOUND_REACHED,
    PEERS,
    TIMEOUT,
    ProxyProcess,
    captured,
    log_events,
    notification,
    raw_agent,
    request,
)
from listener_client import Http, compact
from peers.flood_agent import flood_item
from prometheus_client.parser import text_string_to_metric_families

from proxy.shell.app import Ready, RunOptions, run_network
from proxy.shell.server import parse_address
from proxy.shell.transports.http_listener import CONNECTION_ID

TOO_MANY_PENDING = "too many pending requests; refusing more with an error until some are answered"


async def test_requests_past_max_pending_are_answered_an_error_and_the_link_goes_on(
    tmp_path: Path,
) -> None:
    """An Agent that never answers prompts: the Client's fourth and fifth prompts are answered
    -32603 by the proxy and never reach the Agent (logged once, traced); notifications and
    other requests that fit still pass once an answer makes room."""
    capture = tmp_path / "agent-saw.jsonl"
    trace = tmp_path / "trace.jsonl"
    agent = raw_agent(capture, "--no-answer", "session/prompt")
    options = ["--log-format", "json", "--max-pending", "3", "--trace", str(trace)]
    options += ["--admin", "127.0.0.1:0"]
    proxy = await ProxyProcess.start(agent, *options)
    try:
        for n in range(5):
            await proxy.send_json(
                {"jsonrpc": "2.0", "id": f"p{n}", "method": "session/prompt", "params": {}}
            )
        for n in (3, 4):
            error = await proxy.recv_json()
            assert error["id"] == f"p{n}"
            assert error["error"]["code"] == -32603
            assert "--max-pending" in error["error"]["message"]
        await proxy.send_json({"jsonrpc": "2.0", "method": "session/cancel", "params": {}})
        await proxy.send_json({"jsonrpc": "2.0", "id": "x", "method": "_test/other"})
        refused = await proxy.recv_json()
        assert (refused["id"], refused["error"]["code"]) == ("x", -32603)
        found = await samples(proxy)
        counted = metric(found, "acp_proxy_limit_reached_total", limit="pending", where="link")
        assert counted == 3
        assert metric(found, "acp_proxy_pending_requests", direction="to_agent") == 3
        await proxy.close_stdin()
        assert await proxy.wait() == 0
    finally:
        await proxy.stop()
    methods = [json.loads(line).get("method") for line in captured(capture)]
    assert methods == ["session/prompt"] * 3 + ["session/cancel"]
    [logged] = log_events(proxy.stderr, TOO_MANY_PENDING)
    assert (logged["direction"], logged["limit"]) == ("to_agent", 3)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    refusals = [r for r in records if r.get("disposition") == "too_many_pending"]
    assert [r["id"] for r in refusals] == ["p3", "p4", "x"]
    assert {r["limit"] for r in refusals} == {3}


# -- the last message of an idle link -------------------------------------------------------------

LARGE = 16 * 1024 * 1024
"""Bytes of the large message each way: far above what anything else of the test allocates."""
LARGE_CLIENT = [sys.executable, str(PEERS / "large_client.py")]


async def released(baseline: int, within: float = TIMEOUT) -> None:
    """Wait until the memory traced in this process is back within half of :data:`LARGE` of
    ``baseline`` (a collection first: a cycle may hold it); after ``within`` seconds, fail
    naming the objects that still refer to a large string of bytes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - baseline
        if held < LARGE // 2:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{held} bytes still held by the idle proxy, by {holders()}")
        await asyncio.sleep(0.05)  # polling a condition, bounded by the deadline above


def holders() -> list[str]:
    """What the garbage collector knows that refers to a string of half :data:`LARGE` or more:
    the name of a coroutine (one of its local variables holds it), else the holder's type."""
    return [
        getattr(holder, "__qualname__", None) or type(holder).__qualname__
        for holder in gc.get_objects()
        if any(
            isinstance(referent, bytes | bytearray | str) and len(referent) >= LARGE // 2
            for referent in gc.get_referents(holder)
        )
    ]


@pytest.fixture
def traced() -> Iterator[None]:
    """Trace this process's allocations during the test."""
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


KEEPALIVE_FIRST = 15.0
"""Seconds within which an idle link has let go, where a keepalive 20 s later would do it too."""
IDLE_LINKS = [("ws", "stdio"), ("http", "stdio"), ("ws", "ws"), ("http", "http")]
"""(Client's transport, Agent's transport): each transport's reader and writer on both sides."""


@pytest.mark.usefixtures("traced")
@pytest.mark.parametrize(("downstream", "upstream"), IDLE_LINKS)
async def test_an_idle_link_keeps_no_message_it_relayed(
    downstream: str, upstream: str, tmp_path: Path
) -> None:
    """A proxy in this process (its allocations traced) relays a 16 MiB message each way
    between a Client process and an Agent process, which then go idle with their connections
    open: the proxy's memory goes back to what it was, the messages are referenced no more."""
    async with contextlib.AsyncExitStack() as stack:
        if upstream == "stdio":
            agent, options = "raw", RunOptions(agent_argv=tuple(raw_agent(tmp_path / "saw")))
        else:
            _, agent_url = await stack.enter_async_context(network_agent(upstream))
            upstream_at = parse_address(agent_url, option="--upstream")
            agent, options = "flood", RunOptions(agent_argv=(), upstream=upstream_at)
        listen = parse_address(f"{downstream}://127.0.0.1:0/acp", option="--listen")
        options = dataclasses.replace(options, listen=listen)
        stop = asyncio.Event()
        ready: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
        proxy = asyncio.create_task(  # noqa: TID251 - the exit stack stops and awaits it
            run_network(options, stop=stop, on_ready=ready.set_result)
        )
        stack.push_async_callback(stopped, stop, proxy)
        url = (await asyncio.wait_for(ready, TIMEOUT)).listen_url
        baseline = tracemalloc.get_traced_memory()[0]
        client = await asyncio.create_subprocess_exec(
            *LARGE_CLIENT,
            downstream,
            url,
            str(LARGE),
            agent,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        stack.push_async_callback(ended_client, client)
        assert client.stdout is not None
        assert await asyncio.wait_for(client.stdout.readline(), TIMEOUT) == b"idle\n"
        # A WebSocket Agent's keepalive (a ping every 20 s) would release a frame its library
        # kept: the memory must be back before that.
        await released(baseline, KEEPALIVE_FIRST if upstream == "ws" else TIMEOUT)


async def stopped(stop: asyncio.Event, proxy: asyncio.Task[int]) -> None:
    """Stop the proxy running in this process, and wait until it has."""
    stop.set()
    await asyncio.wait_for(proxy, TIMEOUT)


async def ended_client(client: asyncio.subprocess.Process) -> None:
    """Stop the Client process (it never ends by itself)."""
    if client.returncode is None:
        client.kill()
    await asyncio.wait_for(client.wait(), TIMEOUT)


# -- bytes in flight across the proxy -------------------------------------------------------------

ITEM = 1_000_000
"""Bytes of one POSTed message (aiohttp's client wants no larger ``bytes`` body)."""
POSTS = 12
BOUND = 4 * ITEM
"""``--max-inflight-bytes``: room for four of the twelve."""
FLOOD_AGENT = [sys.executable, str(PEERS / "flood_agent.py")]


async def samples(proxy: ProxyProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the proxy's ``/metrics``, by name and labels."""
    base = (await proxy.logged("control API listening"))["url"]
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as response:
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_concurrent_large_posts_never_take_the_proxy_past_its_bound() -> None:
    """Twelve 1 MB POSTs at once toward an Agent that reads nothing, under a bound of four:
    four are admitted (the first taken by the relay, answered 202, the other three waiting for
    it to reach the Agent), eight are answered 503 with ``Retry-After`` at once, before their
    bodies are read; the count never passes the bound. Once the Agent reads, the three are
    relayed, the eight POSTed again go through, and the Agent has all twelve."""
    options = ["--listen", "http://127.0.0.1:0/acp", "--admin", "127.0.0.1:0"]
    options += ["--log-format", "json", "--max-inflight-bytes", str(BOUND)]
    async with ended(await ProxyProcess.start(FLOOD_AGENT, *options)) as proxy:
        url = (await proxy.logged("listening"))["url"]
        async with aiohttp.ClientSession() as session:
            http = Http(session, url)
            connection = await http.initialize()
            async with http.stream(connection) as stream:
                stall = await http.post(notification("_flood/stall"), connection=connection)
                assert stall.status == 202
                await proxy.logged("agent stopped reading")
                agent = (await proxy.logged("agent started"))["pid"]
                items = [flood_item(n, ITEM) for n in range(POSTS)]
                posts = [
                    asyncio.create_task(  # noqa: TID251 - the test awaits each
                        http.post(item, connection=connection)
                    )
                    for item in items
                ]
                answered = []  # the first is taken by the relay (202), then waits on the Agent
                async with asyncio.timeout(TIMEOUT):
                    for done in asyncio.as_completed(posts):
                        answered.append(await done)
                        if len(answered) == POSTS - 3:
                            break
                assert sorted(reply.status for reply in answered) == [202] + [503] * (POSTS - 4)
                for reply in answered:
                    if reply.status == 503:
                        assert reply.headers["Retry-After"] == "1"
                        error = json.loads(reply.body)["error"]
                        assert "--max-inflight-bytes" in error["message"]
                waiting = [post for post in posts if not post.done()]
                assert len(waiting) == 3, "a POST was answered while the Agent reads nothing"
                found = await samples(proxy)
                assert metric(found, "acp_proxy_inflight_bytes_peak") <= BOUND
                assert metric(found, "acp_proxy_inflight_bytes") > 3 * ITEM
                refusals = metric(
                    found,
                    "acp_proxy_limit_reached_total",
                    limit="inflight_bytes",
                    where="listener",
                )
                assert refusals == POSTS - 4
                os.kill(agent, signal.SIGUSR1)
                async with asyncio.timeout(TIMEOUT):
                    assert [(await post).status for post in waiting] == [202] * 3
                for post in posts:
                    if (await post).status == 503:
                        reply = await http.post(items[posts.index(post)], connection=connection)
                        assert reply.status == 202, reply
                count = await http.post(request("count", "_flood/count"), connection=connection)
                assert count.status == 202
                assert (await stream.next_json())["result"]["received"] == POSTS
        found = await samples(proxy)
        assert 0 < metric(found, "acp_proxy_inflight_bytes_peak") <= BOUND
        assert metric(found, "acp_proxy_inflight_bytes_bound") == BOUND


async def test_a_bound_smaller_than_one_message_never_deadlocks_a_link() -> None:
    """The Agent floods the Client (each of its writes blocks until the proxy reads it, and it
    reads nothing meanwhile) while the Client writes to the Agent, under a bound smaller than one
    message: the proxy must go on reading the Agent, whose stdin holds the bytes in flight, or
    neither would ever move. Everything arrives, both ways, intact and in order."""
    size, count = 256 * 1024, 32
    bound = ("--max-inflight-bytes", str(64 * 1024))
    async with stalled_peers_setup("stdio", "stdio", *bound) as s:

        async def write_items() -> None:
            for n in range(count):
                await s.wire.send(flood_item(n, size))

        async with asyncio.TaskGroup() as tasks:
            await s.wire.send(
                compact(
                    {
                        "jsonrpc": "2.0",
                        "method": "_flood/send",
                        "params": {"count": count, "size": size},
                    }
                )
            )
            tasks.create_task(write_items())
            for n in range(count):
                assert await s.wire.receive() == flood_item(n, size)
        await s.wire.send(compact({"jsonrpc": "2.0", "id": "count", "method": "_flood/count"}))
        answer = json.loads(await s.wire.receive())
        assert answer["result"] == {"received": count, "intact": True}


async def test_a_chunked_post_is_admitted_as_its_chunks_come() -> None:
    """A POST without ``Content-Length`` is counted chunk by chunk: toward an Agent that reads
    nothing, behind a message that fills most of the bound, one that grows past the room left is
    answered 503; a small one fits and is relayed once the Agent reads."""
    options = ["--listen", "http://127.0.0.1:0/acp", "--log-format", "json"]
    options += ["--max-inflight-bytes", str(ITEM)]
    async with ended(await ProxyProcess.start(FLOOD_AGENT, *options)) as proxy:
        url = (await proxy.logged("listening"))["url"]
        async with aiohttp.ClientSession() as session:
            http = Http(session, url)
            connection = await http.initialize()
            async with http.stream(connection) as stream:
                await http.post(notification("_flood/stall"), connection=connection)
                await proxy.logged("agent stopped reading")
                filler = await http.post(flood_item(0, ITEM * 3 // 4), connection=connection)
                assert filler.status == 202  # taken by the relay, held toward the Agent

                async def chunked(data: bytes) -> tuple[int, bytes]:
                    async def chunks() -> AsyncIterator[bytes]:
                        for start in range(0, len(data), 16 * 1024):
                            yield data[start : start + 16 * 1024]

                    headers = {"Content-Type": "application/json", CONNECTION_ID: connection}
                    async with (
                        asyncio.timeout(TIMEOUT),
                        session.post(url, data=chunks(), headers=headers) as response,
                    ):
                        assert response.headers.get("Transfer-Encoding") != "identity"
                        return response.status, await response.read()

                status, body = await chunked(flood_item(1, ITEM // 2))
                assert status == 503, body
                assert "--max-inflight-bytes" in json.loads(body)["error"]["message"]
                small = asyncio.create_task(  # noqa: TID251 - the test awaits it
                    chunked(flood_item(1, 1000))
                )
                agent = (await proxy.logged("agent started"))["pid"]
                os.kill(agent, signal.SIGUSR1)
                assert (await small)[0] == 202
                count = await http.post(request("count", "_flood/count"), connection=connection)
                assert count.status == 202
                assert (await stream.next_json())["result"] == {"received": 2, "intact": True}


async def test_messages_held_by_timers_make_readers_wait_at_the_bound(tmp_path: Path) -> None:
    """Every item from the Agent is delayed: what the timers hold counts, so past the bound
    (well under the timers' own 8 MiB) the proxy reads the Agent no more until timers release
    some; the bound is logged and the waits counted, and every item arrives, in order."""
    size, count, bound = 256 * 1024, 16, 1024 * 1024
    options = ["--faults", delaying_fault_file(tmp_path, 300), "--admin", "127.0.0.1:0"]
    options += ["--max-inflight-bytes", str(bound)]
    async with stalled_peers_setup("stdio", "stdio", *options) as s:
        await s.wire.send(flood(count=count, size=size))
        for n in range(count):
            assert await s.wire.receive() == flood_item(n, size)
        logged = await s.proxy.logged(INFLIGHT_BOUND_REACHED)
        assert logged["bound"] == bound
        found = await samples(s.proxy)
        assert metric(found, "acp_proxy_inflight_waits_total") >= 1
        assert metric(found, "acp_proxy_inflight_bytes_peak") < bound + 2 * size
