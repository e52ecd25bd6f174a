"""gzip files as a killed writer leaves them: read member after member with bounded memory, and
told apart from complete ones.

``acp-proxy run --record FILE.gz`` adds a gzip member per run; a proxy killed (what this tool
simulates) leaves its member without its end. :class:`Inflater` gives the decompressed bytes a
piece at a time, never more than a piece in memory whatever the file inflates to, and says once
the file is read whether it ended inside a member (:attr:`Inflater.cut_short`): what came before
the cut is still there to read, as ``zcat`` shows it. :func:`incomplete` says why a file is not
one complete gzip stream, which the recorder checks before appending to it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from proxy.core.errors import os_cause

__all__ = ["CHUNK_BYTES", "GZIP_MAGIC", "Inflater", "incomplete"]

CHUNK_BYTES = 64 * 1024
"""Bytes read, and decompressed bytes given, at a time."""
GZIP_MAGIC = b"\x1f\x8b"
"""How a gzip member begins."""
_GZIP = 16 + zlib.MAX_WBITS
"""zlib's window bits for a gzip member (its header and trailer checked)."""


class Inflater:
    """The decompressed bytes of the gzip members in ``file``, a piece at a time (iterate it).

    Corrupt data raises :class:`zlib.error`, reading :class:`OSError`. A file that ends inside a
    member ends the iteration too, with :attr:`cut_short` set: the bytes given are those before
    the cut. Zero bytes after a member (padding) are skipped, as gzip does.
    """

    def __init__(self, file: BinaryIO, chunk: int = CHUNK_BYTES) -> None:
        self._file = file
        self._chunk = chunk
        self.cut_short = False
        """The file ended inside a gzip member (known once the iteration ended)."""

    def __iter__(self) -> Iterator[bytes]:
        decompressor = zlib.decompressobj(_GZIP)
        started = False
        pending = b""
        while True:
            if not pending:
                pending = self._file.read(self._chunk)
                if not pending:
                    self.cut_short = started
                    return
            if not started:
                pending = pending.lstrip(b"\0")  # padding between or after members
                if not pending:
                    continue
            started = True
            out = decompressor.decompress(pending, self._chunk)
            pending = decompressor.unconsumed_tail
            if decompressor.eof:  # this member is whole; what follows is another
                pending = decompressor.unused_data
                decompressor = zlib.decompressobj(_GZIP)
                started = False
            if out:
                yield out


def incomplete(path: str) -> str | None:
    """Why the file at ``path`` is not one complete gzip stream (some members, each whole),
    which a writer appending a member to it would make unreadable even by ``zcat``; ``None``
    when it is one, or is empty. It reads the file through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot be read: {os_cause(exc)}"
    with os.fdopen(fd, "rb") as file:
        try:
            head = file.read(len(GZIP_MAGIC))
            if not head:
                return None
            if head != GZIP_MAGIC:
                return "not gzip-compressed data"
            file.seek(0)
            inflater = Inflater(file)
            for _ in inflater:
                pass
        except zlib.error as exc:
            return f"its compressed data is unreadable ({exc})"
        except OSError as exc:
            return f"cannot be read: {os_cause(exc)}"
    return "a gzip stream cut short (its writer was killed?)" if inflater.cut_short else None
