"""Test harness: the proxy as a real subprocess, driven line by line with timeouts, never sleeps."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from proxy.control import ControlClient

ROOT = Path(__file__).resolve().parents[2]
"""The project's root folder."""
PEERS = Path(__file__).parent / "peers"
SDK_AGENT = [sys.executable, str(PEERS / "sdk_agent.py")]
"""The official Python SDK's example Agent (``peers/sdk_agent.py``), as a command line."""
RAW_AGENT = PEERS / "raw_agent.py"

FACTOR = float(os.environ.get("ACP_PROXY_TEST_TIMEOUT_FACTOR", "1"))
"""How much slower than a usual machine this one is taken to be (``ACP_PROXY_TEST_TIMEOUT_FACTOR``)."""
TIMEOUT = 30.0 * FACTOR
"""Seconds any single wait in a test may take; scale it on a slow machine."""

PROXY_RUN = [sys.executable, "-m", "proxy", "run"]

INFLIGHT_BOUND_REACHED = (
    "bytes in flight reached their bound; reading waits and POSTs that do not fit are refused "
    "(503) until peers read"
)
"""The warning the proxy logs once its bytes in flight reach ``--max-inflight-bytes``."""


class ProxyProcess:
    """``acp-proxy run`` in a subprocess, with the test process as its Client.

    (Any process whose stderr carries JSON log lines can be wrapped, for :meth:`logged`.)
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._stderr = bytearray()
        self.news = asyncio.Event()
        """Set whenever more stderr has been collected."""
        self._stderr_task = asyncio.get_running_loop().create_task(self._collect_stderr())

    @classmethod
    async def start(
        cls,
        agent: list[str],
        *options: str,
        limit: int = 256 * 1024 * 1024,
        stdout: int = asyncio.subprocess.PIPE,
        preexec_fn: Callable[[], None] | None = None,
    ) -> ProxyProcess:
        """Start the proxy with ``options`` in front of ``agent`` (none: a network upstream).

        ``limit``: what the test buffers of the proxy's stdout before it stops reading the pipe
        (and the longest line :meth:`recv` takes). ``stdout``: another file descriptor for it.
        ``preexec_fn``: run in the child before the proxy is executed (a resource limit).
        """
        process = await asyncio.create_subprocess_exec(
            *PROXY_RUN,
            *options,
            *(["--", *agent] if agent else []),
            stdin=asyncio.subprocess.PIPE,
            stdout=stdout,
            stderr=asyncio.subprocess.PIPE,
            limit=limit,
            preexec_fn=preexec_fn,
        )
        return cls(process)

    async def _collect_stderr(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.read(65536):
            self._stderr += chunk
            self.news.set()

    async def logged(self, event: str, count: int = 1) -> dict[str, Any]:
        """Wait until the JSON log event ``event`` has been written ``count`` times; the last."""
        async with asyncio.timeout(TIMEOUT):
            while len(found := log_events(self.stderr, event)) < count:
                self.news.clear()
                await self.news.wait()
        return found[count - 1]

    async def send(self, *lines: bytes) -> None:
        """Write each line, newline-terminated, to the proxy's stdin."""
        assert self.process.stdin is not None
        for line in lines:
            self.process.stdin.write(line + b"\n")
        await self.process.stdin.drain()

    async def send_json(self, message: dict[str, Any]) -> None:
        """Write one message serialised compactly."""
        await self.send(json.dumps(message, separators=(",", ":")).encode())

    async def recv(self) -> bytes:
        """The next line from the proxy's stdout, without its newline."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), TIMEOUT)
        assert line.endswith(b"\n"), f"stdout ended: {line!r}; stderr: {self.stderr}"
        return line[:-1]

    async def recv_json(self) -> Any:
        """The next line, parsed."""
        return json.loads(await self.recv())

    async def at_eof(self) -> bool:
        """Whether stdout ends without another line."""
        assert self.process.stdout is not None
        return await asyncio.wait_for(self.process.stdout.read(), TIMEOUT) == b""

    async def close_stdin(self) -> None:
        """End the Client's side of the conversation."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.stdin.wait_closed()

    async def wait(self) -> int:
        """The proxy's exit status (after it exited by itself)."""
        status = await asyncio.wait_for(self.process.wait(), TIMEOUT)
        await asyncio.wait_for(self._stderr_task, TIMEOUT)
        return status

    @property
    def stderr(self) -> str:
        """What the proxy (and the Agent) wrote to stderr so far."""
        return self._stderr.decode("utf-8", "replace")

    async def stop(self) -> None:
        """Kill the proxy if it is still running (test cleanup)."""
        if self.process.returncode is None:
            self.process.kill()
            # wait() returns once every pipe has closed too; output left unread (a test that
            # failed while it did not read) would keep stdout open, so it is read away.
            unread = [self.process.stdout.read()] if self.process.stdout is not None else []
            await asyncio.gather(self.process.wait(), *unread)
        self._stderr_task.cancel()


@contextlib.asynccontextmanager
async def reference_agent(listen: str, *options: str) -> AsyncIterator[str]:
    """``acp-proxy agent --listen LISTEN OPTIONS`` in a subprocess for the block: the URL it
    serves, as it logged it (port 0 resolved)."""
    server = ProxyProcess(
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "proxy", "agent", "--listen", listen, *options),
            *("--log-format", "json", "--log-level", "info"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    )
    try:
        yield str((await server.logged("listening"))["url"])
    finally:
        await server.stop()


def raw_agent(capture: Path, *flags: str) -> list[str]:
    """argv of the scripted Agent that records what it reads into ``capture``."""
    return [sys.executable, str(RAW_AGENT), str(capture), *flags]


def system_pipe_size() -> int:
    """What a new pipe holds on this system (Linux's ``F_GETPIPE_SZ``)."""
    read_end, write_end = os.pipe()
    try:
        return fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
    finally:
        os.close(read_end)
        os.close(write_end)


def system_pipe_max() -> int:
    """The largest pipe a process without ``CAP_SYS_RESOURCE`` may ask for (Linux)."""
    return int(Path("/proc/sys/fs/pipe-max-size").read_text())


def captured(capture: Path) -> list[bytes]:
    """The lines the scripted Agent read, without newlines."""
    return capture.read_bytes().splitlines()


def log_events(text: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines (``--log-format json``) in ``text`` whose event is ``event``."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
    return found


def unboxed(text: str) -> str:
    """A usage error's text without the frame typer draws around it, on one line."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def encode(message: dict[str, Any]) -> bytes:
    """A message as one compact JSON line (without the newline)."""
    return json.dumps(message, separators=(",", ":")).encode()


def request(request_id: object, method: str, params: Any = None) -> bytes:
    """A JSON-RPC request line."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return encode(message)


def notification(method: str, params: Any = None) -> bytes:
    """A JSON-RPC notification line."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return encode(message)


def say(*lines: bytes) -> bytes:
    """A notification that makes the scripted Agent write ``lines`` to its stdout, in order."""
    return notification("_test/say", {"b64": [base64.b64encode(line).decode() for line in lines]})


def fault_file(
    directory: Path, *rules: dict[str, Any], seed: int | None = None, name: str = "faults.yaml"
) -> Path:
    """Write a fault file of ``rules`` (YAML, or JSON when ``name`` ends in ``.json``); its path.

    The file is written with :func:`replace_file`, for a proxy watching it (``--watch``).
    """
    data: dict[str, Any] = {"version": 1}
    if seed is not None:
        data["seed"] = seed
    data["rules"] = list(rules)
    path = directory / name
    replace_file(
        path,
        json.dumps(data, indent=2)
        if name.endswith(".json")
        else yaml.safe_dump(data, sort_keys=False),
    )
    return path


def write_jsonl(path: Path, *lines: dict[str, Any] | str) -> Path:
    """Write records (dicts) and raw lines (strings) as a JSONL file (a hand-written trace), each
    line newline-terminated; its path."""
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def replace_file(path: Path, text: str) -> None:
    """Replace ``path`` in one step, so that a proxy watching it (``--watch``) never reads half
    of it."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


Start = Callable[..., Awaitable[ProxyProcess]]
"""The ``start`` fixture: ``await start(agent_argv, *options)`` a proxy (JSON logs) in front of an
Agent (none: a network upstream)."""
Controlled = Callable[..., Awaitable[tuple[ProxyProcess, ControlClient]]]
"""The ``controlled`` fixture: ``await controlled(agent_argv, *options, token=None)`` a proxy with
its control API, and a client of that API."""
