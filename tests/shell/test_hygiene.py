"""Resource hygiene: nothing leaks across thousands of connections and hundreds of faults.

Each test runs cycles (a Client connects, initializes, leaves; or a fault action over the control
API) and compares what the proxy holds after a warm-up with what it holds after many more
cycles, each time once every link has ended:

* a real ``acp-proxy run --listen ...`` process, one spawned Agent per link: its open file
  descriptors (``/proc/PID/fd``), its threads, its child processes
  (``/proc/PID/task/*/children``, but for the one guard of Agents' process groups, started with
  the first Agent and running as long as the proxy) and zombies among them; every link's end is
  waited for on the proxy's ``link ended`` log line;
* a proxy on this test's event loop (:class:`~proxy.shell.server.NetworkProxy` and the control API):
  its asyncio tasks, waited for on :attr:`NetworkProxy.idle`.

Sizes are a few hundred cycles, so that the suite stays quick; ``ACP_PROXY_SOAK=1`` runs the
full sizes (2,000 connections, 500 actions) and ``pytest -m soak`` selects just these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
import websockets
from harness import TIMEOUT, ProxyProcess, raw_agent, request
from peers.stalling import ScriptedHttpAgent
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from proxy.control import ControlClient
from proxy.core.engine import FaultEngine
from proxy.shell.admin import AdminServer
from proxy.shell.metrics import Metrics
from proxy.shell.observers import Fanout, Tally
from proxy.shell.server import STDIO, Address, NetworkProxy, upstream_factory
from proxy.shell.trace import EventFeed

pytestmark = pytest.mark.soak

SOAK = os.environ.get("ACP_PROXY_SOAK", "") not in ("", "0")
CONNECTIONS = 2000 if SOAK else 300
"""Client connections per test (after the warm-up)."""
ACTIONS = 500 if SOAK else 100
"""Fault actions per test (after the warm-up)."""
IN_PROCESS = 500 if SOAK else 100
"""Cycles of the in-process tests."""
WARM_UP = 20
FD_SLACK = 2
"""Descriptors the proxy may hold at the end beyond the warm-up's (a keep-alive socket)."""
TASK_SLACK = 3
"""Tasks that may still be finishing at the end (a control API connection closing)."""
LIMIT = 1024 * 1024
INITIALIZE = {"protocolVersion": 2, "capabilities": {}}


# -- what a process holds ----------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """What a process holds at one moment."""

    fds: int
    threads: int
    children: list[int]
    zombies: list[int]


def held(pid: int) -> Held:
    """Descriptors, threads, child processes and zombie children of ``pid``, from ``/proc``."""
    tasks = os.listdir(f"/proc/{pid}/task")
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            children += [
                int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            ]
    children = [child for child in children if not _is_helper(child)]
    zombies = [child for child in children if _state(child) == "Z"]
    return Held(len(os.listdir(f"/proc/{pid}/fd")), len(tasks), sorted(children), zombies)


HELPERS = (b"orphans.py", b"multiprocessing.resource_tracker")
"""Children that live as long as the process, started once: the proxy's guard of process groups
(``transports/orphans.py``), and multiprocessing's resource tracker (started with the first
parsing worker, by an earlier test of the same run)."""


def _is_helper(pid: int) -> bool:
    """Whether ``pid`` is one of the :data:`HELPERS`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return _state(pid) != "Z" and any(helper in cmdline for helper in HELPERS)


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def assert_no_leak(before: Held, after: Held, *, agents: int = 0) -> None:
    """``after`` holds no more than ``before``; exactly ``agents`` children, none a zombie."""
    assert after.fds <= before.fds + FD_SLACK, (before, after)
    assert after.threads <= before.threads, (before, after)
    assert len(after.children) == agents, after
    assert after.zombies == [], after


async def assert_no_leak_in(pid: int, before: Held, *, agents: int = 0) -> None:
    """:func:`assert_no_leak` of process ``pid`` now, or once what is ending there has ended:
    the thread asyncio starts to wait for each child (``waitpid-N``) outlives the link whose
    Agent it reaped by a moment, and another process's threads can only be looked at, so the
    count is read again until it holds or ``TIMEOUT`` has passed (then the last one is judged)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        after = held(pid)
        try:
            assert_no_leak(before, after, agents=agents)
            return
        except AssertionError:
            if loop.time() >= deadline:
                raise
        await asyncio.sleep(0.01)  # a look at /proc again: nothing to wait on in another process


# -- Clients -----------------------------------------------------------------------------------


async def ws_cycle(url: str, number: int) -> None:
    """A WebSocket Client connects, initializes (the Agent answers) and closes."""
    async with asyncio.timeout(TIMEOUT), ws_connect(url) as connection:
        await connection.send(request(number, "initialize", INITIALIZE).decode())
        assert f'"id": {number},' in await connection.recv()


async def http_cycle(http: aiohttp.ClientSession, url: str, number: int) -> None:
    """A Streamable HTTP Client: initialize (200), opens its stream, DELETEs (the stream ends)."""
    async with asyncio.timeout(TIMEOUT):
        headers = {"Content-Type": "application/json"}
        body = request(number, "initialize", INITIALIZE)
        async with http.post(url, data=body, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
            connection = {"Acp-Connection-Id": answer.headers["Acp-Connection-Id"]}
            assert (await answer.json())["id"] == number
        stream = {"Accept": "text/event-stream", **connection}
        async with http.get(url, headers=stream) as events:
            assert events.status == 200
            async with http.delete(url, headers=connection) as deleted:
                assert deleted.status == 202
            await events.read()  # the stream ends with the connection


async def ask(connection: ClientConnection, number: int) -> None:
    """A request over ``connection`` that the Agent answers."""
    async with asyncio.timeout(TIMEOUT):
        await connection.send(request(number, "_x/ping").decode())
        assert f'"id": {number},' in await connection.recv()


async def closed(connection: ClientConnection) -> None:
    """Wait until the proxy closes ``connection``."""
    with pytest.raises(websockets.ConnectionClosed):
        async with asyncio.timeout(TIMEOUT):
            await connection.recv()


async def off(call: Callable[[], object]) -> None:
    """A blocking control API call, in a thread (the loop keeps serving meanwhile)."""
    await asyncio.wait_for(asyncio.to_thread(call), TIMEOUT)


# -- the proxy as a process --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def proxy_process(
    tmp_path: Path, listen: str = "ws", *options: str, upstream: str | None = None
) -> AsyncIterator[tuple[ProxyProcess, str, ControlClient]]:
    """``acp-proxy run --listen LISTEN://127.0.0.1:0/acp --admin OPTIONS`` in front of the raw
    Agent (or of the Agent at ``upstream``)."""
    agent = raw_agent(tmp_path / "agent-saw.jsonl") if upstream is None else []
    proxy = await ProxyProcess.start(
        agent,
        "--log-format",
        "json",
        "--listen",
        f"{listen}://127.0.0.1:0/acp",
        "--admin",
        "127.0.0.1:0",
        "--agent-grace",
        "2",
        *(["--upstream", upstream] if upstream else []),
        *options,
    )
    try:
        url = (await proxy.logged("listening"))["url"]
        control = ControlClient((await proxy.logged("control API listening"))["url"])
        yield proxy, url, control
    finally:
        await proxy.stop()


async def soak(proxy: ProxyProcess, cycle: Callable[[int], Awaitable[None]], count: int) -> None:
    """Warm-up cycles, then ``count`` more, each opening one link: the proxy holds no more at the
    end than after the warm-up, each measured once every link has ended (its Agent reaped)."""
    for number in range(WARM_UP):
        await cycle(number)
    await proxy.logged("link ended", WARM_UP)
    before = held(proxy.process.pid)
    for number in range(WARM_UP, WARM_UP + count):
        await cycle(number)
    await proxy.logged("link ended", WARM_UP + count)
    await assert_no_leak_in(proxy.process.pid, before)
    assert unlogged(proxy) == []


def unlogged(proxy: ProxyProcess) -> list[str]:
    """stderr lines that are not the proxy's JSON log: asyncio's and aiohttp's complaints about
    what was garbage-collected unclosed ("Task was destroyed but it is pending!", "Unclosed
    client session"), tracebacks."""
    return [line for line in proxy.stderr.splitlines() if not line.startswith("{")]


@pytest.mark.parametrize("listen", ["ws", "http"])
async def test_thousands_of_client_connections_leave_nothing_behind(
    tmp_path: Path, listen: str
) -> None:
    """Connect, initialize, leave, again and again: descriptors, threads, Agents all go away."""
    async with (
        proxy_process(tmp_path, listen) as (proxy, url, _control),
        aiohttp.ClientSession() as http,
    ):

        async def cycle(number: int) -> None:
            if listen == "ws":
                await ws_cycle(url, number)
            else:
                await http_cycle(http, url, number)

        await soak(proxy, cycle, CONNECTIONS)


@pytest.mark.parametrize("conductor", [False, True], ids=["default", "keep-upstream"])
async def test_http_agent_connections_ending_by_themselves_are_released(
    tmp_path: Path, conductor: bool
) -> None:
    """An HTTP Agent that ends every connection stream at once: each link ends, and the HTTP
    session toward the Agent (with its pooled sockets) is closed with it, in conductor mode
    too (where no Client is left to end the link)."""
    options = ["--keep-upstream"] if conductor else []
    async with (
        ScriptedHttpAgent(end_stream=True) as agent,
        proxy_process(tmp_path, "ws", *options, upstream=agent.url) as (proxy, url, _control),
    ):

        async def cycle(number: int) -> None:
            async with ws_connect(url) as connection:
                await connection.send(request(number, "initialize", INITIALIZE).decode())
                async with asyncio.timeout(TIMEOUT):
                    assert json.loads(await connection.recv())["id"] == number
                await closed(connection)  # the Agent's stream ended: so does the link

        await soak(proxy, cycle, CONNECTIONS // 2)
    assert agent.methods.count("initialize") == WARM_UP + CONNECTIONS // 2


async def test_hundreds_of_severs_and_restarts_leave_nothing_behind(tmp_path: Path) -> None:
    """sever (both sides) and restart_proxy over the control API, one link each time."""
    async with proxy_process(tmp_path) as (proxy, url, control):
        restarts = 0

        async def cycle(number: int) -> None:
            nonlocal restarts
            async with ws_connect(url) as connection:
                await ask(connection, number)
                if number % 2:
                    await off(lambda: control.sever(side="both"))
                    await closed(connection)
                else:
                    await off(control.restart_proxy)
                    await closed(connection)
                    restarts += 1
                    await proxy.logged("listening", restarts + 1)  # back on its port

        await soak(proxy, cycle, ACTIONS)


async def test_hundreds_of_agent_kills_with_respawn_leave_one_agent(tmp_path: Path) -> None:
    """kill_agent with respawn, again and again on one link: one Agent runs, none is left."""
    async with proxy_process(tmp_path) as (proxy, url, control), ws_connect(url) as connection:
        for number in range(WARM_UP):
            await ask(connection, number)
            await off(lambda: control.kill_agent(signal="KILL", respawn=True))
        # answered by the new Agent: the old one was reaped before it started
        await ask(connection, WARM_UP)
        before = held(proxy.process.pid)
        assert len(before.children) == 1
        for number in range(WARM_UP + 1, WARM_UP + 1 + ACTIONS):
            await off(lambda: control.kill_agent(signal="KILL", respawn=True))
            await ask(connection, number)
        await assert_no_leak_in(proxy.process.pid, before, agents=1)
        assert unlogged(proxy) == []


# -- the proxy on this event loop --------------------------------------------------------------


@dataclass
class InProcess:
    """A proxy served by this test's event loop."""

    proxy: NetworkProxy
    url: str
    control: ControlClient
    listening: asyncio.Event
    """Set whenever the listener (re)starts."""

    async def idle(self) -> None:
        """Wait until every link has ended."""
        await asyncio.wait_for(self.proxy.idle.wait(), TIMEOUT)

    async def restart(self) -> None:
        """``restart_proxy`` over the control API; return once the listener is back."""
        self.listening.clear()
        await off(self.control.restart_proxy)
        await asyncio.wait_for(self.listening.wait(), TIMEOUT)


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path, listen: str = "ws") -> AsyncIterator[InProcess]:
    """A listener on 127.0.0.1 with its control API, in front of the raw Agent."""
    loop = asyncio.get_running_loop()
    engine = FaultEngine([], random.Random(1))
    agent = tuple(raw_agent(tmp_path / "agent-saw.jsonl"))
    proxy = NetworkProxy(
        Address("http" if listen == "http" else "ws", "127.0.0.1", 0, "/acp"),
        upstream_factory(STDIO, agent, limit=LIMIT, grace=2.0),
        engine,
        Fanout([Tally()]),
        strict=False,
        limit=LIMIT,
        origin=loop.time(),
    )
    stop, listening = asyncio.Event(), asyncio.Event()
    serving = loop.create_task(proxy.serve(stop, lambda _url: listening.set()))
    await asyncio.wait_for(listening.wait(), TIMEOUT)
    admin = AdminServer(proxy, engine, Metrics(), EventFeed(), initial_rules=[])
    await admin.start("127.0.0.1", 0)
    try:
        control = ControlClient(f"http://127.0.0.1:{admin.port}")
        yield InProcess(proxy, proxy.listener.url, control, listening)
    finally:
        await admin.stop()
        stop.set()
        await asyncio.wait_for(serving, TIMEOUT)


async def settled_threads(known: frozenset[threading.Thread] = frozenset()) -> int:
    """This process's threads once the waiter threads of ended Agents are gone, less the default
    executor's workers: asyncio starts one ``waitpid-N`` thread per child process, which ends with
    the child, and the ``asyncio_N`` pool (``to_thread``, ``getaddrinfo``) grows with the calls
    that overlap, up to a fixed bound. Neither is the proxy's; a thread it leaked is counted.
    A thread not in ``known`` (those counted before) is given until :data:`TIMEOUT` to end, as
    one still finishing its work on a loaded machine would: one that never ends is counted."""
    waiters = [t for t in threading.enumerate() if t.name.startswith("waitpid-")]
    for waiter in waiters:
        await asyncio.wait_for(asyncio.to_thread(waiter.join), TIMEOUT)
    others = [t for t in threading.enumerate() if not t.name.startswith("asyncio_")]
    for thread in others:
        if known and thread not in known and thread is not threading.current_thread():
            await asyncio.to_thread(thread.join, TIMEOUT)
    return sum(not t.name.startswith("asyncio_") for t in threading.enumerate())


def tasks() -> int:
    """The asyncio tasks of this loop, but the test's own."""
    return len(asyncio.all_tasks() - {asyncio.current_task()})


async def test_in_process_connections_and_faults_leave_no_task_behind(tmp_path: Path) -> None:
    """WebSocket and HTTP Clients, sever, restart and respawned Agents, all on this loop: the
    number of tasks and descriptors once the proxy is idle is what it was after the warm-up."""
    async with in_process(tmp_path, "http") as served, aiohttp.ClientSession() as http:
        url, control = served.url, served.control
        ws_url = url.replace("http://", "ws://", 1)

        async def cycle(number: int) -> None:
            await ws_cycle(ws_url, number)
            await http_cycle(http, url, number)
            async with ws_connect(ws_url) as connection:
                await ask(connection, number)
                await off(lambda: control.kill_agent(signal="KILL", respawn=True))
                await ask(connection, number + 1)
                await off(lambda: control.sever(side="both"))
                await closed(connection)
            async with ws_connect(ws_url) as connection:
                await ask(connection, number)
                await served.restart()
                await closed(connection)

        for number in range(WARM_UP):
            await cycle(number)
        await served.idle()
        before_tasks = tasks()
        before = replace(held(os.getpid()), threads=await settled_threads())
        known = frozenset(threading.enumerate())
        for number in range(IN_PROCESS):
            await cycle(number)
        await served.idle()
        assert tasks() <= before_tasks + TASK_SLACK, (before_tasks, asyncio.all_tasks())
        after = replace(held(os.getpid()), threads=await settled_threads(known))
        assert after.threads <= before.threads, [t.name for t in threading.enumerate()]
        assert_no_leak(before, after)
