"""``--state FILE``: the experiment's state (rule counters, random stream) across proxy restarts.

A Client that respawns the proxy (a stdio Client restarts its "agent") would otherwise meet a
fresh rule set, and "drop the first response" would fire again. The file is JSON, rewritten
atomically (a temporary file renamed over it) whenever a rule's counters move.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from proxy.commands import (
    FaultInjected,
    Finding,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Relayed,
    RulesCounted,
)
from proxy.errors import ConfigError
from proxy.faults import FaultEngine
from proxy.jsonrpc import Kind
from proxy.ledger import Ledger
from proxy.log import get_logger

__all__ = ["StateFile", "StateSaver"]

log = get_logger("proxy.state")

VERSION = 1


class StateFile:
    """One JSON state file, read at start and replaced atomically on save."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any] | None:
        """The saved state, or ``None`` when there is none yet."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: cannot read the state file: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ConfigError(f"{self.path}: not a state file of this proxy (version {VERSION})")
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Replace the file with ``data`` in one step; a crash leaves the old or the new file."""
        payload = json.dumps({"version": VERSION, **data}, separators=(",", ":"))
        directory = self.path.parent
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


class StateSaver:
    """An observer that saves the engine's counters and the ledger whenever they change."""

    def __init__(self, engine: FaultEngine, ledger: Ledger, file: StateFile) -> None:
        self._engine = engine
        self._ledger = ledger
        self._file = file

    def restore(self) -> None:
        """Take the saved counters, random stream and ledger, if any."""
        data = self._file.load()
        if data is not None:
            self._engine.restore(data.get("engine", {}))
            self._ledger.restore(data.get("ledger", {}))
            log.info("state restored", path=str(self._file.path))

    def save(self) -> None:
        """Write the current state now."""
        try:
            self._file.save({"engine": self._engine.snapshot(), "ledger": self._ledger.snapshot()})
        except OSError as exc:
            log.error("could not save the state file", path=str(self._file.path), error=str(exc))

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Save when a rule's counters moved or the ledger learnt something."""
        if isinstance(
            observation, RulesCounted | FaultInjected | KeyedAttempt | KeyedMessage | Finding
        ) or (
            isinstance(observation, Relayed)
            and observation.method == "session/prompt"
            and observation.kind in (Kind.RESPONSE, Kind.ERROR)
        ):
            self.save()
