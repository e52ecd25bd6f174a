"""The floor of any relay written in Python:
``python -m proxy.tools.bench.relay [--protocol] [--] COMMAND ...``.

It copies lines between its stdio and ``COMMAND`` (spawned with piped stdin and stdout), and
nothing else: no parsing, no ids, no observers. Two ways, two bench targets:

* ``asyncio`` (the default): asyncio streams, a ``readline``, ``write`` and ``drain`` per line,
  as a relay is usually first written;
* ``asyncio-protocol`` (``--protocol``): asyncio protocols, every complete line of one read
  written in one call, the rest kept for the next read; reading pauses while the other side's
  buffer is above its high-water mark.

What remains of the proxy's added latency over these is the proxy's own work; what they add over
socat is the price of Python and asyncio. It exits with the command's status.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["main", "protocol_relay", "relay"]

USAGE = "usage: python -m proxy.tools.bench.relay [--protocol] [--] COMMAND [ARG ...]"
BUFFER = 1 << 26
"""Bytes of one line either side reads, at most."""


async def relay(command: Sequence[str]) -> int:
    """Copy lines both ways between stdio and ``command`` until both directions end."""
    loop = asyncio.get_running_loop()
    agent = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=BUFFER
    )
    assert agent.stdin is not None
    assert agent.stdout is not None
    reader = asyncio.StreamReader(limit=BUFFER)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def up() -> None:
        assert agent.stdin is not None
        while line := await reader.readline():
            agent.stdin.write(line)
            await agent.stdin.drain()
        agent.stdin.close()

    async def down() -> None:
        assert agent.stdout is not None
        while line := await agent.stdout.readline():
            writer.write(line)
            await writer.drain()

    await asyncio.gather(up(), down())
    return await agent.wait()


class _Lines(asyncio.Protocol):
    """One direction of :func:`protocol_relay`: the complete lines of each read, written in one
    call to ``sink``; reading pauses while the sink's buffer is full (:class:`_Sink`)."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.sink: asyncio.WriteTransport | None = None
        self.source: asyncio.ReadTransport | None = None
        self._partial = b""
        self._done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self.source = transport

    def data_received(self, data: bytes) -> None:
        assert self.sink is not None
        if self._partial:
            data, self._partial = self._partial + data, b""
        end = data.rfind(b"\n") + 1
        if end == len(data):
            self.sink.write(data)
        elif end:
            self.sink.write(data[:end])
            self._partial = data[end:]
        else:
            self._partial = data

    def eof_received(self) -> bool:
        assert self.sink is not None
        if self._partial:
            self.sink.write(self._partial)
        self.sink.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


class _Sink(asyncio.Protocol):
    """The writing end of one direction: pauses and resumes the reading end that feeds it."""

    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def pause_writing(self) -> None:
        assert self._lines.source is not None
        self._lines.source.pause_reading()

    def resume_writing(self) -> None:
        assert self._lines.source is not None
        self._lines.source.resume_reading()


async def protocol_relay(agent: subprocess.Popen[bytes]) -> int:
    """Copy lines both ways between stdio and ``agent``, spawned with piped stdin and stdout,
    with protocols (see the module)."""
    loop = asyncio.get_running_loop()
    up_done: asyncio.Future[None] = loop.create_future()
    down_done: asyncio.Future[None] = loop.create_future()
    up, down = _Lines(up_done), _Lines(down_done)
    up.sink, _ = await loop.connect_write_pipe(lambda: _Sink(up), agent.stdin)
    down.sink, _ = await loop.connect_write_pipe(lambda: _Sink(down), sys.stdout)
    await loop.connect_read_pipe(lambda: down, agent.stdout)
    await loop.connect_read_pipe(lambda: up, sys.stdin)
    await asyncio.gather(up_done, down_done)
    return await asyncio.to_thread(agent.wait)


def main(argv: Sequence[str]) -> int:
    """The process: ``--protocol`` or not, the command after an optional ``--`` (none: the
    usage on stderr, status 2)."""
    args = list(argv)
    protocols = args[:1] == ["--protocol"]
    if protocols:
        args = args[1:]
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        sys.stderr.write(USAGE + "\n")
        return 2
    if not protocols:
        return asyncio.run(relay(command))
    agent = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return asyncio.run(protocol_relay(agent))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
