"""Running one atheris fuzz target: its seed corpus, a working corpus and where crashes go.

``python fuzz/fuzz_X.py [libFuzzer flags]`` with no corpus directory reads the seeds in
``fuzz/corpus/<surface>/`` and keeps what it learns in ``fuzz/.work/<target>/`` (new inputs are
never written among the seeds); a crashing input is saved as ``fuzz/.crashes/<target>-crash-*``.
``ACP_FUZZ_WORK=DIR`` puts ``.work`` and ``.crashes`` under DIR instead. Give directories or
files explicitly to override the corpus (a file: replay that one input).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

HERE = Path(__file__).parent


def run(test_one_input: Callable[[bytes], None], surface: str) -> None:
    """Fuzz ``test_one_input`` with the seeds of ``surface``; never returns."""
    name = Path(sys.argv[0]).stem
    base = Path(os.environ.get("ACP_FUZZ_WORK", HERE))
    args = list(sys.argv)
    if not any(not arg.startswith("-") for arg in args[1:]):
        work = base / ".work" / name
        work.mkdir(parents=True, exist_ok=True)
        args[1:1] = [str(work), str(HERE / "corpus" / surface)]
    if not any(arg.startswith("-artifact_prefix=") for arg in args):
        crashes = base / ".crashes"
        crashes.mkdir(parents=True, exist_ok=True)
        args.append(f"-artifact_prefix={crashes}/{name}-")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()
