"""Children that die with the proxy: the kernel's parent-death signal, where there is one.

On Linux a process can ask (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when the thread
that started it ends, however the proxy ends, SIGKILL included. Spawned Agents ask for it
between fork and exec (:mod:`proxy.shell.transports.stdio`), parsing workers as they start
(:mod:`proxy.shell.parsing`). Elsewhere :data:`AVAILABLE` is false and each user says what it
does instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import cast

__all__ = ["AVAILABLE", "die_with_parent"]

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that created it ends."""


def _find_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), looked up once, before any fork: a child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return cast(Callable[..., int], prctl)


_PRCTL = _find_prctl()
AVAILABLE = _PRCTL is not None
"""Whether this system has a parent-death signal."""


def die_with_parent(parent: int) -> None:
    """In a child of ``parent``: be killed (SIGKILL) when the thread of ``parent`` that started
    it ends; at once if ``parent`` is gone already. Nothing where :data:`AVAILABLE` is false."""
    if _PRCTL is None:
        return
    kill = int(signal.SIGKILL)
    _PRCTL(PR_SET_PDEATHSIG, kill, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os.kill(os.getpid(), kill)
