"""An Agent that will not stop by itself, nor let what it started stop: for orphan tests.

Usage: ``python stubborn_agent.py MARKER``. It ignores SIGTERM, SIGINT and the end of its stdin,
starts a child (this script with ``--child``) that ignores them too and stays in its process
group, then writes one notification, ``_x/ready`` with ``{"agent": PID, "child": PID}``, once
both ignore those signals. Both then wait ten minutes (a bound, should every stop fail). MARKER
is in both command lines, to find them in ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

LIFETIME = 600.0


def stubborn() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def main() -> int:
    stubborn()
    if "--child" in sys.argv:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdout.close()
        time.sleep(LIFETIME)
        return 0
    child = subprocess.Popen(
        [sys.executable, __file__, *sys.argv[1:], "--child"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"  # the child ignores the signals now
    pids = {"agent": os.getpid(), "child": child.pid}
    ready = {"jsonrpc": "2.0", "method": "_x/ready", "params": pids}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    for _ in sys.stdin:  # read until the end of stdin, then ignore it
        pass
    time.sleep(LIFETIME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
