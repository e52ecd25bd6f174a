"""The layering of DESIGN 12, enforced: the sans-I/O core imports no I/O, clock or logging library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_core_module_exists() -> None:
    """The list of core modules names real files (a renamed module must not escape the check)."""
    assert {path.stem for path in PACKAGE.glob("*.py")} >= CORE


@pytest.mark.parametrize("module", sorted(CORE))
def test_core_module_imports_no_io(module: str) -> None:
    """A core module imports neither an I/O library nor a shell module of the proxy."""
    for name in imported_modules(PACKAGE / f"{module}.py"):
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"proxy/{module}.py imports {name}"
        if top == "proxy":
            assert name.removeprefix("proxy.") in CORE, (
                f"proxy/{module}.py imports shell module {name}"
            )


def test_every_module_has_a_docstring() -> None:
    """Each module says at its top what it owns."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py" or path.stat().st_size == 0:
            continue
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no docstring"
