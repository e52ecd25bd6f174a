"""Floods and stalls: a proxy between a flooding peer and one that stops reading.

``setup`` starts the proxy (any downstream, any upstream) with the flooding Agent behind it
(``peers/flood_agent.py``, over stdio or as a network server: ``network_agent``), ``flood`` asks it
for ``COUNT`` messages of ``SIZE`` bytes, ``delaying_fault_file`` holds every one back by a delay,
``memory`` reads a process's resident size, ``ended`` stops a process and waits for its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from harness import PEERS, TIMEOUT, ProxyProcess, fault_file, log_events
from listener_client import compact
from wires import Wire, client_wire

FLOOD_AGENT = [sys.executable, str(PEERS / "flood_agent.py")]
SIZE = 256 * 1024
"""Bytes of one flood message."""
COUNT = 256
FLOOD = COUNT * SIZE
"""64 MiB: well above what the proxy may hold (a few MiB per connection, 8 MiB of delayed
messages) plus the kernel's pipe and socket buffers."""
BOUND = 32 * 1024 * 1024
"""How much the proxy's resident memory may grow during a flood (half of it)."""


def memory(proxy: ProxyProcess, field: str = "VmRSS") -> int:
    """The proxy's resident memory now (``VmRSS``) or at its peak (``VmHWM``), in bytes."""
    status = Path(f"/proc/{proxy.process.pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith(f"{field}:")]
    return int(line.split()[1]) * 1024


def written(agent_logs: ProxyProcess) -> int:
    """How many flood messages the Agent's writes have returned for."""
    return len(log_events(agent_logs.stderr, "flood written"))


@dataclass
class Setup:
    """A proxy, the Client's connection, and where the Agent's log lines and pid are."""

    proxy: ProxyProcess
    wire: Wire
    agent_logs: ProxyProcess
    """The Agent's stderr: the proxy's own for a spawned Agent."""
    agent_pid: int


@contextlib.asynccontextmanager
async def ended(process: ProxyProcess) -> AsyncIterator[ProxyProcess]:
    """``process`` (the proxy, or a network Agent), ended on exit as a user would end it.

    SIGTERM (the proxy passes it on to the Agent it spawned), then a wait until the process and
    every process sharing its stderr are gone, so that no pipe outlives the test; a kill if
    that fails.
    """
    try:
        yield process
    finally:
        try:
            if process.process.returncode is None:
                process.process.terminate()
            if process.process.stdout is not None:  # unread output would hold the pipe open
                await asyncio.wait_for(process.process.stdout.read(), TIMEOUT)
            await process.wait()
        finally:
            await process.stop()


@contextlib.asynccontextmanager
async def network_agent(scheme: str) -> AsyncIterator[tuple[ProxyProcess, str]]:
    """The flood Agent serving ``scheme`` (ws or http) on a free port; it and its URL."""
    process = await asyncio.create_subprocess_exec(
        *FLOOD_AGENT,
        "--listen",
        f"{scheme}://127.0.0.1:0/acp",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    async with ended(ProxyProcess(process)) as agent:
        yield agent, (await agent.logged("listening"))["url"]


@contextlib.asynccontextmanager
async def setup(downstream: str, upstream: str, *options: str) -> AsyncIterator[Setup]:
    """The proxy between a Client on ``downstream`` and the flood Agent on ``upstream``."""
    async with contextlib.AsyncExitStack() as stack:
        agent: list[str] = FLOOD_AGENT
        remote: ProxyProcess | None = None
        if upstream != "stdio":
            remote, url = await stack.enter_async_context(network_agent(upstream))
            agent, options = [], ("--upstream", url, *options)
        listen = [] if downstream == "stdio" else ["--listen", f"{downstream}://127.0.0.1:0/acp"]
        proxy = await stack.enter_async_context(
            ended(
                await ProxyProcess.start(
                    agent, "--log-format", "json", *listen, *options, limit=1 << 16
                )
            )
        )
        url = "" if downstream == "stdio" else (await proxy.logged("listening"))["url"]
        wire = await stack.enter_async_context(
            client_wire(downstream, proxy, url, small_buffers=True)
        )
        agent_logs = remote or proxy
        started = remote.process.pid if remote else (await proxy.logged("agent started"))["pid"]
        yield Setup(proxy, wire, agent_logs, started)


def flood(**params: object) -> bytes:
    """The Client's ``_flood/send``: the Agent writes the items ``params`` describe."""
    return compact({"jsonrpc": "2.0", "method": "_flood/send", "params": params})


def delaying_fault_file(directory: Path, delay_ms: int) -> str:
    """A fault file (:func:`harness.fault_file`) delaying every flood item by ``delay_ms``; its
    path."""
    rule = {
        "name": "hold-items",
        "when": {"method": "_flood/item"},
        "do": {"action": "delay", "ms": delay_ms},
    }
    return str(fault_file(directory, rule))
