"""The proxy in front of the Agent for one trace, and the Client connections to it.

A :class:`Lab` writes the trace's fault file, starts the proxy (spawned per connection over
stdio, or one listener for ``ws`` and ``http``, and for a trace that must reconnect), opens
:class:`~proxy.tools.check_agent.conversation.Conversation` s to it, keeps the proxies' logs in
the trace's directory, and explains from them a connection that closed early
(:meth:`Lab.diagnosis`): they are never shown as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.endpoint import Endpoint
from proxy.shell.transports.stdio import AgentProcess, spawn_agent
from proxy.tools.check_agent.conversation import Conversation
from proxy.tools.check_agent.options import CheckOptions, Transport
from proxy.tools.listener import ListeningProxy, NotListening
from proxy.tools.rpc import connect
from proxy.tools.verdicts import Error

__all__ = ["Lab", "open_lab"]

CLOSE_TIMEOUT = 5.0
"""Seconds a Client connection has to close when the trace is over."""

DETAILS = ("error", "exit_status", "command", "status")
"""Fields of a proxy's log record that say what went wrong, the first one present shown."""

_NOOP = [{"name": "none", "when": {"method": "_check-agent/never"}, "do": {"action": "drop"}}]


class Lab:
    """The proxy in front of the Agent for one trace, and the Client connections to it."""

    def __init__(self, options: CheckOptions, directory: Path) -> None:
        self.options = options
        self.directory = directory
        self._processes: list[AgentProcess] = []
        self._proxy: ListeningProxy | None = None
        self._url: str | None = None
        self._conversations: list[Conversation] = []
        self.transport: Transport = options.transport
        self.keys: list[str] = []
        """The idempotency keys this trace sent (never expected back from the Agent)."""
        self._logs: list[Path] = []
        self._link_ended = asyncio.Event()
        """A listening proxy logged the end of a link (what it says of it is in its log now)."""

    def key(self, name: str) -> str:
        """A fresh idempotency key for one submission (``name`` says which, in reports)."""
        key = f"{name}-{uuid.uuid4()}"
        self.keys.append(key)
        return key

    def _log_file(self) -> Any:
        path = self.directory / f"proxy-{len(self._logs) + 1}.log"
        self._logs.append(path)
        return path.open("ab", buffering=0)

    async def diagnosis(self) -> str:
        """What the proxies said went wrong (the Agent's exit, a command not found), if anything:
        for a reason that would otherwise only say the connection closed."""
        for process in self._processes:  # a proxy whose connection closed is ending: let it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.process.wait()), 2)
        if self._proxy is not None and self._proxy.process.returncode is None:  # the link's end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._link_ended.wait(), 2)
        said: list[str] = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                for line in path.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict) and record.get("level") in ("error", "warning"):
                            detail = next(
                                (record[k] for k in DETAILS if record.get(k) is not None), ""
                            )
                            said.append(
                                f"{record.get('event')}" + (f" ({detail})" if detail else "")
                            )
        for process in self._processes:
            if process.process.returncode not in (None, 0):
                said.append(f"the proxy exited with status {process.process.returncode}")
        return "; ".join(dict.fromkeys(said[-4:]))

    def _faults(self, rules: list[dict[str, Any]]) -> Path:
        path = self.directory / f"faults-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "seed": 1, "rules": rules or _NOOP}))
        return path

    async def start(self, rules: list[dict[str, Any]], *, network: bool = False) -> None:
        """Start the proxy with ``rules`` (``network``: a WebSocket/HTTP listener)."""
        transport: Transport = (
            "ws" if network and self.options.transport == "stdio" else self.options.transport
        )
        self._command = [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--log-format",
            "json",
            "--log-level",
            "warning",
            "--faults",
            str(self._faults(rules)),
            "--state",
            str(self.directory / "state.json"),
        ]
        if transport != "stdio":
            self._command += ["--listen", f"{transport}://127.0.0.1:0/acp", "--keep-upstream"]
            self._command += ["--log-level", "info"]
            self.transport = transport
            await self._start_listener()
        else:
            self.transport = "stdio"
        self._command += ["--", *self.options.agent_argv]

    async def _start_listener(self) -> None:
        command = [*self._command, "--", *self.options.agent_argv]
        try:
            self._proxy = await ListeningProxy.start(command, self._log_file(), self._on_line)
        except NotListening as exc:
            said = await self.diagnosis()
            raise Error(f"{exc}: {said or 'it said nothing'}") from None
        self._url = self._proxy.url

    def _on_line(self, line: bytes) -> None:
        """A line of the listening proxy's log: a link's end is noted (for a diagnosis)."""
        if b'"link ended"' in line:
            self._link_ended.set()

    async def connect(self) -> Conversation:
        """A new Client connection (a respawned proxy on stdio)."""
        self._link_ended.clear()  # a diagnosis waits for this connection's link to end
        endpoint: Endpoint
        if self.transport == "stdio":
            with self._log_file() as log_file:  # the proxy's stderr: for diagnosis, not the user
                process = await spawn_agent(
                    self._command,
                    limit=DEFAULT_MAX_MESSAGE_BYTES,
                    grace=1.0,
                    stderr=log_file,
                    announce_exit=False,
                )  # its exit is told in the verdict
            self._processes.append(process)
            endpoint = process
        else:
            assert self._url is not None
            endpoint = await connect(self._url, limit=DEFAULT_MAX_MESSAGE_BYTES)
        conversation = Conversation(endpoint, self.options.answer_timeout)
        self._conversations.append(conversation)
        return conversation

    def disconnect(self, conversation: Conversation) -> None:
        """Cut ``conversation`` now (the Client goes away without a word)."""
        conversation.peer.sever()

    async def close(self) -> None:
        for conversation in self._conversations:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conversation.peer.close(grace=CLOSE_TIMEOUT), CLOSE_TIMEOUT)
        for process in self._processes:
            if process.process.returncode is None:
                process.signal(signal.SIGKILL)
            await process.process.wait()
        if self._proxy is not None:
            await self._proxy.stop()

    def keys_echoed(self) -> list[str]:
        """The keys of this trace that appear in what the Agent sent."""
        echoed: list[str] = []
        for conversation in self._conversations:
            echoed += conversation.mentions(self.keys)
        return sorted(set(echoed))


@contextlib.asynccontextmanager
async def open_lab(options: CheckOptions) -> AsyncIterator[Lab]:
    """A lab in a temporary directory of its own, closed on the way out."""
    with tempfile.TemporaryDirectory(prefix="acp-check-") as directory:
        lab = Lab(options, Path(directory))
        try:
            yield lab
        finally:
            await lab.close()
