"""Substring search over large byte strings, at the C library's speed where it is available.

CPython's ``needle in data`` steps a few bytes at a time when the needle's last byte is common
in the text (a JSON needle ends with a quote, and JSON is full of them): about 2.7 GB/s for
``b'"tool_call"'`` in a MiB of notifications, where the C library's ``memmem`` scans at 15 GB/s
(62 ns against 10 per notification of 170 bytes: what 12 rules that match nothing cost a stream
of notifications, judged from the bytes, was mostly this). :func:`contains` calls ``memmem``
through :mod:`ctypes` for texts of :data:`MEMMEM_FROM` bytes or more (a call costs about half a
microsecond) and falls back to ``find`` where the C library has none (Windows). Pure: no I/O,
the same answer as ``needle in data`` always.

``needle in data`` with a ``bytes`` needle first tries to read the needle as an integer (a byte's
value), which fails with a :class:`TypeError` formatted and then cleared: about 100 ns a test,
more than the search of a short message. Hence ``data.find(needle) >= 0`` here, and, for one byte,
its value (:data:`NEWLINE`, :data:`BACKSLASH`): ``NEWLINE in data`` is a ``memchr``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final

__all__ = ["BACKSLASH", "CARRIAGE_RETURN", "COLON", "MEMMEM_FROM", "NEWLINE", "SPACE", "contains"]

NEWLINE: Final = 0x0A
"""``b"\\n"``'s value: ``NEWLINE in data`` is the fast ``b"\\n" in data`` (see the module)."""
CARRIAGE_RETURN: Final = 0x0D
"""``b"\\r"``'s value, for ``in`` likewise."""
BACKSLASH: Final = 0x5C
"""``b"\\\\"``'s value, for ``in`` likewise."""
SPACE: Final = 0x20
"""``b" "``'s value, compared with a byte of a message (``raw[i] == SPACE``)."""
COLON: Final = 0x3A
"""``b":"``'s value, likewise."""

MEMMEM_FROM: Final = 8192
"""Texts this long or longer are searched by ``memmem``; shorter ones by ``find`` (cheaper than
the foreign call for them)."""


def _memmem() -> Callable[[bytes, int, bytes, int], int | None] | None:
    """The C library's ``memmem``, typed for :mod:`ctypes`; ``None`` where there is none."""
    try:
        function = ctypes.CDLL(None).memmem
    except (AttributeError, OSError, TypeError):  # no C library by that name (Windows)
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    found: Callable[[bytes, int, bytes, int], int | None] = function
    return found


_MEMMEM: Final = _memmem()


def contains(data: bytes, needle: bytes) -> bool:
    """Whether ``needle`` occurs in ``data`` (``needle in data``, faster for long texts)."""
    if _MEMMEM is None or len(data) < MEMMEM_FROM or not needle:
        return data.find(needle) >= 0
    # ctypes hands the bytes objects' own buffers to C (no copy); they live through the call.
    return _MEMMEM(data, len(data), needle, len(needle)) is not None
