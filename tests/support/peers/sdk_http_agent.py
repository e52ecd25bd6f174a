"""The scripted SDK Agent of ``sdk_agent.py``, served over Streamable HTTP and WebSocket; a script.

``python tests/support/peers/sdk_http_agent.py [--port N] [--path /acp] [--require-session-header]
[--tls-cert FILE --tls-key FILE]``

The official SDK's ASGI app (``acp.http.asgi.create_asgi_app``: POST, GET and DELETE for
Streamable HTTP and the WebSocket upgrade, all on one path) runs under uvicorn on 127.0.0.1,
HTTP/1.1 (h11) and the ``websockets`` sans-I/O WebSocket protocol. Every HTTP or WebSocket
connection gets its own :class:`ScriptedAgent`, so prompts behave as on stdio (``echo TEXT``,
``permission``, ``wait``, ``big N``, anything else: ``len=N sha256=HEX``; see ``sdk_agent.py``),
including the ids recorded for ``wait`` and ``_sdk_agent/state`` (one record for the process,
shared by all connections).

With ``--tls-cert`` and ``--tls-key`` (PEM) it serves HTTPS and WSS instead, and says so in its
``LISTENING https://...`` line.

With ``--require-session-header`` the app sits behind :class:`SessionHeaderGate`, which refuses
a POST without ``Acp-Session-Id`` as the TypeScript SDK's server does.

Once it accepts connections the script writes exactly one line to stdout,
``LISTENING http://127.0.0.1:PORT/acp`` (the port is chosen by the system unless ``--port`` is
given), and nothing else; logs, access lines included, go to stderr. It stops on SIGTERM or
SIGINT (exit status -15 or -2: uvicorn re-raises the signal), cutting open SSE streams and
WebSockets after ``--grace`` seconds (default 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, run as a script
from peers.sdk_agent import ScriptedAgent
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

HOST = "127.0.0.1"
SESSION_ID = b"acp-session-id"
ATTACHING = frozenset({"session/load", "session/resume"})
"""Methods that attach a session the SDK's server may not know yet on the connection."""


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


class SessionHeaderGate:
    """ASGI middleware: the TypeScript SDK server's rule on ``Acp-Session-Id`` in front of the
    Python SDK's app.

    A POST whose message has ``params.sessionId`` and no ``Acp-Session-Id`` is answered 400
    ``Missing Acp-Session-Id``, one whose header differs 400 ``Mismatched Acp-Session-Id``, as the
    TypeScript server answers them (the Python SDK's server requires the header for five methods
    only). The rest reaches the app unchanged, but for one thing: the Python SDK's server answers
    404 to a header naming a session it has not attached on the connection yet, which is every
    ``session/load`` and ``session/resume`` of a session made on another connection, so those two
    reach it without the header, once the gate has checked it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        received: list[Message] = []
        body = b""
        while True:
            event = await receive()
            received.append(event)
            if event["type"] != "http.request":
                break
            body += event.get("body", b"")
            if not event.get("more_body", False):
                break
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        params = message.get("params") if isinstance(message, dict) else None
        session = params.get("sessionId") if isinstance(params, dict) else None
        headers = [(name, value) for name, value in scope["headers"] if name != SESSION_ID]
        header = next((value for name, value in scope["headers"] if name == SESSION_ID), None)
        if isinstance(session, str):
            if header is None:
                await _refuse(send, "Missing Acp-Session-Id")
                return
            if header.decode("latin-1") != session:
                await _refuse(send, "Mismatched Acp-Session-Id")
                return
            assert isinstance(message, dict)
            if message.get("method") in ATTACHING:
                scope = {**scope, "headers": headers}

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"text/plain")],
            "trailers": False,
        }
    )
    await send({"type": "http.response.body", "body": text.encode(), "more_body": False})


class AnnouncingServer(uvicorn.Server):
    """A uvicorn server that writes ``LISTENING URL`` to stdout once it is listening."""

    def __init__(self, config: uvicorn.Config, path: str) -> None:
        super().__init__(config)
        self.path = path
        self.scheme = "https" if config.ssl_certfile else "http"

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        port = self.servers[0].sockets[0].getsockname()[1]
        sys.stdout.write(f"LISTENING {self.scheme}://{HOST}:{port}{self.path}\n")
        sys.stdout.flush()


def make_server(
    port: int = 0,
    path: str = "/acp",
    grace: int = 0,
    *,
    require_session_header: bool = False,
    tls: tuple[str, str] | None = None,
) -> AnnouncingServer:
    """uvicorn serving the SDK's ASGI app on ``HOST:port`` at ``path`` (behind
    :class:`SessionHeaderGate` when ``require_session_header``; in TLS with ``tls``, the
    certificate's and the key's files)."""
    app: ASGIApp = create_asgi_app(new_agent, path=path)
    if require_session_header:
        app = SessionHeaderGate(app)
    config = uvicorn.Config(
        app,
        host=HOST,
        port=port,
        http="h11",
        ws="websockets-sansio",
        ws_max_size=DEFAULT_MAX_MESSAGE_BYTES,  # any message the proxy passes
        lifespan="on",
        log_config=None,  # uvicorn's default config would print access lines to stdout
        timeout_graceful_shutdown=grace,  # SSE streams never end by themselves
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    return AnnouncingServer(config, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any)")
    parser.add_argument("--path", default="/acp", help="endpoint path (default: /acp)")
    parser.add_argument("--grace", type=int, default=0, help="seconds open streams get to end")
    parser.add_argument(
        "--require-session-header",
        action="store_true",
        help="refuse a POST with params.sessionId and no Acp-Session-Id (as the TS server does)",
    )
    parser.add_argument("--tls-cert", help="serve TLS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's key (PEM)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="sdk_http_agent: %(message)s")
    server = make_server(
        args.port,
        args.path,
        args.grace,
        require_session_header=args.require_session_header,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
    )
    asyncio.run(server.serve())
    if not server.started:
        sys.exit(1)


if __name__ == "__main__":
    main()
