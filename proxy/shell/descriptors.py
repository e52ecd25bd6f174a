"""What the shell does to file descriptors themselves: write a whole buffer, widen a pipe.

``os.write`` may write part of a buffer: a disk filling up, a file size limit, a signal during a
write to a pipe. Whoever writes with it (the trace, the stdio bridge's thread, the memory files
the parsing workers read) goes on from where it stopped, with one loop: :func:`write_all`. It is
written for the interpreter (a view of the rest, no copy) and stays out of the compiled modules,
which evaluated a slice bound with a side effect twice (``docs/development.md``).

A pipe holds 64 KiB unless asked for more (Linux). A 64 KiB prompt, one byte more with its
newline, then crosses it in two writes and two reads, each a wake-up of both processes: 50-130 us
of a round trip through the proxy (docs/bench.md). :func:`widen_pipe` asks for more room on the
pipes of a stdio proxy (``--pipe-bytes``).
"""

from __future__ import annotations

import fcntl
import os
import stat

__all__ = ["pipe_size", "widen_pipe", "write_all"]

_SET_SIZE: int | None = getattr(fcntl, "F_SETPIPE_SZ", None)
_GET_SIZE: int | None = getattr(fcntl, "F_GETPIPE_SZ", None)
"""Linux's pipe size commands (Python 3.10+ names them; other systems have none)."""


def write_all(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` to ``descriptor`` (blocking), going on after short writes;
    :class:`OSError` when a write fails (what was written before stays written)."""
    written = os.write(descriptor, data)
    if written == len(data):
        return
    with memoryview(data) as view:
        while written < len(view):
            written += os.write(descriptor, view[written:])


def pipe_size(descriptor: int) -> int | None:
    """What the pipe on ``descriptor`` holds, in bytes; None for anything else, or where the
    system does not tell."""
    if _GET_SIZE is None or not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
        return None
    return fcntl.fcntl(descriptor, _GET_SIZE)


def widen_pipe(descriptor: int, size: int) -> int | None:
    """Ask that the pipe on ``descriptor`` hold at least ``size`` bytes; what it holds after, or
    None when ``descriptor`` is not a pipe or the system has no such command.

    A pipe is never narrowed. Refused ``size`` (past ``/proc/sys/fs/pipe-max-size`` without
    ``CAP_SYS_RESOURCE``; more than the kernel will allocate), it gets the largest size the
    system allows, ``pipe-max-size``; refused that too (once the user's pipes hold
    ``pipe-user-pages-soft`` in all), it keeps its size: a wider pipe saves wake-ups, it is never
    needed.
    """
    before = pipe_size(descriptor)
    if before is None or _SET_SIZE is None or before >= size:
        return before
    try:
        return fcntl.fcntl(descriptor, _SET_SIZE, size)
    except OSError:
        most = _pipe_max_size()
    if most is not None and before < most < size:
        try:
            return fcntl.fcntl(descriptor, _SET_SIZE, most)
        except OSError:
            pass
    return before


def _pipe_max_size() -> int | None:
    """The largest pipe a process without ``CAP_SYS_RESOURCE`` may ask for (Linux)."""
    try:
        with open("/proc/sys/fs/pipe-max-size", "rb") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return None
