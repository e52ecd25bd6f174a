"""The scripted SDK Agent of ``sdk_agent.py``, served over Streamable HTTP and WebSocket; a script.

``python tests/peers/sdk_http_agent.py [--port N] [--path /acp]``

The official SDK's ASGI app (``acp.http.asgi.create_asgi_app``: POST, GET and DELETE for
Streamable HTTP and the WebSocket upgrade, all on one path) runs under uvicorn on 127.0.0.1,
HTTP/1.1 (h11) and the ``websockets`` sans-I/O WebSocket protocol. Every HTTP or WebSocket
connection gets its own :class:`ScriptedAgent`, so prompts behave as on stdio (``echo TEXT``,
``permission``, ``wait``, ``big N``, anything else: ``len=N sha256=HEX``; see ``sdk_agent.py``),
including the ids recorded for ``wait`` and ``_sdk_agent/state`` (one record for the process,
shared by all connections).

Once it accepts connections the script writes exactly one line to stdout,
``LISTENING http://127.0.0.1:PORT/acp`` (the port is chosen by the system unless ``--port`` is
given), and nothing else; logs, access lines included, go to stderr. It stops on SIGTERM or
SIGINT (exit status -15 or -2: uvicorn re-raises the signal), cutting open SSE streams and
WebSockets after ``--grace`` seconds (default 0).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import cast

import uvicorn
from acp import Agent
from acp.agent.connection import AgentSideConnection
from acp.http.asgi import create_asgi_app
from acp.interfaces import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, run as a script
from peers.sdk_agent import STDIN_LIMIT, ScriptedAgent

HOST = "127.0.0.1"


RECORD = ScriptedAgent()
"""Never connected: holds the records (ids seen, prompts, ...) that every connection shares."""


class ConnectionAgent(ScriptedAgent):
    """:class:`ScriptedAgent` for one HTTP or WebSocket connection.

    Its records are :data:`RECORD`'s, so ``_sdk_agent/state`` tells what reached this process
    over all connections, as on stdio (ids from different connections may repeat). The SDK's HTTP
    server builds each ``AgentSideConnection`` itself and takes no observers, so the Agent hooks
    its observer onto the connection it is handed.
    """

    def __init__(self) -> None:
        super().__init__()
        for name, value in vars(RECORD).items():
            if isinstance(value, list | dict):
                setattr(self, name, value)

    def on_connect(self, conn: Client) -> None:
        super().on_connect(conn)
        cast(AgentSideConnection, conn)._conn.add_observer(self.observe)


def new_agent(conn: AgentSideConnection) -> Agent:
    """The agent factory: one fresh Agent per connection."""
    return cast(Agent, ConnectionAgent())


class AnnouncingServer(uvicorn.Server):
    """A uvicorn server that writes ``LISTENING URL`` to stdout once it is listening."""

    def __init__(self, config: uvicorn.Config, path: str) -> None:
        super().__init__(config)
        self.path = path

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        port = self.servers[0].sockets[0].getsockname()[1]
        sys.stdout.write(f"LISTENING http://{HOST}:{port}{self.path}\n")
        sys.stdout.flush()


def make_server(port: int = 0, path: str = "/acp", grace: int = 0) -> AnnouncingServer:
    """uvicorn serving the SDK's ASGI app on ``HOST:port`` at ``path``."""
    config = uvicorn.Config(
        create_asgi_app(new_agent, path=path),
        host=HOST,
        port=port,
        http="h11",
        ws="websockets-sansio",
        ws_max_size=STDIN_LIMIT,
        lifespan="on",
        log_config=None,  # uvicorn's default config would print access lines to stdout
        timeout_graceful_shutdown=grace,  # SSE streams never end by themselves
    )
    return AnnouncingServer(config, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any)")
    parser.add_argument("--path", default="/acp", help="endpoint path (default: /acp)")
    parser.add_argument("--grace", type=int, default=0, help="seconds open streams get to end")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="sdk_http_agent: %(message)s")
    server = make_server(args.port, args.path, args.grace)
    asyncio.run(server.serve())
    if not server.started:
        sys.exit(1)


if __name__ == "__main__":
    main()
