"""The targets (``proxy.tools.bench.targets``): their commands, and the rule set of
``proxy+rules``."""

from __future__ import annotations

import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from proxy.shell.fault_files import load_fault_files
from proxy.tools.bench import RULES, BenchOptions
from proxy.tools.bench.targets import pure_copy, target_argv


def test_the_rule_set_is_a_valid_fault_file(tmp_path: Path) -> None:
    """``proxy+rules`` loads a realistic rule set, seeded."""
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    loaded = load_fault_files([path])
    rules, seed = loaded.rules, loaded.seed
    assert len(rules) >= 5
    assert seed is not None


def test_the_asyncio_target_is_the_relay_in_front_of_the_agent(tmp_path: Path) -> None:
    """Each of the bench's own processes is a module of the package, run with ``-m``."""
    options = BenchOptions(python="py", socat="/usr/bin/socat")
    agent = ["py", "-m", "proxy.tools.bench.agent"]
    assert target_argv("direct", options, tmp_path) == agent
    assert target_argv("asyncio", options, tmp_path) == [
        "py", "-m", "proxy.tools.bench.relay", "--", *agent
    ]  # fmt: skip
    assert target_argv("socat", options, tmp_path)[-1] == "EXEC:py -m proxy.tools.bench.agent"
    assert target_argv("proxy+rules", options, tmp_path)[-6:] == ["--seed", "1", "--", *agent]


def test_the_pure_target_runs_the_package_without_its_compiled_modules(tmp_path: Path) -> None:
    """``proxy-pure`` imports a copy of the installed package that holds its sources and none of
    its compiled modules: whatever the installed build, that copy is pure Python."""
    folder = pure_copy(tmp_path)
    assert (folder / "proxy" / "core" / "relay.py").is_file()
    assert not [p for s in EXTENSION_SUFFIXES for p in (folder / "proxy").rglob(f"*{s}")]
    argv = target_argv("proxy-pure", BenchOptions(python=sys.executable), tmp_path, pure=folder)
    assert argv[:2] == ["env", f"PYTHONPATH={folder}"]
    assert argv[2:4] == [sys.executable, "-P"]  # not the working directory's package
    code = "import proxy; print(proxy.__file__, proxy.compiled_modules())"
    done = subprocess.run([*argv[:4], "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(folder / "proxy" / "__init__.py"), "[]"]
