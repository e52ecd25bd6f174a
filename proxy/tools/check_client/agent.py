"""The Agent the checker controls for one run of the Client: the proxy, with the run's fault file
and ``--trace``, in front of the reference Agent (``--store``: it keeps its sessions across
restarts); and the Client's command with that Agent put in (:func:`expand`).

Over stdio the Client spawns the Agent's command itself (again after it exits: a respawn is a new
proxy process appending to the same trace, ``--state`` keeping the rules' counters so that a
fault strikes once). With ``--listen`` the checker runs the proxy as a listener
(``--keep-upstream``: the Agent outlives a connection) and gives the Client its URL.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from proxy.tools.check_client.options import AGENT, AGENT_JSON, URL
from proxy.tools.listener import ListeningProxy, NotListening
from proxy.tools.verdicts import Error

__all__ = ["CheckedAgent", "expand"]

MAX_SESSIONS = 64
"""Session files of the reference Agent's store read at most, for the Client's version."""
MAX_SESSION_BYTES = 16 << 20
"""The largest session file read (a larger one holds huge prompts, and says nothing more)."""
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
        store = str(directory / "store")
        self.command = [*proxy, "--", *python, "agent", "--store", store, *agent_args]
        """The Agent's command (over stdio: what ``{agent}`` becomes)."""
        self.url: str | None = None
        self._proxy: ListeningProxy | None = None

    def client_versions(self) -> set[int]:
        """The protocol versions the Agent agreed with the Client for the sessions it created
        (its store says; at most :data:`MAX_SESSIONS` files of :data:`MAX_SESSION_BYTES` read)."""
        versions: set[int] = set()
        with contextlib.suppress(OSError):
            for path in sorted((self.directory / "store").glob("*.json"))[:MAX_SESSIONS]:
                with contextlib.suppress(OSError, ValueError):
                    if path.stat().st_size <= MAX_SESSION_BYTES:
                        version = json.loads(path.read_bytes()).get("protocolVersion")
                        if isinstance(version, int):
                            versions.add(version)
        return versions

    def client_argv(self, template: Sequence[str]) -> list[str]:
        """The Client's command for this run."""
        return expand(template, agent=self.command, url=self.url)

    async def start(self) -> None:
        """With ``listen``: start the listening proxy and learn its URL (:class:`Error` if it
        does not listen); over stdio, nothing (the Client spawns it)."""
        if self.listen is None:
            return
        log = (self.directory / "proxy.log").open("ab", buffering=0)
        try:
            self._proxy = await ListeningProxy.start(self.command, log)
        except NotListening as exc:
            raise Error(f"the proxy in front of the Agent: {exc}") from None
        self.url = self._proxy.url

    async def stop(self) -> None:
        """Stop the listening proxy, if any (it finishes its trace first)."""
        if self._proxy is not None:
            await self._proxy.stop()
