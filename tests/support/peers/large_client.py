"""A Client that sends one large message and has one large message sent back, then goes idle.

Usage: ``python large_client.py TRANSPORT URL SIZE AGENT`` (TRANSPORT ``ws`` or ``http``), in front
of a proxy whose Agent is ``raw_agent.py`` (AGENT ``raw``) or ``flood_agent.py`` (``flood``). Past
``initialize`` it sends a message of about SIZE bytes and has the Agent send one back (``raw``: a
request the Agent answers with its size, then a ``_test/say`` of a notification of SIZE bytes;
``flood``: a ``_flood/send`` of one item, then an item of its own, the last message each way);
it prints ``idle`` once it has received what it asked for, whole, and keeps its connection open,
reading nothing, until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from wires import Wire, client_wire

from peers.flood_agent import flood_item


def padded(method: str, size: int, **fields: object) -> str:
    """A message of about ``size`` bytes."""
    return json.dumps({"jsonrpc": "2.0", **fields, "method": method, "params": {"pad": "x" * size}})


def compact(message: Mapping[str, object]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


async def with_raw_agent(wire: Wire, size: int) -> None:
    await wire.send(padded("_x/large", size, id="large").encode())
    answer = json.loads(await wire.receive())
    assert answer["result"]["size"] >= size, answer
    said = padded("_x/large_back", size)
    await wire.send(compact({"jsonrpc": "2.0", "method": "_test/say", "params": {"lines": [said]}}))
    assert len(await wire.receive()) >= size


async def with_flood_agent(wire: Wire, size: int) -> None:
    flood = {"jsonrpc": "2.0", "method": "_flood/send", "params": {"count": 1, "size": size}}
    await wire.send(compact(flood))
    assert await wire.receive() == flood_item(0, size)
    await wire.send(flood_item(0, size))  # the last message each way is a large one


async def main(transport: str, url: str, size: int, agent: str) -> None:
    async with client_wire(transport, None, url) as wire:  # type: ignore[arg-type]
        await (with_raw_agent if agent == "raw" else with_flood_agent)(wire, size)
        sys.stdout.write("idle\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
