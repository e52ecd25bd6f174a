"""``acp-proxy replay agent FILE``: an Agent that answers as the recorded one did.

It serves on stdio or, with ``--listen``, on WebSocket and Streamable HTTP, with the reference
Agent's serving code (:func:`proxy.tools.lab.agent.serve_connections`). Each connection reads
messages and asks :class:`proxy.core.replay.ReplayConnection` what to send; what it says goes out
in order, each message when it is due (its recorded offset over ``--speed``), also once the
Client stopped sending (stdin ended: what it is owed goes out, at its pace, then the replay
ends). What the replay did (a match, a request served again, one refused) is logged at info
level, on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.core.errors import at_least
from proxy.core.jsonrpc import Batch, ErrorCode, Invalid, Message, error_response, parse
from proxy.core.matching import Ignore
from proxy.core.recording import RecordingError
from proxy.core.replay import Outgoing, ReplayAgent, ReplayConnection
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger, shorten
from proxy.tools.lab.agent import ServedOptions, run_served, serve_connections
from proxy.tools.replay.files import load_replayable

__all__ = ["EXIT_BAD_RECORDING", "ReplayAgentOptions", "replay_agent_main", "serve_replay"]

log = get_logger("proxy.replay")

EXIT_BAD_RECORDING = 2
"""The exit status when the recording cannot be used (each problem on a line of stderr)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayAgentOptions(ServedOptions):
    """What ``acp-proxy replay agent`` replays, and how (where it serves: as the reference
    Agent)."""

    recording: Path
    ignore: tuple[str, ...] = ()
    strict_order: bool = False
    dedupe: bool = False
    speed: float = 1.0

    def __post_init__(self) -> None:
        ServedOptions.__post_init__(self)  # (a slotted dataclass has no zero-argument super())
        at_least("--speed", self.speed, 0)
        Ignore(self.ignore)  # each path checked now


def replay_agent_main(options: ReplayAgentOptions) -> int:
    """``acp-proxy replay agent``: serve the recording until stdin ends (stdio) or a signal; 2
    when the recording cannot be used, 1 when the address cannot be listened on."""
    try:
        recording = load_replayable(options.recording)
    except RecordingError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_BAD_RECORDING
    agent = ReplayAgent(
        recording,
        ignore=Ignore(options.ignore),
        strict_order=options.strict_order,
        dedupe=options.dedupe,
        speed=options.speed,
    )
    log.info(
        "replaying",
        recording=str(options.recording),
        messages=len(recording.messages),
        exchanges=len(agent.exchanges),
    )
    serve = functools.partial(
        serve_connections,
        options.listen,
        functools.partial(serve_replay, agent),
        max_message_bytes=options.max_message_bytes,
        tls=options.tls,
    )
    return run_served("replay agent", options.listen, lambda stop: serve(stop=stop))


async def serve_replay(agent: ReplayAgent, endpoint: Endpoint) -> None:
    """Serve one connection with the replayed Agent until it ends."""
    connection = agent.connection()
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    def later(outgoing: Outgoing) -> None:
        due.put_nowait((loop.time() + outgoing.delay, outgoing.raw))

    connection.on_later = later
    sender = loop.create_task(_send_when_due(endpoint, due))
    try:
        while (received := await endpoint.receive()) is not None:
            if isinstance(received, Message | Batch | Invalid):
                received = received.raw  # parsed by the HTTP listener: read as sent
            if not isinstance(received, bytes):
                continue  # an oversized message: skipped
            for outgoing in _handle(connection, received):
                later(outgoing)
            endpoint.processed(None)
        # The Client is done sending (stdin ended): what it is owed still goes out, at its pace,
        # unless sending fails (the connection is gone).
        owed = loop.create_task(due.join())
        await asyncio.wait({owed, sender}, return_when=asyncio.FIRST_COMPLETED)
        owed.cancel()
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        endpoint.close()
        with contextlib.suppress(Exception):
            await endpoint.wait_closed()


def _handle(connection: ReplayConnection, raw: bytes) -> list[Outgoing]:
    message = parse(raw)
    if isinstance(message, Invalid):
        if message.response:
            return []
        return [Outgoing(0.0, error_response(b"null", message.reason.error_code, message.detail))]
    if isinstance(message, Batch):
        code = ErrorCode.INVALID_REQUEST
        return [Outgoing(0.0, error_response(b"null", code, "batches are not supported"))]
    outgoing = connection.receive(message)
    for note in connection.notes:
        fields: dict[str, Any] = {"method": note.method, "line": note.line or None}
        if note.differences:
            first = note.differences[0]
            fields.update(path=first.path, recorded=shorten(first.recorded), got=shorten(first.got))
        (log.warning if note.what == "no match" else log.info)(f"replay: {note.what}", **fields)
    connection.notes.clear()
    return outgoing


async def _send_when_due(endpoint: Endpoint, due: asyncio.Queue[tuple[float, bytes]]) -> None:
    """Send what is queued, in order, each not before its time."""
    loop = asyncio.get_running_loop()
    while True:
        at, raw = await due.get()
        wait = at - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        endpoint.send(raw)
        await endpoint.drain()
        due.task_done()
