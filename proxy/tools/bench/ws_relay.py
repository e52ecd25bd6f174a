"""The floor of any WebSocket relay written with ``websockets``:
``python -m proxy.tools.bench.ws_relay UPSTREAM_URL``.

It listens on a free loopback port and prints its URL (``ws://127.0.0.1:PORT/acp``) on stdout
once listening. For every Client connection it opens one connection to ``UPSTREAM_URL`` and
copies messages both ways, each as it came (text stays text), nothing parsed: no ids, no
observers, no ``Origin`` or ``Host`` checks. When either side closes, the other is closed. It
runs until it is terminated.

What the proxy adds over this one, on the WebSocket columns, is its own work; what this one adds
over ``direct`` is the price of ``websockets`` and asyncio on both legs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence

import websockets
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection

from proxy.tools.bench.messages import READ_LIMIT
from proxy.tools.bench.ws_agent import serve_announced

__all__ = ["listen", "main", "pipe"]

USAGE = "usage: python -m proxy.tools.bench.ws_relay UPSTREAM_URL (it prints its own URL)"


async def pipe(
    source: ServerConnection | ClientConnection, sink: ServerConnection | ClientConnection
) -> None:
    """Send on ``sink`` every message ``source`` receives, until either closes; then close both."""
    with contextlib.suppress(websockets.ConnectionClosed):
        async for message in source:
            await sink.send(message)
    await sink.close()
    await source.close()


async def listen(upstream: str) -> None:
    """Listen on a free loopback port, say where, relay every connection (see the module)."""

    async def relay(client: ServerConnection) -> None:
        async with connect(
            upstream, compression=None, max_size=READ_LIMIT, ping_interval=None, proxy=None
        ) as agent:
            await asyncio.gather(pipe(client, agent), pipe(agent, client))

    await serve_announced(relay)


def main(argv: Sequence[str]) -> int:
    """The process: the upstream URL, nothing else (else the usage on stderr, status 2)."""
    if len(argv) != 1 or not argv[0].startswith(("ws://", "wss://")):
        sys.stderr.write(USAGE + "\n")
        return 2
    asyncio.run(listen(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
