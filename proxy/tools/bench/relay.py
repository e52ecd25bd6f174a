"""The floor of any relay written in Python: ``python -m proxy.tools.bench.relay [--] COMMAND ...``.

It copies lines between its stdio and ``COMMAND`` (spawned with piped stdin and stdout), with
asyncio streams, and nothing else: no parsing, no ids, no observers. What remains of the proxy's
added latency over this is the proxy's own work; what this adds over socat is the price of Python
and asyncio. It exits with the command's status.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

__all__ = ["main", "relay"]

USAGE = "usage: python -m proxy.tools.bench.relay [--] COMMAND [ARG ...]"
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


def main(argv: Sequence[str]) -> int:
    """The process: the command after an optional ``--`` (none: the usage on stderr, status 2)."""
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        sys.stderr.write(USAGE + "\n")
        return 2
    return asyncio.run(relay(command))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
