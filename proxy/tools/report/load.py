"""Reading traces: each line into its record (:mod:`proxy.core.records`), every file merged by time.

Several proxies (one per node, DESIGN 14) each write their own trace; :func:`load_traces` reads
them all and tags every record with the file it came from (``node``, the path as given), its line
number and the proxy run of that file it belongs to (a proxy appending to its file starts a new
run with each ``trace`` header), then merges them by ``time``. The merge keeps each file's own
order (a clock that steps back never reorders one proxy's records) and, at equal times, the order
of the files as given.

A line that is no record (:func:`proxy.core.records.decode`: not a JSON object with a finite
``time`` and a string ``event``, or a known event whose fields do not hold what they should) is
skipped and counted, never fatal: a proxy that crashed may have left a partial last line. A file
that cannot be read, or whose complete lines hold no record at all (not a trace), is an error.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proxy.core.records import Record, TraceHeader, decode

__all__ = ["Entry", "FileInfo", "TraceReadError", "TraceRecords", "load_traces", "read_trace"]

_KEEP_LINES = 20
"""How many unreadable line numbers are kept per file (all are counted)."""


class TraceReadError(Exception):
    """A trace file is missing, unreadable or not a trace; the message names the file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One record of a trace file, and where it was read."""

    node: str
    """The file it came from, as given."""
    line: int
    """Its line number in that file."""
    run: int
    """Which proxy run of the file wrote it: the number of ``trace`` headers up to it."""
    record: Record

    @property
    def time(self) -> float:
        """The record's time."""
        return self.record.time


@dataclass
class FileInfo:
    """What was learnt of one file while reading it."""

    node: str
    records: int = 0
    skipped: int = 0
    unreadable: list[int] = field(default_factory=list)
    """The first unreadable lines' numbers (all are counted in ``skipped``)."""
    partial_last_line: bool = False
    runs: int = 0
    versions: list[int] = field(default_factory=list)
    """Each run's trace version."""
    first: float | None = None
    last: float | None = None


class TraceRecords(list[Entry]):
    """The merged records of :func:`load_traces` (a list), with what was learnt of each file."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        super().__init__(entries)
        self.files: list[FileInfo] = []
        self.notes: list[str] = []


def read_trace(name: str, data: bytes) -> tuple[list[Entry], FileInfo]:
    """The records of one file's bytes (named ``name``), in order, and what was learnt of it.

    Raises :class:`TraceReadError` when complete lines hold no record at all (not a trace).
    """
    info = FileInfo(name)
    entries: list[Entry] = []
    lines = data.split(b"\n")
    complete = len(lines) - 1  # the text after the last newline is a partial line (or empty)
    complete_unreadable = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = decode(line)
        if record is None:
            info.skipped += 1
            if len(info.unreadable) < _KEEP_LINES:
                info.unreadable.append(number)
            if number > complete:
                info.partial_last_line = True
            else:
                complete_unreadable += 1
            continue
        if isinstance(record, TraceHeader):
            info.runs += 1
            info.versions.append(record.version)
        entries.append(Entry(node=name, line=number, run=info.runs, record=record))
    if not entries and complete_unreadable:
        raise TraceReadError(
            f"{name}: no trace records (line {info.unreadable[0]} is not one: a JSON object with "
            "time, event and that event's fields); is it a trace file?"
        )
    info.records = len(entries)
    if entries:
        info.first = min(entry.time for entry in entries)
        info.last = max(entry.time for entry in entries)
    return entries, info


def _read_file(path: Path) -> tuple[list[Entry], FileInfo]:
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceReadError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TraceReadError(f"{name}: is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceReadError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    return read_trace(name, data)


def merge(streams: Sequence[Sequence[Entry]]) -> list[Entry]:
    """The records of several files by time, each file's in its own order (at equal times, the
    files' order)."""
    return list(heapq.merge(*streams, key=lambda entry: entry.time))


def load_traces(paths: Sequence[Path]) -> TraceRecords:
    """Every record of every file, tagged with its node, line and run, merged by ``time``.

    Unreadable lines are skipped and counted (see :attr:`TraceRecords.files`); a file given twice
    is read once. Raises :class:`TraceReadError` for a missing or unreadable file, one whose
    complete lines hold no record, or when every file is empty (no proxy wrote to any).
    """
    streams: list[list[Entry]] = []
    infos: list[FileInfo] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        resolved = path.resolve()
        if resolved in seen:
            notes.append(f"{path} was given more than once; read once")
            continue
        seen.add(resolved)
        entries, info = _read_file(path)
        streams.append(entries)
        infos.append(info)
    if infos and all(not info.records and not info.skipped for info in infos):
        names = ", ".join(info.node for info in infos)
        raise TraceReadError(
            f"{names}: empty: no proxy wrote to {'it' if len(infos) == 1 else 'them'} (was "
            "--trace given this path, and did the proxy start?)"
        )
    merged = TraceRecords(merge(streams))
    merged.files = infos
    merged.notes = notes
    return merged
