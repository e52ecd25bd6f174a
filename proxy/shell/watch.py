"""``--watch``: reload the fault files when they change, keeping the last good rules on error.

The files are polled (a stat every ``interval`` seconds; no extra dependency, works on every
file system); when a stat changes, the contents are compared with those last loaded (each read
no further than the largest fault file). The files are parsed in a worker thread, so the relay
keeps going meanwhile; a reload that validates replaces the engine's rules in one step, between
two messages; counters of rules that keep their name carry over. A bad edit is logged with its
located errors and changes nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from proxy.core.commands import RulesReloaded
from proxy.core.engine import FaultEngine
from proxy.core.faultfile import FaultFileError, load_fault_files, read_fault_file
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer

__all__ = ["watch_fault_files"]

log = get_logger("proxy.watch")

Stamp = tuple[int, int, int, int, int] | None


def _stamp(path: Path) -> Stamp:
    """What tells an edit: the file's identity (an editor or ``mv`` replaces it with another), its
    size, and both times (``ctime`` changes with every write, even one that keeps ``mtime``, as
    a coarse clock or ``touch -r`` can)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


async def reload_fault_files(
    paths: Sequence[Path], engine: FaultEngine, observer: Observer
) -> bool:
    """Load ``paths`` (in a thread) and swap the engine's rules; on error keep them. Returns
    success."""
    try:
        rules, _seed = await asyncio.to_thread(load_fault_files, paths)
    except FaultFileError as exc:
        for error in exc.errors:
            log.error("fault file reload refused; keeping the last good rules", error=str(error))
        observer.observe(RulesReloaded("error", len(engine.rules)))
        return False
    engine.replace(rules)
    log.info("fault files reloaded", rules=len(rules), files=[str(path) for path in paths])
    observer.observe(RulesReloaded("success", len(rules)))
    return True


def _contents(paths: Sequence[Path]) -> list[bytes | None]:
    contents: list[bytes | None] = []
    for path in paths:
        try:
            contents.append(read_fault_file(path))
        except OSError:
            contents.append(None)
    return contents


async def watch_fault_files(
    paths: Sequence[str | Path], engine: FaultEngine, observer: Observer, interval: float = 0.25
) -> None:
    """Poll ``paths`` forever and reload when their contents change (cancel the task to stop).

    A changed stamp makes the watcher read the files; only different contents reload them, so
    a ``touch``, a ``chmod`` or a save of the same text keeps the rules as they are (rules
    added over the control API included).
    """
    files = [Path(path) for path in paths]
    stamps = [_stamp(path) for path in files]
    contents = _contents(files)
    while True:
        await asyncio.sleep(interval)
        current = [_stamp(path) for path in files]
        if current != stamps:
            stamps = current
            now = _contents(files)
            if now == contents:
                log.info("fault files touched, their contents unchanged: nothing reloaded")
                continue
            contents = now
            await reload_fault_files(files, engine, observer)
