"""``--state FILE``: the experiment's state (rule counters, random stream) across proxy restarts.

A Client that respawns the proxy (a stdio Client restarts its "agent") would otherwise meet a
fresh rule set, and "drop the first response" would fire again. The file is JSON, rewritten
atomically (a temporary file renamed over it) whenever a rule's counters move.

At start, a state file that cannot be read or is not one of this proxy (not JSON, another shape,
another version), or a place where it cannot be written, is a
:class:`~proxy.core.errors.StartupError`. A save that fails during the run (a full disk, a directory
gone) never stops the relay: it is logged once (and again when saving works again), counted
through ``on_failure``, and the next change of counters tries again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.core import acp
from proxy.core.engine import FaultEngine
from proxy.core.errors import StartupError, os_cause
from proxy.core.jsonrpc import Kind
from proxy.core.ledger import Ledger
from proxy.core.observations import (
    FaultInjected,
    Finding,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Relayed,
    RulesCounted,
)
from proxy.shell.log import get_logger
from proxy.shell.writable import cannot_write_in

__all__ = ["StateFile", "StateSaver"]

log = get_logger("proxy.state")

VERSION = 1


class StateFile:
    """One JSON state file, read at start and replaced atomically on save."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def refused(self, cause: str) -> StartupError:
        """The startup error of this file, for ``cause``."""
        return StartupError("--state", str(self.path), cause)

    def load(self) -> dict[str, Any] | None:
        """The saved state, or ``None`` when there is none yet; :class:`StartupError` when the
        file cannot be read or is not a state file of this proxy."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.refused(os_cause(exc)) from None
        try:
            data = json.loads(text.decode("utf-8"))
        except UnicodeDecodeError:
            raise self.refused("not a state file: not UTF-8") from None
        except ValueError as exc:  # json.JSONDecodeError, located
            raise self.refused(f"not a state file: invalid JSON ({exc})") from None
        except RecursionError:
            raise self.refused("not a state file: nested too deeply") from None
        if not isinstance(data, dict) or "version" not in data:
            raise self.refused("not a state file: no version")
        if data["version"] != VERSION:
            raise self.refused(
                f"a state file of version {data['version']!r}; this proxy reads version {VERSION}"
            )
        return data

    def check_writable(self) -> None:
        """Make and remove a temporary file where :meth:`save` makes its own (the directory):
        :class:`StartupError` when that fails."""
        cause = cannot_write_in(self.path.parent, prefix=f".{self.path.name}.")
        if cause is not None:
            raise self.refused(f"cannot be written: {cause}")

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

    def __init__(
        self,
        engine: FaultEngine,
        ledger: Ledger,
        file: StateFile,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._engine = engine
        self._ledger = ledger
        self._file = file
        self._on_failure = on_failure
        self.failure: str | None = None
        """Why the last save failed, while saving fails."""

    def restore(self) -> None:
        """Take the saved counters, random stream and ledger, if any; check that the file can
        be written. :class:`StartupError` when either fails."""
        data = self._file.load()
        if data is not None:
            parts = (("engine", self._engine.restore), ("ledger", self._ledger.restore))
            for name, restore in parts:
                try:
                    restore(_member(data, name))
                except (LookupError, TypeError, ValueError, AttributeError) as exc:
                    detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
                    cause = f"not a state file of this proxy: {name}: {detail}"
                    raise self._file.refused(cause) from None
        self._file.check_writable()
        if data is not None:
            log.info("state restored", path=str(self._file.path))

    def save(self) -> None:
        """Write the current state now (a failure is logged, once until a save works again)."""
        try:
            self._file.save({"engine": self._engine.snapshot(), "ledger": self._ledger.snapshot()})
        except OSError as exc:
            cause = os_cause(exc)
            if self.failure is None:
                log.error("saving the state failed", path=str(self._file.path), error=cause)
            self.failure = cause
            if self._on_failure is not None:
                self._on_failure(cause)
            return
        if self.failure is not None:
            self.failure = None
            log.info("saving the state works again", path=str(self._file.path))

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Save when a rule's counters moved or the ledger learnt something."""
        if isinstance(
            observation, RulesCounted | FaultInjected | KeyedAttempt | KeyedMessage | Finding
        ) or (
            isinstance(observation, Relayed)
            and observation.method == acp.PROMPT
            and observation.kind in (Kind.RESPONSE, Kind.ERROR)
        ):
            self.save()


def _member(data: dict[str, Any], name: str) -> dict[str, Any]:
    """``data[name]``, an object (missing: empty)."""
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise TypeError("not an object")
    return value
