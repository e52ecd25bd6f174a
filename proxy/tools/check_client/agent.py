"""The Agent the checker controls for one run of the Client: the proxy, with the run's fault file
and ``--trace``, in front of the reference Agent (``--store``: it keeps its sessions across
restarts); and the Client's command with that Agent put in (:func:`expand`).

Over stdio the Client spawns the Agent's command itself (again after it exits: a respawn is a new
proxy process appending to the same trace, ``--state`` keeping the rules' counters so that a
fault strikes once). With ``--listen`` the checker runs the proxy as a listener
(``--keep-upstream``: the Agent outlives a connection) and gives the Client its URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.transports.stdio import send_signal
from proxy.tools.check_client.options import AGENT, AGENT_JSON, URL
from proxy.tools.verdicts import Error

__all__ = ["CheckedAgent", "expand"]

PROXY_START_TIMEOUT = 30.0
"""Seconds a listening proxy has to say where it listens."""
PROXY_STOP_TIMEOUT = 10.0
"""Seconds a listening proxy has to finish its trace and exit after SIGTERM."""
_NOOP = [{"name": "none", "when": {"method": "_check-client/never"}, "do": {"action": "drop"}}]


def expand(argv: Sequence[str], *, agent: Sequence[str], url: str | None) -> list[str]:
    """The Client's command with the Agent put in: an argument that is exactly ``{agent}``
    becomes the Agent command's words; ``{agent}`` inside a longer one its shell-quoted command
    line, ``{agent-json}`` a JSON array of its words, ``{url}`` the URL it is served on."""
    out: list[str] = []
    for word in argv:
        if word == AGENT:
            out.extend(agent)
            continue
        put = word.replace(AGENT_JSON, json.dumps(list(agent))).replace(AGENT, shlex.join(agent))
        out.append(put.replace(URL, url) if url is not None else put)
    return out


class CheckedAgent:
    """The proxy in front of the reference Agent for one run, in ``directory``."""

    def __init__(
        self,
        directory: Path,
        rules: list[dict[str, Any]],
        listen: str | None,
        agent_args: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.trace = directory / "trace.jsonl"
        self.listen = listen
        faults = directory / "faults.yaml"
        faults.write_text(yaml.safe_dump({"version": 1, "seed": 1, "rules": rules or _NOOP}))
        python = [sys.executable, "-m", "proxy"]
        proxy = [*python, "run", "--faults", str(faults), "--trace", str(self.trace)]
        proxy += ["--state", str(directory / "state.json"), "--log-format", "json"]
        if listen is not None:
            proxy += ["--listen", listen, "--keep-upstream", "--log-level", "info"]
        else:
            proxy += ["--log-level", "error"]
        self.command = [*proxy, "--", *python, "agent", "--store", str(directory / "store")]
        self.command += agent_args
        """The Agent's command (over stdio: what ``{agent}`` becomes)."""
        self.url: str | None = None
        self._proxy: asyncio.subprocess.Process | None = None
        self._copying: asyncio.Task[None] | None = None

    def client_argv(self, template: Sequence[str]) -> list[str]:
        """The Client's command for this run."""
        return expand(template, agent=self.command, url=self.url)

    async def start(self) -> None:
        """With ``listen``: start the listening proxy and learn its URL (:class:`Error` if it
        does not listen); over stdio, nothing (the Client spawns it)."""
        if self.listen is None:
            return
        log = (self.directory / "proxy.log").open("ab", buffering=0)
        self._proxy = process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, limit=DEFAULT_MAX_MESSAGE_BYTES, process_group=0,
        )  # fmt: skip
        assert process.stderr is not None
        try:
            async with asyncio.timeout(PROXY_START_TIMEOUT):
                while self.url is None:
                    line = await process.stderr.readline()
                    log.write(line)
                    if not line:
                        raise Error("the proxy in front of the Agent did not start")
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        record = json.loads(line)
                        if record.get("event") == "listening":
                            self.url = str(record["url"])
        except TimeoutError:
            log.close()
            raise Error(f"the proxy did not listen within {PROXY_START_TIMEOUT:g} s") from None
        except Error:
            log.close()
            raise
        self._copying = asyncio.get_running_loop().create_task(self._copy(process.stderr, log))

    @staticmethod
    async def _copy(stream: asyncio.StreamReader, into: Any) -> None:
        with into:
            while line := await stream.readline():
                into.write(line)

    async def stop(self) -> None:
        """Stop the listening proxy (SIGTERM: it finishes its trace; then SIGKILL)."""
        process = self._proxy
        if process is None:
            return
        if process.returncode is None:
            send_signal(process, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), PROXY_STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        if self._copying is not None:
            await self._copying
