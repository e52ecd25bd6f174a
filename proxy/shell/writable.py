"""Whether the process can make files in a directory, asked of the file system itself.

A run that writes files later (the ``--state`` file, the reference Agent's ``--store`` sessions,
the demo's ``--keep`` folder) checks at start, so that a directory it cannot write (a container's
volume owned by another user, a read-only mount) stops it with one line naming the option, the
path and why, rather than with a traceback on its first write. The check makes a temporary file
where the later writes make theirs and removes it: permission bits, ownership, read-only file
systems, access control lists and security modules all answer as they will answer those writes
(``os.access`` consults the bits alone, and says yes to root whatever the mount says).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from proxy.core.errors import os_cause

__all__ = ["cannot_write_in"]


def cannot_write_in(directory: Path, prefix: str = ".acp-proxy.") -> str | None:
    """Why no file can be made in ``directory`` (in a few words: ``permission denied``,
    ``read-only file system``, ``no such file or directory``); None when one can. A temporary
    file named ``prefix...`` is made and removed."""
    try:
        fd, temporary = tempfile.mkstemp(prefix=prefix, dir=directory)
    except OSError as exc:
        return os_cause(exc)
    os.close(fd)
    with contextlib.suppress(OSError):
        Path(temporary).unlink()
    return None
