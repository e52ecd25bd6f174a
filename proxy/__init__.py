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

__all__ = ["__version__"]

__version__ = "0.1.0"
