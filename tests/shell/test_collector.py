"""``acp-proxy run`` sets Python's garbage collector for relaying: what start-up made is frozen,
and the objects a burst of messages keeps alive for a moment run no collection (each check in a
process of its own: the collector's settings are the whole process's)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import TIMEOUT, log_events

from proxy.shell.collector import YOUNG_THRESHOLD

BURST = """
import gc, sys
import orjson
from proxy.shell.collector import tune_collector

if sys.argv[1] == "tuned":
    tune_collector()
runs = []
gc.callbacks.append(lambda phase, info: runs.append(info["generation"]) if phase == "start" else None)
line = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"n":1}}}'
for _ in range(20):  # twenty reads of 1,500 notifications, each parsed and kept until relayed
    burst = [orjson.loads(line) for _ in range(1500)]
    del burst
print(len(runs), gc.get_freeze_count())
"""


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "python's-own"])
def test_the_objects_of_a_burst_run_no_collection(tuned: bool) -> None:
    """1,500 parsed notifications alive at once (about 4,500 objects), twenty times: Python's
    own collector runs a collection every 700 objects, many for each burst, the tuned one none
    (and has frozen what start-up made)."""
    done = subprocess.run(
        [sys.executable, "-c", BURST, "tuned" if tuned else "own"],
        capture_output=True,
        text=True,
        check=True,
        timeout=TIMEOUT,
    )
    collections, frozen = map(int, done.stdout.split())
    if tuned:
        assert collections == 0
        assert frozen > 1000
    else:
        assert collections >= 20 * 4500 // 700 // 2  # three dicts a notification
        assert frozen == 0


def test_the_run_command_tunes_its_collector_as_it_starts() -> None:
    """The collector's settings are in the debug log of ``acp-proxy run``, once, before it
    relays anything (here: an Agent that exits at once)."""
    logged = ["--log-level", "debug", "--log-format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", *logged, "--", sys.executable, "-c", "pass"],
        check=False,  # the Agent's status is the proxy's: only the log is looked at
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
    )
    [tuned] = log_events(done.stderr, "garbage collector tuned")
    assert tuned["young_threshold"] == YOUNG_THRESHOLD
    assert tuned["frozen_objects"] > 1000
