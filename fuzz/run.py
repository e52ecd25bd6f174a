"""Run every fuzz target (or some) one after the other, and report each one's speed and outcome.

    python fuzz/run.py                      # each target 60 s
    python fuzz/run.py --seconds 600 relay  # one target, longer
    python fuzz/run.py --runs 2000          # a bounded number of inputs each (what CI does)

Each target keeps its working corpus in ``fuzz/.work/<target>/`` between runs and saves a
crashing input in ``fuzz/.crashes/`` (``ACP_FUZZ_WORK=DIR`` moves both). Replay one with
``python fuzz/fuzz_X.py fuzz/.crashes/fuzz_X-crash-...``. Exit status: 1 if any target failed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
TARGETS = sorted(path.stem.removeprefix("fuzz_") for path in HERE.glob("fuzz_*.py"))


def main() -> int:
    """Run the chosen targets; print one line per target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=int, default=60, help="time per target (default 60)")
    budget.add_argument("--runs", type=int, help="inputs per target instead of a time")
    options = parser.parse_args()
    unknown = set(options.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    limit = (
        f"-atheris_runs={options.runs}"
        if options.runs is not None
        else f"-max_total_time={options.seconds}"
    )
    failed = []
    for target in options.targets or TARGETS:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(HERE / f"fuzz_{target}.py"), limit],
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.monotonic() - started
        runs = re.findall(r"^(?:#|Done )(\d+)\s", done.stderr, re.MULTILINE)
        total = int(runs[-1]) if runs else 0
        outcome = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        rate = f"{total / elapsed:.0f}/s"
        sys.stdout.write(f"{target:10} {outcome}: {total} inputs in {elapsed:.0f} s ({rate})\n")
        sys.stdout.flush()
        if done.returncode != 0:
            failed.append(target)
            sys.stderr.write(done.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
