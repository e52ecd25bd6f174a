"""The WebSocket bench Agent: ``python -m proxy.tools.bench.ws_agent`` (no arguments).

One process serves every connection opened to it, on one event loop. It prints its URL
(``ws://127.0.0.1:PORT/acp``) on stdout once listening, then answers every request on any
connection at once: ``_bench/stream`` (params ``{"count": N}``) first sends N ``session/update``
notifications, one text message each, then its answer ``{"sent": N}``, as the stdio Agent
(:mod:`.agent`) writes them; any other request is answered with ``{"ok": true, "echo": params}``;
notifications are ignored. It runs until it is terminated.

A stream's notifications are frames built once (:func:`~.messages.update_frames`) and written
to the connection's transport in one call, before the answer is sent through ``websockets``: a
message framed by ``websockets`` costs this Agent about 4 us, which capped ``direct`` near
270,000 a second, too close to the relays to show the Client's headroom.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence

import websockets
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import State

from proxy.tools.bench.messages import READ_LIMIT, STREAM_METHOD, echo_result, update_frames

__all__ = ["answer", "listen", "main", "serve_announced"]

USAGE = "usage: python -m proxy.tools.bench.ws_agent (no arguments: it prints its URL)"


def answer(data: str | bytes) -> tuple[int, str] | None:
    """What one message is answered with (None: nothing to answer): the count of notifications
    to send first (a stream's), and the answer."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return None
    params = message.get("params")
    count = 0
    if message["method"] == STREAM_METHOD:
        count = int((params or {}).get("count", 0))
        result: dict[str, object] = {"sent": count}
    else:
        result = echo_result(params)
    return count, json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})


async def listen() -> None:
    """Listen on a free loopback port, say where, answer every connection (see the module)."""

    async def answer_all(connection: ServerConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for data in connection:
                reply = answer(data)
                if reply is None:
                    continue
                count, result = reply
                if count:
                    if connection.protocol.state is not State.OPEN:
                        break  # closing: no data frame may follow a close frame
                    # Frames built once, written whole (see the module): nothing of
                    # websockets' is pending here, each of its events being flushed as made.
                    connection.transport.write(update_frames(count))
                await connection.send(result)

    await serve_announced(answer_all)


async def serve_announced(handler: Callable[[ServerConnection], Awaitable[None]]) -> None:
    """Serve ``handler`` on a free loopback port, print its URL on stdout, serve for ever."""
    async with serve(
        handler, "127.0.0.1", 0, compression=None, max_size=READ_LIMIT, ping_interval=None
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
