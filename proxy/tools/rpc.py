"""The tools' one JSON-RPC client: a connection to a peer, requests answered as futures.

check-agent (:mod:`proxy.tools.check_agent`) and the reference Client
(:mod:`proxy.tools.lab.client`) both talk to an Agent, or to the proxy in front of one, through
it; the reference Agent encodes its messages with :func:`encode`.

* :func:`connect` opens a ``ws://`` (WebSocket) or ``http://`` (Streamable HTTP) URL with the
  proxy's own transports; a command over stdio is :func:`~proxy.shell.transports.stdio.spawn_agent`.
* :class:`Peer` is one connection. Its reader task parses every message once, in arrival order:
  it goes first to ``on_message`` (the owner's record of what it saw), then an answer settles the
  future of its request, a request of the peer is refused with ``-32601`` (the tools offer no
  capabilities: no file system, terminals or permissions) unless the owner says otherwise, and
  every waiter of :meth:`Peer.until` whose predicate it matches gets it. What is not a JSON object
  (an oversized message, a line that does not parse) is logged and skipped.
* Once the connection ends, every pending request is answered ``None`` and every waiter too.

The bench (:mod:`proxy.tools.bench`) is the one tool that does not use it, on purpose: its
drivers are measuring instruments that time each round trip from the write to the answer read
in one task, with no reader task or futures between, reach the WebSocket proxy with another
stack (``websockets``) than the proxy's own, and share their messages with the bench Agents,
which stay standard-library processes (``tests/test_layering.py``).

Rules: ids of requests are integers (answers are matched by exact type and value, so ``1.0`` or
``true`` answer nothing); nothing here prints, logs go to the owner's logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Callable
from typing import Any

import orjson

from proxy.core.framing import Oversized
from proxy.core.jsonrpc import ErrorCode
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger, shorten
from proxy.shell.transports.http_upstream import connect_http
from proxy.shell.transports.websocket import connect_ws

__all__ = ["Answer", "Message", "NoAnswer", "Peer", "Predicate", "connect", "encode"]

Message = dict[str, Any]
"""A JSON-RPC message as parsed: a JSON object."""
Answer = Message | None
"""A response or error object, or ``None`` when the connection ended before it came."""
Predicate = Callable[[Message], bool]
"""A test of one message (:meth:`Peer.until`)."""


def encode(message: Message) -> bytes:
    """``message`` with ``"jsonrpc": "2.0"`` in front, as bytes for an endpoint."""
    return orjson.dumps({"jsonrpc": "2.0", **message})


async def connect(url: str, *, limit: int, tls: ssl.SSLContext | None = None) -> Endpoint:
    """A connection to ``url``: ``ws://`` or ``wss://`` a WebSocket, ``http://`` or ``https://``
    Streamable HTTP; ``limit`` bounds one incoming message; ``tls`` verifies a ``wss://`` or
    ``https://`` peer (default: the system's trust store)."""
    if url.startswith(("ws://", "wss://")):
        return await connect_ws(url, limit=limit, tls=tls)
    if url.startswith(("http://", "https://")):
        return await connect_http(url, limit=limit, tls=tls)
    raise ValueError(f"expected a ws:// or http:// URL, got {url!r}")


class NoAnswer(Exception):
    """A request got no answer: the connection ended first, or ``waited`` seconds passed."""

    def __init__(self, method: str, waited: float | None) -> None:
        self.method = method
        self.waited = waited
        """Seconds waited in vain; ``None`` when the connection ended first."""
        if waited is None:
            super().__init__(f"the connection ended during {method}")
        else:
            super().__init__(f"no answer to {method} in {waited:g} s")

    @property
    def ended(self) -> bool:
        """The connection ended before the answer came."""
        return self.waited is None


class Peer:
    """One JSON-RPC connection to a peer (see the module): requests by id, answers as futures,
    every message to ``on_message``; read by a task of its own until the connection ends."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        on_message: Callable[[Message], None] | None = None,
        refuse_requests: bool = True,
        log: Any = None,
    ) -> None:
        self.endpoint = endpoint
        self._on_message = on_message
        self._refuse_requests = refuse_requests
        self._log = log if log is not None else get_logger("proxy.rpc")
        self._pending: dict[int, asyncio.Future[Answer]] = {}
        self._waiters: list[tuple[Predicate, asyncio.Future[Answer]]] = []
        self._ids = itertools.count(1)
        self.ended = False
        """The connection has ended: nothing more will be read (or sent)."""
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def next_id(self) -> int:
        """A request id of this connection's own count (1, 2, ...)."""
        return next(self._ids)

    def send(self, message: Message) -> None:
        """Queue ``message`` (``jsonrpc`` added) for the peer."""
        self.endpoint.send(encode(message))

    def notify(self, method: str, params: Any) -> None:
        """Queue a notification."""
        self.send({"method": method, "params": params})

    def request(
        self, method: str, params: Any, *, request_id: int | None = None
    ) -> tuple[int, asyncio.Future[Answer]]:
        """Queue a request (``request_id``, or the next of :meth:`next_id`); its id and the future
        of its answer (``None`` if the connection ends first, at once when it has ended)."""
        if request_id is None:
            request_id = self.next_id()
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if self.ended:
            future.set_result(None)
            return request_id, future
        self._pending[request_id] = future
        self.send({"id": request_id, "method": method, "params": params})
        return request_id, future

    async def drain(self) -> None:
        """Wait until what is queued toward the peer is below the transport's high-water mark."""
        await self.endpoint.drain()

    async def call(
        self, method: str, params: Any, wait: float, *, request_id: int | None = None
    ) -> Message:
        """Send a request and wait ``wait`` seconds for its answer; :class:`NoAnswer` if none
        comes. The answer may still come later: it settles the request's future then."""
        _, future = self.request(method, params, request_id=request_id)
        await self.drain()
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), wait)
        except TimeoutError:
            raise NoAnswer(method, wait) from None
        if answer is None:
            raise NoAnswer(method, None)
        return answer

    async def until(self, predicate: Predicate, wait: float) -> Answer:
        """The next message to arrive that matches ``predicate``; ``None`` after ``wait`` seconds,
        or once the connection has ended."""
        if self.ended:
            return None
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        waiter = (predicate, future)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(wait):
                return await future
        except TimeoutError:
            return None
        finally:
            self._waiters.remove(waiter)

    def sever(self) -> None:
        """Cut the connection now, both ways, dropping what is queued."""
        self.endpoint.sever(flush=False)

    async def close(self, grace: float) -> None:
        """End the connection (a spawned command gets EOF, then signals), wait until it has
        closed, and give the reader ``grace`` seconds to finish (then it is cancelled).

        Requests still pending are never answered: their futures are cancelled.
        """
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self.ended:
            self.endpoint.sever(flush=False)
        else:
            self.endpoint.close()
        try:
            with contextlib.suppress(Exception):
                await self.endpoint.wait_closed()
            await asyncio.wait({self._reader}, timeout=grace)
        finally:
            if not self._reader.done():
                self._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reader

    # -- reading -------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while (received := await self.endpoint.receive()) is not None:
                if isinstance(received, Oversized):
                    self._log.warning(
                        "oversized message from the agent skipped", size=received.size
                    )
                    continue
                self._dispatch(received if isinstance(received, bytes) else received.raw)
        except Exception as exc:  # a transport failing in any way ends the connection
            self._log.warning("reading from the agent failed", error=str(exc))
        finally:
            self.ended = True
            for future in self._pending.values():
                if not future.done():
                    future.set_result(None)
            self._pending.clear()
            for _, waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _dispatch(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._log.warning("unparsable message from the agent skipped", data=shorten(data))
            return
        if not isinstance(message, dict):
            self._log.warning(
                "message from the agent that is not an object skipped", data=shorten(data)
            )
            return
        if self._on_message is not None:
            self._on_message(message)
        if "method" in message:
            method = message["method"]
            if "id" in message and self._refuse_requests:
                error = {"code": ErrorCode.METHOD_NOT_FOUND.value, "message": "method not found"}
                if isinstance(method, str):
                    error["message"] = f"method not found: {method}"
                self.send({"id": message["id"], "error": error})
        else:
            self._settle(message, data)
        for predicate, waiter in self._waiters:
            if not waiter.done() and predicate(message):
                waiter.set_result(message)

    def _settle(self, answer: Message, data: bytes) -> None:
        request_id = answer.get("id")
        if type(request_id) is not int:
            self._log.warning("answer with an id this Client never sent", data=shorten(data))
            return
        future = self._pending.pop(request_id, None)
        if future is None or future.done():
            self._log.warning("answer to an unknown request ignored", id=request_id)
            return
        future.set_result(answer)
