"""Fault files on disk: read and loaded once at start, and watched (``--watch``).

:func:`load_fault_files` reads and validates every file of a run (:mod:`proxy.core.faultfile`
parses them) and keeps what it read, so that the run loads its files once: the engine, the
control API's first rules and the watcher all start from that one reading.

``--watch`` polls the files (a stat every ``interval`` seconds; no extra dependency, works on
every file system); the stat follows symbolic links, so a Kubernetes ConfigMap volume, whose
``DIR/NAME`` is a link through ``..data`` that the kubelet swaps to a new folder on each update,
is seen to change as a replaced file is (tests/e2e/test_faults_e2e.py builds that layout); when
a stat changes, the contents are compared with those last loaded (each
read no further than the largest fault file): the first comparison is with what the run loaded,
so an edit made while the proxy was starting is seen too. The files are parsed in a worker
thread, so the relay keeps going meanwhile; a reload that validates replaces the engine's rules
in one step, between two messages; counters of rules that keep their name carry over. A bad edit
is logged with its located errors and changes nothing.

The commands on fault files are here too: ``acp-proxy validate`` (:func:`validate_main`) and
``acp-proxy schema`` (:func:`schema_main`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from proxy.core.engine import FaultEngine
from proxy.core.errors import os_cause
from proxy.core.faultfile import (
    MAX_FILE_BYTES,
    MAX_RULES,
    FaultFileError,
    Location,
    Rule,
    fault_file_schema,
    located_notes,
    parse_fault_file,
    too_large,
)
from proxy.core.observations import RulesReloaded
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer

__all__ = [
    "LoadedFaults",
    "load_fault_files",
    "print_fault_file_errors",
    "read_fault_file",
    "schema_main",
    "validate_main",
    "watch_fault_files",
]

log = get_logger("proxy.watch")

Stamp = tuple[int, int, int, int, int] | None


@dataclass(frozen=True, slots=True)
class LoadedFaults:
    """The rules of a run's fault files, and what was read to get them."""

    paths: tuple[Path, ...]
    rules: list[Rule]
    seed: int | None
    """The seed of the first file that sets one."""
    stamps: tuple[Stamp, ...] | None
    """Each file's stamp, taken before it was read (None: unknown, any stamp differs)."""
    contents: tuple[bytes | None, ...]
    """Each file's bytes as read (None: it could not be read)."""


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
        rules = (await asyncio.to_thread(load_fault_files, paths)).rules
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
    loaded: LoadedFaults, engine: FaultEngine, observer: Observer, interval: float = 0.25
) -> None:
    """Poll the files ``loaded`` came from forever and reload when their contents change (cancel
    the task to stop).

    A changed stamp makes the watcher read the files; only contents other than those last loaded
    reload them, so a ``touch``, a ``chmod`` or a save of the same text keeps the rules as they
    are (rules added over the control API included).
    """
    files = list(loaded.paths)
    stamps = [None] * len(files) if loaded.stamps is None else list(loaded.stamps)
    contents = list(loaded.contents)
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


def read_fault_file(path: str | Path) -> bytes:
    """A fault file's bytes, read no further than one byte past :data:`MAX_FILE_BYTES` (enough to
    tell that it is too large, whatever it is: a huge file, a device). Raises ``OSError``."""
    with Path(path).open("rb") as file:
        return file.read(MAX_FILE_BYTES + 1)


def load_fault_files(paths: Sequence[str | Path]) -> LoadedFaults:
    """Read, load and validate every file: all rules in order, the seed, and what was read.

    Every error of every file is collected before raising one :class:`FaultFileError`.
    Rule names must be unique across files; the first file that sets a seed gives it; all the
    files together hold at most :data:`MAX_RULES` rules.
    """
    files = tuple(Path(path) for path in paths)
    stamps = tuple(_stamp(path) for path in files)
    contents: list[bytes | None] = []
    rules: list[Rule] = []
    seed: int | None = None
    errors: list[Location] = []
    origin: dict[str, str] = {}
    for path in files:
        name = str(path)
        try:
            data = read_fault_file(path)
        except OSError as exc:
            contents.append(None)
            errors.append(Location(file=name, message=f"cannot read it: {os_cause(exc)}"))
            continue
        contents.append(data)
        try:
            if len(data) > MAX_FILE_BYTES:
                raise too_large(name)
            parsed = parse_fault_file(data.decode("utf-8"), name)
        except UnicodeDecodeError as exc:
            message = f"not UTF-8 text: byte {exc.start + 1} cannot be decoded"
            errors.append(Location(file=name, message=message))
            continue
        except FaultFileError as exc:
            errors.extend(exc.errors)
            continue
        for rule in parsed.rules:
            if rule.name in origin:
                errors.append(
                    Location(
                        file=name,
                        rule=rule.name,
                        field="name",
                        message=f"rule name already used in {origin[rule.name]}",
                    )
                )
            origin[rule.name] = name
        rules.extend(parsed.rules)
        if seed is None:
            seed = parsed.seed
    if len(rules) > MAX_RULES and not errors:
        names = ", ".join(str(path) for path in files)
        message = f"{len(rules):,} rules in all: at most {MAX_RULES:,}"
        errors.append(Location(file=names, message=message))
    if errors:
        raise FaultFileError(errors)
    return LoadedFaults(files, rules, seed, stamps, tuple(contents))


def print_fault_file_errors(exc: FaultFileError) -> None:
    """Every located error of ``exc``, each on an ``error: ...`` line of its own, on stderr."""
    for error in exc.errors:
        sys.stderr.write(f"error: {error}\n")


def validate_main(paths: Sequence[Path], *, strict: bool = False) -> int:
    """``acp-proxy validate``: check the fault files; 0, or 2 with every error located.

    What is valid but worth a word (a rule's notes) goes to stderr as located ``note: ...``
    lines, the verdict (``ok: ...``) to stdout; ``strict``: a note fails the check (exit 1),
    but that an action needs Clients on Streamable HTTP (the file cannot say where they connect).
    """
    try:
        loaded = load_fault_files(paths)
    except FaultFileError as exc:
        print_fault_file_errors(exc)
        return 2
    notes = [
        note
        for path, content in zip(paths, loaded.contents, strict=True)
        if content is not None
        for note in located_notes(content.decode("utf-8"), str(path))
    ]
    for note, _ in notes:
        sys.stderr.write(f"note: {note}\n")
    seed_text = "no seed" if loaded.seed is None else f"seed {loaded.seed}"
    rules = _counted(len(loaded.rules), "rule")
    failing = [note for note, needs_http in notes if not needs_http]  # Clients may use HTTP
    if strict and failing:
        sys.stdout.write(f"FAIL: {_counted(len(failing), 'note')} (--strict)\n")
        return 1
    sys.stdout.write(f"ok: {rules} in {_counted(len(paths), 'file')}, {seed_text}\n")
    return 0


def _counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def schema_main() -> int:
    """``acp-proxy schema``: print the JSON Schema of fault files (for editors); 0."""
    sys.stdout.write(json.dumps(fault_file_schema(), indent=2) + "\n")
    return 0
