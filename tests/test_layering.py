"""The layering of DESIGN 12, enforced by walking the folders of ``proxy/``.

* ``proxy/core/``: the sans-I/O core. It imports no I/O, clock or logging library, and nothing of
  the proxy outside the core.
* ``proxy/shell/``: the asyncio shell. It imports the core and itself, never the tools.
* ``proxy/tools/``: the programs built on the proxy (lab, check-agent, report, bench). They may
  import the core and the shell.
* The public faces at the top (``cli``, ``control``, ``pytest_plugin``, ``embedded``): the command
  line imports no tool until a command runs it (``acp-proxy run`` loads nothing of the tools).

The modules are parsed in a subprocess of their own: CPython 3.11 can fail to build an AST
("recursion depth mismatch") in a process where earlier tests recursed deeply (the fuzz tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest
from harness import ROOT

PACKAGE = ROOT / "proxy"

FORBIDDEN_IN_CORE = {
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
"""I/O, clocks and logging belong to the shell; time and randomness are passed into the core."""

ALLOWED = {
    "core": ("proxy.core",),
    "shell": ("proxy.core", "proxy.shell"),
    "tools": (
        *("proxy.core", "proxy.shell", "proxy.tools", "proxy.control"),
        *("proxy.__version__", "proxy.compiled_modules", "proxy.core_build"),  # the package's build
    ),
}
"""The parts of the proxy each layer may import from (the direction core <- shell <- tools)."""

_SCAN = textwrap.dedent(
    """
    import ast, json, sys
    from pathlib import Path
    found = {}
    for path in sorted(Path(sys.argv[1]).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top, lazy = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = {node.module} | {node.module + "." + a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            (top if node.col_offset == 0 else lazy).update(names)
        found[str(path.relative_to(sys.argv[1]))] = {
            "top": sorted(top),
            "lazy": sorted(lazy),
            "docstring": bool(ast.get_docstring(tree)),
        }
    print(json.dumps(found))
    """
)


@cache
def modules() -> dict[str, dict[str, object]]:
    """Each module of the package: its imports (at the top, and inside functions) and whether it
    has a docstring, read in a subprocess."""
    done = subprocess.run(
        [sys.executable, "-c", _SCAN, str(PACKAGE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found: dict[str, dict[str, object]] = json.loads(done.stdout)
    return found


def imports(path: str) -> list[str]:
    info = modules()[path]
    return [*info["top"], *info["lazy"]]  # type: ignore[misc]


def proxy_imports(path: str) -> list[str]:
    return [name for name in imports(path) if name == "proxy" or name.startswith("proxy.")]


def layer(path: str) -> str:
    return path.split("/", maxsplit=1)[0] if "/" in path else "face"


def test_the_layers_exist() -> None:
    """The folders the checks walk hold the modules (a move must not escape the checks)."""
    layers = {layer(path) for path in modules()}
    assert layers >= {"core", "shell", "tools", "face"}
    assert {"core/relay.py", "core/jsonrpc.py", "shell/link.py", "cli.py"} <= set(modules())


@pytest.mark.parametrize("kind", ["core", "shell", "tools"])
def test_imports_point_one_way(kind: str) -> None:
    """core <- shell <- tools: no module imports from a layer above its own."""
    for path in (p for p in modules() if layer(p) == kind):
        for name in proxy_imports(path):
            assert name.startswith(ALLOWED[kind]) or name == "proxy", (
                f"proxy/{path} ({kind}) imports {name}"
            )


def test_the_core_imports_no_io() -> None:
    """A core module imports no I/O, clock or logging library, even inside a function."""
    for path in (p for p in modules() if layer(p) == "core"):
        for name in imports(path):
            assert name.split(".")[0] not in FORBIDDEN_IN_CORE, f"proxy/{path} imports {name}"


def _printed(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (what it imports is what it loads)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_the_command_line_loads_no_tool_at_import() -> None:
    """``proxy.cli`` imports a tool only inside the command that runs it."""
    assert not [name for name in modules()["cli.py"]["top"] if name.startswith("proxy.tools")]  # type: ignore[attr-defined]
    loaded = _printed(
        "import sys, proxy.cli, proxy.shell.app; "
        "print(sorted(m for m in sys.modules if m.startswith('proxy.tools')))"
    )
    assert loaded == "[]"


@pytest.mark.parametrize("module", ["proxy.tools.bench.agent", "proxy.tools.bench.relay"])
def test_the_bench_processes_measured_are_standard_library_ones(module: str) -> None:
    """The bench's stdio Agent and its floor relay load nothing but the standard library, the
    sans-I/O core and the bench's own modules: their start-up and footprint are the baseline
    the proxy's are set against."""
    loaded = _printed(
        f"import sys; before = set(sys.modules); import {module}; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
        "- set(sys.stdlib_module_names)))"
    )
    assert loaded == "['proxy']"
    leaked = _printed(
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m.startswith('proxy.') and "
        "not m.startswith(('proxy.core', 'proxy.tools.bench')) and m != 'proxy.tools'))"
    )
    assert leaked == "[]"


@pytest.mark.parametrize("module", ["proxy.tools.bench.ws_agent", "proxy.tools.bench.ws_relay"])
def test_the_bench_websocket_processes_load_websockets_and_nothing_else(module: str) -> None:
    """The WebSocket Agent and its bare relay add ``websockets`` to the standard library, the
    core and the bench's own modules, nothing of the proxy's shell."""
    loaded = _printed(
        f"import sys; before = set(sys.modules); import {module}; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
        "- set(sys.stdlib_module_names)))"
    )
    assert loaded == "['proxy', 'websockets']"
    leaked = _printed(
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m.startswith('proxy.') and "
        "not m.startswith(('proxy.core', 'proxy.tools.bench')) and m != 'proxy.tools'))"
    )
    assert leaked == "[]"


def test_every_module_has_a_docstring() -> None:
    """Each module says at its top what it owns."""
    for path, info in modules().items():
        if Path(path).name == "__main__.py" or (PACKAGE / path).stat().st_size == 0:
            continue
        assert info["docstring"], f"proxy/{path} has no docstring"
