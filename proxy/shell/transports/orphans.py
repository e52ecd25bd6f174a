"""The guard of the Agents' process groups: stops what a spawned Agent started when the proxy dies.

A parent-death signal (Linux) kills the Agent itself when the proxy dies, even of SIGKILL, but
not what the Agent started: those processes stay in the Agent's process group, orphaned, and no
signal of the kernel reaches them. This small process outlives the proxy to reach them. The
proxy starts it once (:class:`proxy.shell.transports.stdio.OrphanGuard`), in a session of its own
(so that a signal to the proxy's process group or terminal spares it), and tells it on its stdin,
one line each, of every Agent's process group: ``+PGID GRACE`` when an Agent is spawned, ``-PGID``
once the proxy has seen that group end. The proxy never closes that pipe: its end of file means
the proxy is gone, however it ended. Then every group still listed is sent SIGTERM and, after
its grace (at most :data:`MAX_GRACE` seconds), SIGKILL; then this process exits.

It is run as a script, by path (``python -I -S orphans.py``): the standard library only, no
import of the proxy's package, so that it starts in milliseconds and wherever the proxy runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

POLL = 0.05
"""Seconds between two looks whether the groups signalled are gone."""
MAX_GRACE = 60.0
"""The longest grace a group gets between SIGTERM and SIGKILL."""
MAX_LINE = 64
"""Bytes of one line the proxy writes; a longer one is not the proxy's, and is ignored."""


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member this process may not signal (a setuid one)
        return True
    return True


def _signal(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_groups(groups: dict[int, float]) -> None:
    """SIGTERM to each group, then SIGKILL to those still there after their grace."""
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    start = time.monotonic()
    waiting = dict(groups)
    while waiting:
        now = time.monotonic() - start
        for pgid, grace in list(waiting.items()):
            if not _alive(pgid):
                del waiting[pgid]
            elif now >= min(grace, MAX_GRACE):
                _signal(pgid, signal.SIGKILL)
                del waiting[pgid]
        if waiting:
            time.sleep(POLL)


def _parse(line: bytes, groups: dict[int, float]) -> None:
    """Take one ``+PGID GRACE`` or ``-PGID`` line into ``groups`` (anything else is ignored)."""
    if len(line) > MAX_LINE:
        return
    words = line.split()
    try:
        if len(words) == 2 and words[0].startswith(b"+"):
            pgid, grace = int(words[0][1:]), float(words[1])
            if pgid > 1 and grace >= 0:
                groups[pgid] = grace
        elif len(words) == 1 and words[0].startswith(b"-"):
            groups.pop(int(words[0][1:]), None)
    except ValueError:
        pass


def main() -> int:
    """Read the proxy's lines until its end, then stop every group still listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: dict[int, float] = {}
    for line in sys.stdin.buffer:
        _parse(line, groups)
    stop_groups(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
