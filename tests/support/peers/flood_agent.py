"""An Agent for the stalled-peer tests: floods the Client on request, or stops reading.

Usage: ``python flood_agent.py [--listen stdio|ws://HOST:PORT/PATH|http://HOST:PORT/PATH]
[--byte-reads]`` (stdio by default; on a network address it serves one WebSocket, or one
Streamable HTTP connection, and logs ``{"event": "listening", "url": ...}`` with the bound port;
``--byte-reads``: over stdio, it reads one byte per ``read``). It logs JSON lines to stderr.

* ``initialize`` (request): answered ``{"protocolVersion": 1}``;
* ``_flood/send`` (notification), params ``{"count": n, "size": bytes}`` or ``{"sizes": [bytes,
  ...]}``: writes ``n`` messages :func:`flood_item` (or one of each size) toward the Client,
  logging ``{"event": "flood written", "n": k}`` after each write returned (a write that waits
  for the proxy is a writer held back);
* ``_flood/stall`` (notification): reads nothing more until the process gets SIGUSR1 (logs
  ``agent stopped reading``, then ``agent reads again``);
* ``_flood/item`` (notification) from the Client: counted, and compared with :func:`flood_item`
  (in order, byte for byte);
* ``_flood/count`` (request): answered ``{"received": k, "intact": bool}``: how many items came,
  and whether each was the next one, unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

PATTERN = 'héllo wörld → ✓ "quoted" \\ back\tslash 0123456789 '
"""Multi-byte characters and escapes, so that a split anywhere cuts one of them."""


def flood_item(n: int, size: int) -> bytes:
    """Item ``n`` of a flood: a ``_flood/item`` notification of ``size`` bytes (a few less where
    that would cut a character or an escape; never less than its fixed part)."""
    head = b'{"jsonrpc":"2.0","method":"_flood/item","params":{"n":%d,"pad":"' % n
    tail = b'"}}'
    body = json.dumps(PATTERN, ensure_ascii=False)[1:-1].encode()
    room = max(size - len(head) - len(tail), 0)
    pad = (body * (room // len(body) + 1))[:room]
    while True:  # never cut an escape or a character in two
        try:
            text = pad.decode()
        except UnicodeDecodeError:
            pad = pad[:-1]
            continue
        if (len(pad) - len(pad.rstrip(b"\\"))) % 2:
            pad = pad[:-1]
            continue
        json.loads(f'"{text}"')
        return head + pad + tail


def sizes(params: dict[str, Any]) -> list[int]:
    """The sizes of the items ``_flood/send`` asks for."""
    return list(params.get("sizes") or [params["size"]] * params["count"])


def log(event: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stderr.flush()


class Counter:
    """What the Client sent: how many items, and whether each was the expected one."""

    def __init__(self) -> None:
        self.received = 0
        self.intact = True

    def item(self, line: bytes, params: dict[str, Any]) -> None:
        expected = flood_item(self.received, len(line))
        self.intact = self.intact and params.get("n") == self.received and line == expected
        self.received += 1


def answer(message: dict[str, Any], result: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()


def handle(line: bytes, counter: Counter, write: Callable[[bytes], None]) -> dict[str, Any]:
    """Act on one message (but ``_flood/send`` and ``_flood/stall``); return it parsed."""
    message: dict[str, Any] = json.loads(line)
    method = message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        write(answer(message, {"protocolVersion": 1}))
    elif method == "_flood/item":
        counter.item(line, params)
    elif method == "_flood/count":
        write(answer(message, {"received": counter.received, "intact": counter.intact}))
    return message


def byte_lines() -> Iterator[bytes]:
    """Standard input's lines, read one byte per ``read``."""
    line = bytearray()
    while byte := os.read(0, 1):
        line += byte
        if byte == b"\n":
            yield bytes(line)
            line.clear()


def run_stdio(byte_reads: bool) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    counter = Counter()
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data + b"\n")
        out.flush()

    for raw in byte_lines() if byte_reads else sys.stdin.buffer:
        message = handle(raw.rstrip(b"\n"), counter, write)
        params = message.get("params") or {}
        if message.get("method") == "_flood/send":
            for n, size in enumerate(sizes(params)):
                write(flood_item(n, size))
                log("flood written", n=n)
        elif message.get("method") == "_flood/stall":
            log("agent stopped reading")
            signal.sigwait({signal.SIGUSR1})
            log("agent reads again")


class Network:
    """One Client connection over WebSocket or Streamable HTTP (the proxy's link)."""

    def __init__(self) -> None:
        self.counter = Counter()
        self.reading = asyncio.Event()
        self.reading.set()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.resume)
        self.tasks: set[asyncio.Task[None]] = set()

    def resume(self) -> None:
        log("agent reads again")
        self.reading.set()

    async def receive(self, line: bytes, send: Callable[[bytes], Any]) -> None:
        """Act on one message; ``send`` writes one message toward the Client (awaitable)."""
        await self.reading.wait()
        pending: list[bytes] = []
        message = handle(line, self.counter, pending.append)
        for data in pending:
            await send(data)
        params = message.get("params") or {}
        if message.get("method") == "_flood/send":
            task = asyncio.get_running_loop().create_task(self.flood(params, send))
            self.tasks.add(task)
        elif message.get("method") == "_flood/stall":
            log("agent stopped reading")
            self.reading.clear()

    @staticmethod
    async def flood(params: dict[str, Any], send: Callable[[bytes], Any]) -> None:
        for n, size in enumerate(sizes(params)):
            await send(flood_item(n, size))
            log("flood written", n=n)


async def serve_ws(host: str, port: int, path: str) -> None:
    import websockets

    network = Network()

    async def connection(ws: Any) -> None:
        async def send(data: bytes) -> None:
            await ws.send(data.decode())

        async for frame in ws:
            await network.receive(frame.encode() if isinstance(frame, str) else frame, send)

    async with websockets.serve(
        connection, host, port, max_size=None, max_queue=1, compression=None
    ) as server:
        bound = server.sockets[0].getsockname()[1]
        log("listening", url=f"ws://{host}:{bound}{path}")
        await asyncio.Future()


async def serve_http(host: str, port: int, path: str) -> None:
    from aiohttp import web

    network = Network()
    connection_id = secrets.token_hex(8)
    outgoing: asyncio.Queue[bytes] = asyncio.Queue(1)

    async def send(data: bytes) -> None:
        await outgoing.put(data)

    async def post(request: web.Request) -> web.StreamResponse:
        line = await request.read()
        if json.loads(line).get("method") == "initialize":
            body: list[bytes] = []
            handle(line, network.counter, body.append)
            return web.Response(
                body=body[0],
                content_type="application/json",
                headers={"Acp-Connection-Id": connection_id},
            )
        await network.receive(line, send)
        return web.Response(status=202)

    async def get(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while True:
            data = await outgoing.get()
            await response.write(b"data: " + data + b"\n\n")

    async def delete(request: web.Request) -> web.StreamResponse:
        return web.Response(status=202)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post(path, post)
    app.router.add_get(path, get)
    app.router.add_delete(path, delete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound = runner.addresses[0][1]
    log("listening", url=f"http://{host}:{bound}{path}")
    await asyncio.Future()


def main() -> int:
    listen = sys.argv[sys.argv.index("--listen") + 1] if "--listen" in sys.argv else "stdio"
    if listen == "stdio":
        run_stdio("--byte-reads" in sys.argv)
        return 0
    scheme, rest = listen.split("://", 1)
    address, _, path = rest.partition("/")
    host, _, port = address.rpartition(":")
    serve = serve_ws if scheme == "ws" else serve_http
    asyncio.run(serve(host, int(port), "/" + path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
