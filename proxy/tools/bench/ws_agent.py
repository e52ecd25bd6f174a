"""The WebSocket bench Agent: ``python -m proxy.tools.bench.ws_agent`` (no arguments).

One process serves every connection the proxy opens to it, on one event loop. It prints its URL
(``ws://127.0.0.1:PORT/acp``) on stdout once listening, then answers every request on any
connection with ``{"ok": true, "echo": params}``; notifications are ignored. It runs until it is
terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Sequence

import websockets
from websockets.asyncio.server import ServerConnection, serve

from proxy.tools.bench.messages import READ_LIMIT, echo_result

__all__ = ["answer", "listen", "main"]

USAGE = "usage: python -m proxy.tools.bench.ws_agent (no arguments: it prints its URL)"


def answer(data: str | bytes) -> str | None:
    """The answer to one message (``None``: nothing to answer)."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return None
    result = echo_result(message.get("params"))
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})


async def listen() -> None:
    """Listen on a free loopback port, say where, answer every connection (see the module)."""

    async def answer_all(connection: ServerConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for data in connection:
                reply = answer(data)
                if reply is not None:
                    await connection.send(reply)

    async with serve(
        answer_all, "127.0.0.1", 0, compression=None, max_size=READ_LIMIT, ping_interval=None
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        sys.stdout.write(f"ws://127.0.0.1:{port}/acp\n")
        sys.stdout.flush()
        await server.serve_forever()


def main(argv: Sequence[str]) -> int:
    """The process: no arguments (else the usage on stderr, status 2)."""
    if argv:
        sys.stderr.write(USAGE + "\n")
        return 2
    asyncio.run(listen())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
