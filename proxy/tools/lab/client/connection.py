"""One connection of the reference Client to the Agent, and how it is made.

The Agent is reached through the tools' JSON-RPC client (:mod:`proxy.tools.rpc`): a command
spawned over stdio (started again for each connection), or a ``ws://`` or ``http://`` URL. On top
of it, a :class:`Connection` knows which ``session/resume`` is in flight, so that the updates
before its answer count as its replay, and hands every ``session/update`` to the session.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from proxy.core import acp
from proxy.shell.defaults import AGENT_EXIT_WAIT
from proxy.shell.endpoint import Endpoint, ExitReporter
from proxy.shell.log import get_logger
from proxy.shell.transports.stdio import spawn_agent
from proxy.tools.lab.client.report import Resume
from proxy.tools.rpc import Answer, Message, NoAnswer, Peer, connect

__all__ = ["Connection", "Failure", "Reach", "open_endpoint"]

log = get_logger("proxy.client")


class Failure(Exception):
    """The connection failed or did not answer in time: connect again and go on."""


class Reach(Protocol):
    """How to reach an Agent, as a tool's options say it (:class:`ClientOptions`, the replay
    client's)."""

    @property
    def agent_argv(self) -> tuple[str, ...]: ...
    @property
    def connect(self) -> str | None: ...
    @property
    def max_message_bytes(self) -> int: ...
    @property
    def grace(self) -> float: ...
    @property
    def tls(self) -> ssl.SSLContext | None: ...


async def open_endpoint(options: Reach, *, announce_exit: bool = True) -> Endpoint:
    """A new connection to the Agent: the command spawned over stdio, or the URL connected;
    :class:`Failure` saying why when it cannot be made. ``announce_exit`` false: a spawned Agent
    that fails is not logged (the caller says it)."""
    try:
        if options.connect is None:
            return await spawn_agent(
                options.agent_argv,
                limit=options.max_message_bytes,
                grace=options.grace,
                announce_exit=announce_exit,
            )
        return await connect(options.connect, limit=options.max_message_bytes, tls=options.tls)
    except Exception as exc:
        raise Failure(f"cannot connect: {exc}") from exc


class Connection:
    """One connection to the Agent: requests by id, answers as futures, updates to a callback."""

    def __init__(
        self,
        number: int,
        endpoint: Endpoint,
        on_update: Callable[[Connection, dict[str, Any]], None],
    ) -> None:
        self.number = number
        self._on_update = on_update
        self.resume: Resume | None = None
        """The resume in flight: updates before its answer are its replay."""
        self.replays = 0
        """Resumes sent on this connection: each replay is a stream of updates of its own."""
        self._resume_id: int | None = None
        self._endpoint = endpoint
        self.peer = Peer(endpoint, on_message=self._on_message, log=log)

    @property
    def lost(self) -> bool:
        """The connection has ended: nothing more will be read."""
        return self.peer.ended

    @property
    def replaying(self) -> bool:
        """A ``session/resume`` is in flight: the updates arriving now are its replay."""
        return self._resume_id is not None

    async def request(
        self, request_id: int, method: str, params: dict[str, Any]
    ) -> asyncio.Future[Answer]:
        """Send a request; return the future of its answer (``None`` if the connection ends)."""
        _, future = self.peer.request(method, params, request_id=request_id)
        if not future.done():
            await self.peer.drain()
        return future

    async def call(
        self, request_id: int, method: str, params: dict[str, Any], patience: float
    ) -> Message:
        """Send a request and wait for its answer; :class:`Failure` if none comes."""
        if method == acp.RESUME_SESSION:
            self._resume_id = request_id
        try:
            return await self.peer.call(method, params, patience, request_id=request_id)
        except NoAnswer as exc:
            raise Failure(f"{exc}{await self._why_ended()}") from None
        finally:
            if self._resume_id == request_id:
                self._resume_id = None

    async def _why_ended(self) -> str:
        """``": the agent exited with status 3"`` when the connection ended because its spawned
        Agent failed (its own stderr, above, says more); empty otherwise."""
        if not self.lost or not isinstance(self._endpoint, ExitReporter):
            return ""
        failure = await self._endpoint.failure(AGENT_EXIT_WAIT)
        return "" if failure is None else f": {failure}"

    def _on_message(self, message: Message) -> None:
        """Every message, in arrival order, before its answer settles a request."""
        if "method" not in message:
            request_id = message.get("id")
            if type(request_id) is int and request_id == self._resume_id:
                self._resume_id = None  # what follows is live again
        elif (
            message["method"] == acp.SESSION_UPDATE
            and "id" not in message
            and isinstance(message.get("params"), dict)
        ):
            self._on_update(self, message["params"])

    async def close(self, grace: float) -> None:
        """End the connection (a spawned command gets EOF, then signals) and stop reading.

        Requests still pending are never answered: their attempts stay ``pending``.
        """
        await self.peer.close(grace)
