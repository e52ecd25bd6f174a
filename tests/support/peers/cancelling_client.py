"""A Client that breaks the RFD's cancel rules, for ``acp-proxy check-client``'s C6: after one
keyed prompt is answered it sends ``session/cancel`` twice for the same turn and
``$/cancel_request`` for the answered request's id (no longer pending), then exits.

Run as ``python cancelling_client.py -- AGENT_CMD ...``; it speaks JSON lines over the Agent's
stdio and waits for each answer (a bound of its own: it never hangs its checker).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

BOUND = 30.0
"""Seconds the whole conversation may take."""


async def main(agent: list[str]) -> int:
    process = await asyncio.create_subprocess_exec(
        *agent, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdin is not None
    assert process.stdout is not None
    reader, writer = process.stdout, process.stdin

    def send(message: dict[str, Any]) -> None:
        writer.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def call(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        send({"id": request_id, "method": method, "params": params})
        while True:
            line = await reader.readline()
            if not line:
                raise SystemExit(f"the Agent went away before answering {method}")
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return dict(message)

    async with asyncio.timeout(BOUND):
        await call(1, "initialize", {"protocolVersion": 2, "capabilities": {}})
        session = (await call(2, "session/new", {"cwd": "/", "mcpServers": []}))["result"]
        session_id = session["sessionId"]
        prompt = [{"type": "text", "text": "hello"}]
        key = str(uuid.uuid4())
        await call(
            3, "session/prompt", {"sessionId": session_id, "prompt": prompt, "idempotencyKey": key}
        )
        send({"method": "session/cancel", "params": {"sessionId": session_id}})
        send({"method": "session/cancel", "params": {"sessionId": session_id}})
        send({"method": "$/cancel_request", "params": {"requestId": 3}})
        await call(4, "session/close", {"sessionId": session_id})
    writer.close()
    await process.wait()
    return 0


if __name__ == "__main__":
    separator, *agent = sys.argv[1:]
    if separator != "--" or not agent:
        sys.exit("usage: cancelling_client.py -- AGENT_CMD ...")
    sys.exit(asyncio.run(main(agent)))
