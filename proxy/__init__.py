"""acp-fault-proxy: a fault-injecting JSON-RPC relay for the Agent Client Protocol.

The package is layered. The sans-I/O core (``jsonrpc``, ``splice``, ``framing``, ``events``,
``commands``, ``idmap``, ``relay``) never touches asyncio, sockets, clocks or logging; the
shells (``link``, ``transports``) drive it; ``app`` wires a run and ``cli`` parses the command line.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
