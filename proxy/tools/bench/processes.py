"""The process trees the bench starts, and what the system says of them.

* :class:`StdioPeer`: a process tree driven as a Client over its stdin and stdout, one message a
  line (a target, or the proxy of a check); its stderr is kept for the error that explains a
  failure.
* :class:`Server`: a process serving on loopback (the WebSocket Agent, a listening proxy); where it
  listens is read from its first lines, the rest of its output kept (the last lines) until it ends.
* The memory and descriptors of a process: ``/proc/PID/status`` and ``/proc/PID/fd``, or
  ``ru_maxrss`` of the children where there is no ``/proc``.

Standard library only at import (the bench Agents import this package): the proxy's own helpers
are imported where they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.tools.bench.messages import READ_LIMIT

__all__ = [
    "ANSWER_TIMEOUT",
    "START_TIMEOUT",
    "BenchError",
    "Server",
    "StdioPeer",
    "children_maxrss_kib",
    "listening_url",
    "open_fds",
    "proc_kib",
    "request_line",
    "request_text",
    "rss_source",
]

ANSWER_TIMEOUT = 60.0
"""Seconds any single answer may take before the bench gives up on a target."""
START_TIMEOUT = 30.0
"""Seconds a spawned server may take to say where it listens."""


class BenchError(Exception):
    """A target could not be driven (it died, or did not answer)."""


def rss_source() -> str:
    """Where the peak resident memory figures come from on this machine."""
    return "VmHWM" if Path("/proc/self/status").exists() else "ru_maxrss(RUSAGE_CHILDREN)"


def proc_kib(pid: int, key: str) -> int | None:
    """A figure in KiB of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``); ``None`` without one."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def children_maxrss_kib() -> int:
    """The largest resident set of any waited-for child so far (the fallback without /proc)."""
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return maxrss // 1024 if sys.platform == "darwin" else maxrss


def open_fds(pid: int) -> int | None:
    """How many descriptors ``pid`` holds open (``None`` without ``/proc``)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def request_text(request_id: int, method: str, params: dict[str, Any]) -> str:
    """A request as a bench Client sends it (a WebSocket text message)."""
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(message)


def request_line(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    """A request as the line a bench Client writes."""
    return request_text(request_id, method, params).encode() + b"\n"


class StdioPeer:
    """One spawned process tree, driven as a Client over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Any) -> None:
        self.process = process
        self._stderr = stderr
        assert process.stdin is not None
        assert process.stdout is not None
        self.writer = process.stdin
        self.reader = process.stdout
        self._next_id = 0

    @classmethod
    async def spawn(cls, argv: Sequence[str]) -> StdioPeer:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=READ_LIMIT,
        )
        return cls(process, stderr)

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        """A request with the next id, as the line to write; its id."""
        self._next_id += 1
        return self._next_id, request_line(self._next_id, method, params)

    async def read_line(self) -> bytes:
        try:
            line = await asyncio.wait_for(self.reader.readline(), ANSWER_TIMEOUT)
        except TimeoutError:
            raise BenchError(f"no answer in {ANSWER_TIMEOUT} s{self.stderr_tail()}") from None
        if not line:
            raise BenchError(f"the target closed its stdout{self.stderr_tail()}")
        return line

    async def answer(self, request_id: int) -> dict[str, Any]:
        """Read until the answer to ``request_id``; anything else on the way is an error."""
        line = await self.read_line()
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise BenchError(f"expected the answer to {request_id}, got {line[:200]!r}")
        if "result" not in message:
            raise BenchError(f"request {request_id} failed: {line[:200]!r}")
        return message

    async def call(self, method: str, params: dict[str, Any]) -> float:
        """One round trip; its duration in seconds."""
        request_id, data = self.request(method, params)
        start = time.perf_counter()
        self.writer.write(data)
        await self.writer.drain()
        await self.answer(request_id)
        return time.perf_counter() - start

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        return f"; its stderr ends: {tail}" if tail else ""

    async def close(self) -> None:
        from proxy.shell.transports.stdio import send_signal  # noqa: PLC0415 - see the module

        with contextlib.suppress(ConnectionError):
            self.writer.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            send_signal(self.process, signal.SIGKILL)
            await self.process.wait()
        finally:
            self._stderr.close()


MITMPROXY_LISTENING = re.compile(r"listening at \S*:(\d+)\.?$")
"""mitmproxy's line once it listens (``Reverse proxy to http://... listening at HOST:PORT.``)."""


def listening_url(line: bytes) -> str | None:
    """The URL a spawned server announces: the bench's WebSocket processes' line, the proxy's log
    record, or mitmproxy's line (on loopback: the bench has it listen there)."""
    text = line.decode(errors="replace").strip()
    if text.startswith("ws://"):
        return text
    if mitmproxy := MITMPROXY_LISTENING.search(text):
        return f"ws://127.0.0.1:{mitmproxy[1]}/acp"
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if isinstance(record, dict) and record.get("event") == "listening":
        return str(record["url"])
    return None


class Server:
    """A spawned process serving on loopback: where, and the last lines of its output."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.url = ""
        self.tail: deque[str] = deque(maxlen=20)
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, argv: Sequence[str]) -> Server:
        """Spawn, wait for its URL; its output (stdout and stderr) is then read until it ends."""
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            limit=READ_LIMIT,
        )
        assert process.stdout is not None
        server = cls(process)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while not server.url:
                    line = await process.stdout.readline()
                    if not line:
                        raise BenchError(f"{argv[2:4]} ended before listening{server.said()}")
                    server.tail.append(line.decode(errors="replace").rstrip())
                    server.url = listening_url(line) or ""
        except BaseException:
            await server.stop()
            raise
        server._reader = asyncio.get_running_loop().create_task(server._drain())
        return server

    async def _drain(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.tail.append(line.decode(errors="replace").rstrip())

    def said(self) -> str:
        return f"; its output ends: {' | '.join(self.tail)}" if self.tail else ""

    async def stop(self) -> None:
        """Terminate it (kill after 10 s); its output is read to the end."""
        from proxy.shell.transports.stdio import send_signal  # noqa: PLC0415 - see the module

        send_signal(self.process, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            send_signal(self.process, signal.SIGKILL)
            await self.process.wait()
        if self._reader is not None:
            await self._reader
