"""A third-party Client for ``acp-proxy check-client``'s tests: the official Python SDK's Client,
as its example client uses it (the example itself ships only in the SDK's sdist, not in the
installed package). It spawns its Agent, initializes, opens a session, sends one prompt with no
idempotency key (the SDK's released protocol, version 1, has none), prints the stop reason and
exits; it never resends: a lost answer leaves it waiting.

Run as ``python sdk_client.py TEXT -- AGENT_CMD ...``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process
from acp.schema import Implementation, TextContentBlock


class QuietClient:
    """A Client that ignores the Agent's updates (the reference Agent asks nothing else)."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None


async def main(text: str, agent: list[str]) -> int:
    async with spawn_agent_process(QuietClient(), agent[0], *agent[1:]) as (conn, _):  # type: ignore[arg-type]
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_info=Implementation(name="sdk-example-client", version="0"),
        )
        session = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        answer = await conn.prompt(
            session_id=session.session_id, prompt=[TextContentBlock(text=text)]
        )
        sys.stdout.write(f"stop reason: {answer.stop_reason}\n")
    return 0


if __name__ == "__main__":
    text, separator, *agent = sys.argv[1:]
    if separator != "--" or not agent:
        sys.exit("usage: sdk_client.py TEXT -- AGENT_CMD ...")
    sys.exit(asyncio.run(main(text, agent)))
