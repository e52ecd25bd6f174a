"""Each coverage-guided fuzz target of ``fuzz/`` runs a bounded number of inputs cleanly.

A short run in CI: the seeds (every known nasty input) and a few thousand mutations per target,
each in its own process, with its corpus and crash files kept out of the source tree. Longer
runs: ``python fuzz/run.py --seconds 600`` (README, "What is fuzzed").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris has wheels for Linux x86_64 only (the 'fuzz' extra)")
pytestmark = pytest.mark.slow

FUZZ = Path(__file__).parents[2] / "fuzz"
TARGETS = sorted(FUZZ.glob("fuzz_*.py"))
RUNS = 2000


def test_every_surface_has_a_target() -> None:
    """The surfaces the README names each have a target."""
    names = {path.stem.removeprefix("fuzz_") for path in TARGETS}
    assert names == {"jsonrpc", "splice", "framing", "sse", "faultfile", "relay"}


@pytest.mark.parametrize("target", TARGETS, ids=lambda path: path.stem)
def test_target_runs_clean(target: Path, tmp_path: Path) -> None:
    """The target reads its seeds and fuzzes RUNS inputs without a crash or a broken invariant."""
    done = subprocess.run(
        [sys.executable, str(target), f"-atheris_runs={RUNS}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ACP_FUZZ_WORK": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Done {RUNS} in" in done.stderr
    assert not list((tmp_path / ".crashes").iterdir())
