"""acp-fault-proxy: a fault-injecting JSON-RPC relay for the Agent Client Protocol.

The package is layered, one folder a layer, imports pointing one way (core <- shell <- tools):

* :mod:`proxy.core`: the sans-I/O core. Where a message goes is :mod:`proxy.core.relay`; which
  faults fire is :mod:`proxy.core.engine`. No asyncio, sockets, clocks or logging.
* :mod:`proxy.shell`: the asyncio shell that drives it: links, transports, the listener, the
  control API, metrics, the trace; :mod:`proxy.shell.app` wires a run.
* :mod:`proxy.tools`: the programs built on it: the retry lab, check-agent, report, bench.

The public faces are at the top: :mod:`proxy.cli` (the ``acp-proxy`` command),
:mod:`proxy.control` (a client of the control API), :mod:`proxy.pytest_plugin` and
:mod:`proxy.embedded` (a proxy in the background of a test).
"""

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

__all__ = ["__version__", "compiled_modules", "core_build"]

__version__ = "0.1.0"


def compiled_modules() -> list[str]:
    """The modules this installation runs compiled, by dotted name (the optional build of the
    core with mypyc: ``HATCH_BUILD_HOOK_ENABLE_MYPYC=1 pip install .``); empty when it is all
    pure Python. An extension module beside its source is what Python imports."""
    root = Path(__file__).parent
    return sorted(
        {
            ".".join(("proxy", *path.relative_to(root).parent.parts, path.name.split(".")[0]))
            for suffix in EXTENSION_SUFFIXES
            for path in root.rglob(f"*{suffix}")
            if path.with_name(path.name.split(".")[0] + ".py").exists()
        }
    )


def core_build() -> str:
    """How this installation runs the core, in words (``--version``, the bench's report)."""
    compiled = compiled_modules()
    return f"core compiled with mypyc ({len(compiled)} modules)" if compiled else "pure Python"
