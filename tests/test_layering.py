"""The layering of DESIGN 12, enforced: the sans-I/O core imports no I/O, clock or logging library.

The package is parsed by a fresh interpreter (this file run as a script), not in the test process:
in CPython 3.11, ``ast.parse`` fails with ``SystemError: AST constructor recursion depth
mismatch`` when the garbage collector runs, in the middle of it, a finalizer that parses Python
too (3.11 formats a traceback with ``ast``: an asyncio task that failed unretrieved, left by an
earlier test, logs one when it is collected). In the test process the result of these checks
would depend on the tests that ran before them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT

PACKAGE = Path(__file__).parent.parent / "proxy"

CORE = {
    "commands",
    "errors",
    "events",
    "faultfile",
    "faults",
    "framing",
    "idmap",
    "jsonrpc",
    "ledger",
    "relay",
    "splice",
}
"""Modules of the sans-I/O core: pure functions and state machines, driven by the shells."""

FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "logging",
    "prometheus_client",
    "selectors",
    "socket",
    "structlog",
    "subprocess",
    "threading",
    "time",
    "typer",
    "websockets",
}
"""I/O, clocks and logging belong to the shells; time and randomness are passed into the core."""


def imported_modules(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def parse_package(package: Path) -> dict[str, dict[str, Any]]:
    """Each module of ``package`` by its path in it: what it imports, whether it has a docstring."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        modules[path.relative_to(package).as_posix()] = {
            "imports": sorted(imported_modules(tree)),
            "docstring": ast.get_docstring(tree) is not None,
        }
    return modules


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict[str, Any]]:
    """:func:`parse_package` of the proxy, run by a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, __file__, str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return modules


def test_every_core_module_exists() -> None:
    """The list of core modules names real files (a renamed module must not escape the check)."""
    assert {path.stem for path in PACKAGE.glob("*.py")} >= CORE


def test_every_module_is_parsed(parsed: dict[str, dict[str, Any]]) -> None:
    """The fresh interpreter read every file of the package."""
    assert set(parsed) == {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("module", sorted(CORE))
def test_core_module_imports_no_io(parsed: dict[str, dict[str, Any]], module: str) -> None:
    """A core module imports neither an I/O library nor a shell module of the proxy."""
    for name in parsed[f"{module}.py"]["imports"]:
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"proxy/{module}.py imports {name}"
        if top == "proxy":
            assert name.removeprefix("proxy.") in CORE, (
                f"proxy/{module}.py imports shell module {name}"
            )


def test_every_module_has_a_docstring(parsed: dict[str, dict[str, Any]]) -> None:
    """Each module says at its top what it owns."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py" or path.stat().st_size == 0:
            continue
        assert parsed[path.relative_to(PACKAGE).as_posix()]["docstring"], f"{path} has no docstring"


if __name__ == "__main__":
    sys.stdout.write(json.dumps(parse_package(Path(sys.argv[1]))))
