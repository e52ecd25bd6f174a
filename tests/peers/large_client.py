"""A Client that sends one large message and has one large message sent back, then goes idle.

Usage: ``python large_client.py TRANSPORT URL SIZE`` (``ws`` or ``http``), in front of a proxy
whose Agent is ``raw_agent.py``. Past ``initialize`` it sends a request of about SIZE bytes (the
Agent answers with its size), then has the Agent say a notification of about SIZE bytes, prints
``idle`` once both have been received whole, and keeps its connection open, reading nothing,
until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from test_no_data_dropped import client_wire


def padded(method: str, size: int, **fields: object) -> str:
    """A message of about ``size`` bytes."""
    return json.dumps({"jsonrpc": "2.0", **fields, "method": method, "params": {"pad": "x" * size}})


async def main(transport: str, url: str, size: int) -> None:
    async with client_wire(transport, None, url) as wire:  # type: ignore[arg-type]
        await wire.send(padded("_x/large", size, id="large").encode())
        answer = json.loads(await wire.receive())
        assert answer["result"]["size"] >= size, answer
        said = padded("_x/large_back", size)
        await wire.send(
            json.dumps(
                {"jsonrpc": "2.0", "method": "_test/say", "params": {"lines": [said]}}
            ).encode()
        )
        assert len(await wire.receive()) >= size
        del said, answer
        sys.stdout.write("idle\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
