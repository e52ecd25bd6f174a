"""One run of the Client under test: started in a process group of its own, in front of the
Agent the checker controls, bounded in time, always reaped (its whole group, even when the check
is interrupted), and its trace read back (:mod:`proxy.tools.check_client.observed`).

The Client is spawned as the proxy spawns an Agent (:func:`~proxy.shell.transports.stdio.in_child`:
SIGINT and SIGTERM at their defaults, killed with the checker's thread on Linux) and its group is
watched by the proxy's orphan guard, which stops it if the checker itself is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.core.records import decode
from proxy.shell.transports.stdio import OrphanGuard, in_child
from proxy.tools.check_client.agent import CheckedAgent
from proxy.tools.check_client.observed import ClientLinks, Observed, observe
from proxy.tools.check_client.options import ClientCheckOptions
from proxy.tools.lab.trace_follow import POLL
from proxy.tools.verdicts import Error

__all__ = ["Run", "run_once"]

STOP_GRACE = 2.0
"""Seconds a Client past its time has between SIGTERM and SIGKILL (its process group)."""
TRACE_SETTLE = 5.0
"""Seconds the proxies a Client spawned have, once it exited, to close their links in the trace
(they see their stdin end when the Client does)."""
SAID_BYTES = 400
"""How much of the end of the Client's output is kept (a verdict quotes its last line)."""
READ_CHUNK = 1 << 16
"""Bytes read at most at a time, of the Client's output or of the trace."""


@dataclass
class Run:
    """What one run of the Client did, as the proxy saw it."""

    setup: str
    exit_status: int | None
    """The Client's exit status; None when it was stopped (``--client-timeout``)."""
    seconds: float
    observed: Observed
    said: str
    """The end of what the Client wrote on stdout and stderr (for a verdict's reason)."""
    versions: set[int] = field(default_factory=set)
    """The protocol versions the Agent agreed with the Client (1: a v1 Client, without keys)."""

    def how_it_ended(self, timeout: float) -> str:
        """``the Client exited with status 1``, or was stopped after ``timeout`` seconds."""
        if self.exit_status is None:
            return f"the Client was stopped after {timeout:g} s (--client-timeout)"
        return f"the Client exited with status {self.exit_status}"


async def run_once(
    options: ClientCheckOptions,
    setup: str,
    rules: list[dict[str, Any]],
    directory: Path,
    agent_args: Sequence[str] = (),
) -> Run:
    """Run the Client once with ``rules`` in the proxy in front of the reference Agent (with
    ``agent_args``), in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a local folder, once
    agent = CheckedAgent(directory, rules, options.listen, agent_args)
    started = time.monotonic()
    try:
        await agent.start()
        argv = agent.client_argv(options.client_argv)
        # Spawned in a task of its own, awaited on every path: Ctrl-C while asyncio spawns the
        # Client would otherwise have asyncio kill it and wait for its pipe to close, which a
        # child of the Client holds open (the check then hung until that child ended).
        spawning = asyncio.ensure_future(  # noqa: TID251 - awaited below, Ctrl-C included
            asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, process_group=0,
                preexec_fn=functools.partial(in_child, os.getpid()),
            )
        )  # fmt: skip
        try:
            process = await asyncio.shield(spawning)
        except OSError as exc:
            raise Error(f"cannot run the Client: {exc}") from None
        except asyncio.CancelledError:  # its whole group stopped, then the interruption goes on
            with contextlib.suppress(Exception):
                await _stop_group(await spawning)
            raise
        guard = OrphanGuard.shared()
        guard.watch(process.pid, STOP_GRACE)  # stopped even if the checker is killed
        assert process.stdout is not None
        tail = _Tail(process.stdout)
        try:
            status = await _bounded(process, options.client_timeout)
            if status is None:
                await _stop_group(process)
            if options.listen is None:
                await _settled(agent.trace)
        finally:
            await _stop_group(process)
            guard.forget(process.pid)
            said = await tail.end()
        seconds = time.monotonic() - started
    finally:
        await agent.stop()
    seen = observe(agent.trace)
    return Run(setup, status, round(seconds, 3), seen, said, agent.client_versions())


class _Tail:
    """The end of what the Client writes (:data:`SAID_BYTES`), read as it comes: a Client that
    writes without end costs no more than that."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self._stream = stream
        self._kept = b""
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while chunk := await self._stream.read(READ_CHUNK):
            self._kept = (self._kept + chunk)[-SAID_BYTES:]

    async def end(self) -> str:
        """What was kept, once the output ended (or :data:`STOP_GRACE` after the Client's group
        was stopped: a child of it in another group may hold the pipe open)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reading), STOP_GRACE)
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        return self._kept.decode(errors="replace").strip()


async def _bounded(process: asyncio.subprocess.Process, seconds: float) -> int | None:
    """The Client's exit status, or None when it ran past ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            return await process.wait()
    except TimeoutError:
        return None


async def _stop_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the Client's process group (what is left of it), SIGKILL it after
    :data:`STOP_GRACE`; reap the Client. Run on the way out whatever happened, Ctrl-C included."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)
        if signum == signal.SIGTERM:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), STOP_GRACE)
    await process.wait()


async def _settled(trace: Path) -> None:
    """Wait (:data:`TRACE_SETTLE` at most) until every Client connection in ``trace`` was closed:
    the proxies the Client spawned have seen it go and written their last records. The file is
    read as it grows, as the proxy's Clients follow it (:data:`POLL`). No file: no proxy started,
    nothing to wait for."""
    links, offset, partial = ClientLinks(), 0, b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(TRACE_SETTLE):
            while True:
                try:
                    with trace.open("rb") as file:
                        file.seek(offset)
                        data = file.read(READ_CHUNK)
                except FileNotFoundError:
                    return  # no proxy ever started (the Client never ran the Agent)
                offset += len(data)
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    record = decode(line) if line.strip() else None
                    if record is not None:
                        links.feed(record)
                if not data:
                    if links.settled:
                        return
                    await asyncio.sleep(POLL)
