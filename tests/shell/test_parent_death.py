"""Agents die with the proxy, even when it is killed with SIGKILL, and so does what they started.

A real proxy process runs the stubborn Agent (``tests/support/peers/stubborn_agent.py``: it ignores
SIGTERM, SIGINT and the end of its stdin, and so does the child it starts in its process group).
The proxy is killed with SIGKILL, so that it can stop nothing itself; the test then waits
(bounded by ``TIMEOUT``, looking in ``/proc``) until the Agent and its child are gone: the Agent
by its parent-death signal, its child by the guard of process groups. Without the guard (killed
first), the Agent still dies, and its child is left: the limit docs/transports.md documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import PEERS, TIMEOUT, ProxyProcess, raw_agent
from websockets.asyncio.client import connect as ws_connect

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals: Linux")

STUBBORN_AGENT = PEERS / "stubborn_agent.py"
POLL = 0.05


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def gone(*pids: int) -> None:
    """Wait until none of ``pids`` runs (TIMEOUT at most). No event tells of the end of a
    process that is not a child of the test: ``/proc`` is looked at again every POLL seconds."""
    async with asyncio.timeout(TIMEOUT):
        for _ in itertools.count():
            if not any(running(pid) for pid in pids):
                return
            await asyncio.sleep(POLL)


def children_of(parent: int) -> dict[int, bytes]:
    """The processes whose parent is ``parent``, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes()
    return found


def the_guard(proxy: ProxyProcess) -> int:
    """The pid of the proxy's guard of process groups (a child of the proxy)."""
    found = children_of(proxy.process.pid)
    [guard] = [pid for pid, argv in found.items() if b"orphans.py" in argv]
    return guard


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Processes to kill at the end, should the test fail (or leave them on purpose)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stubborn_agent() -> list[str]:
    return [sys.executable, str(STUBBORN_AGENT), f"marker-{uuid.uuid4().hex}"]


async def test_a_killed_stdio_proxy_takes_its_agent_and_its_agents_child_along(
    proxies: list[ProxyProcess], leftovers: list[int]
) -> None:
    proxy = await ProxyProcess.start(stubborn_agent(), "--log-format", "json")
    proxies.append(proxy)
    ready = (await proxy.recv_json())["params"]
    leftovers.extend([ready["agent"], ready["child"]])
    assert running(ready["agent"])
    assert running(ready["child"])
    guard = the_guard(proxy)
    proxy.process.kill()
    await gone(ready["agent"], ready["child"], guard)  # the guard's work done, it exits too
    assert await proxy.wait() == -signal.SIGKILL  # nothing holds its stderr open any more


async def test_a_killed_network_proxy_takes_every_agent_along(
    proxies: list[ProxyProcess], leftovers: list[int]
) -> None:
    proxy = await ProxyProcess.start(
        [], "--log-format", "json", "--listen", "ws://127.0.0.1:0/acp", "--", *stubborn_agent()
    )
    proxies.append(proxy)
    url = (await proxy.logged("listening"))["url"]
    pids = []
    async with ws_connect(url) as first, ws_connect(url) as second:
        for connection in (first, second):
            async with asyncio.timeout(TIMEOUT):
                ready = json.loads(await connection.recv())["params"]
            pids += [ready["agent"], ready["child"]]
        leftovers.extend(pids)
        proxy.process.kill()
        await gone(*pids)
    assert await proxy.wait() == -signal.SIGKILL


async def test_without_the_guard_the_agent_dies_and_its_child_is_left(
    proxies: list[ProxyProcess], leftovers: list[int]
) -> None:
    """The parent-death signal alone: it reaches the Agent, never what the Agent started."""
    proxy = await ProxyProcess.start(stubborn_agent(), "--log-format", "json")
    proxies.append(proxy)
    ready = (await proxy.recv_json())["params"]
    leftovers.extend([ready["agent"], ready["child"]])
    guard = the_guard(proxy)
    os.kill(guard, signal.SIGKILL)
    await gone(guard)
    proxy.process.kill()
    await gone(ready["agent"])
    assert running(ready["child"])  # nothing is left that could stop it
    os.kill(ready["child"], signal.SIGKILL)
    assert await proxy.wait() == -signal.SIGKILL  # the child held the proxy's stderr


EMBEDDED = textwrap.dedent(
    """
    import json, sys, threading
    from proxy.shell.app import RunOptions
    from proxy.embedded import BackgroundProxy, loopback

    proxy = BackgroundProxy(RunOptions(agent_argv=tuple(sys.argv[1:]), listen=loopback()))
    proxy.start()
    print(json.dumps({"url": proxy.url}), flush=True)
    threading.Event().wait()
    """
)


async def test_a_killed_process_embedding_the_proxy_takes_its_agents_along(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """The embedded proxy spawns Agents from its own thread: the signal is tied to it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EMBEDDED,
        *stubborn_agent(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        url = json.loads(await asyncio.wait_for(process.stdout.readline(), TIMEOUT))["url"]
        async with ws_connect(url) as connection:
            async with asyncio.timeout(TIMEOUT):
                ready = json.loads(await connection.recv())["params"]
            leftovers.extend([ready["agent"], ready["child"]])
            process.kill()
            await gone(ready["agent"], ready["child"])
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_killed_proxy_takes_its_parsing_workers_along(
    proxies: list[ProxyProcess], leftovers: list[int], tmp_path: Path
) -> None:
    """The workers parsing large messages (started by the first one) die with the proxy."""
    proxy = await ProxyProcess.start(
        raw_agent(tmp_path / "agent-saw.jsonl"), "--log-format", "json"
    )
    proxies.append(proxy)
    large = b'{"jsonrpc":"2.0","id":1,"method":"_x/large","params":"' + b"x" * 300_000 + b'"}'
    await proxy.send(large)
    assert (await proxy.recv_json())["result"]["size"] == len(large)
    workers = [pid for pid, argv in children_of(proxy.process.pid).items() if b"spawn_main" in argv]
    assert workers
    leftovers.extend(workers)
    proxy.process.kill()
    await gone(*workers)
    assert await proxy.wait() == -signal.SIGKILL
