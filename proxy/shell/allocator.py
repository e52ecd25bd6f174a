"""The C allocator's two thresholds, set for a process that relays large messages (glibc).

A 64 KiB message read at once (a pipe made larger than its 64 KiB default, a socket) makes a
few buffers of 64 to 256 KiB that live for one message: the read, the line, its parse, the
next hop's copy. Left to its own thresholds, glibc gives some of them their own mappings and
hands the top of its heap back to the system once they are freed, so every such message may map
fresh pages and fault them in again (whether it does depends on the heap's layout: measured with
the compiled core, 67 page faults a message and 150 us more of CPU than the same message read
in two parts, as the bench's pipes deliver it). Fixed thresholds end that: buffers under
:data:`MMAP_THRESHOLD` come from the heap, whose top is kept up to :data:`TRIM_THRESHOLD` free.
Larger buffers (a message of many MB) are still mapped on their own and returned when freed, so
a run's memory stays bounded by its messages, as before (``acp-proxy bench --memory-check``).

``acp-proxy run`` sets them as it starts (not :mod:`proxy.embedded`: a program embedding the
proxy owns its allocator). Setting ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or a
``glibc.malloc`` tunable in ``GLIBC_TUNABLES`` keeps glibc's own choice; other C libraries are
left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping

__all__ = ["ENVIRONMENT", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

MMAP_THRESHOLD = 1024 * 1024
"""Allocations of this many bytes or more get their own mapping (glibc's ``M_MMAP_THRESHOLD``;
its own starts at 128 KiB and moves)."""

TRIM_THRESHOLD = 8 * 1024 * 1024
"""Free bytes at the top of the heap kept rather than handed back (``M_TRIM_THRESHOLD``)."""

ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}
"""The two thresholds as glibc reads them from the environment at a process's start (what
``acp-proxy bench --fixed-allocator`` gives every process it starts); set, they are kept."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator(environ: Mapping[str, str] = os.environ) -> str:
    """Set the thresholds if the C library is glibc and ``environ`` does not set them; what was
    done, for the log: ``set``, ``kept`` (the environment's), ``refused`` (by glibc) or ``not
    glibc``."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    if any(name in environ for name in ENVIRONMENT):
        return "kept"
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "kept"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or not mallopt(
        _M_TRIM_THRESHOLD, TRIM_THRESHOLD
    ):
        return "refused"
    return "set"
