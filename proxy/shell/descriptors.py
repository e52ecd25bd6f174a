"""Writing the whole of a buffer to a blocking file descriptor.

``os.write`` may write part of a buffer: a disk filling up, a file size limit, a signal during a
write to a pipe. Whoever writes with it (the trace, the stdio bridge's thread, the memory files
the parsing workers read) goes on from where it stopped, with one loop: this one. It is written
for the interpreter (a view of the rest, no copy) and stays out of the compiled modules, which
evaluated a slice bound with a side effect twice (``docs/development.md``).
"""

from __future__ import annotations

import os

__all__ = ["write_all"]


def write_all(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` to ``descriptor`` (blocking), going on after short writes;
    :class:`OSError` when a write fails (what was written before stays written)."""
    written = os.write(descriptor, data)
    if written == len(data):
        return
    with memoryview(data) as view:
        while written < len(view):
            written += os.write(descriptor, view[written:])
