"""The TCP side of the proxy's HTTP servers (the listener, the control API): the time a connection
has to send its request head, and what happens when file descriptors run out.

**Header time.** Each accepted connection has ``header_timeout`` seconds to send a complete first
request head (the request reaching the application is the proof: :meth:`HeadGuard.middleware`,
the first middleware of each server, sees it); past that it is closed, whether it sent nothing or
half a request line (a slowloris). Every later head on a keep-alive connection is bounded by
aiohttp itself, given ``keepalive_timeout=header_timeout``: a connection waiting longer than that
for its next request head after a response is closed, bytes of a partial head or not, so an idle
keep-alive socket is closed after as long. A request whose head has arrived (a long SSE stream, a
WebSocket) is never cut by either. The heads themselves are bounded by aiohttp's parser (lines of
8,190 bytes, 128 headers). On a site in TLS the handshake comes first, and has ``header_timeout``
too (asyncio's ``ssl_handshake_timeout`` closes a connection that has not completed it); the
head's clock runs from the accept all the same.

**Descriptors.** When ``accept()`` fails for want of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM),
asyncio stops accepting on that socket for a second and tries again, reporting every failure to
the loop's exception handler as a traceback (a round of up to 128 failures a second).
:func:`_on_loop_error`, installed once per loop in front of the handler there was, takes those of
a guarded socket instead: the first is one warning line (the next one only once a few seconds
have passed without a failure, which is logged too), each round is counted and closes the oldest
connection of that server still waiting for its first head, to give its descriptor back.
Connections already serving go on.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import ssl
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy.shell.hostport import authority, url_scheme
from proxy.shell.limits import LimitName, LimitReached, Where
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer

__all__ = ["GuardedSite", "HeadGuard"]

log = get_logger("proxy.serving")

OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The ``accept()`` errors asyncio retries after a pause (``_accept_connection``)."""

ROUND = 0.5
"""Seconds within which failed ``accept()`` calls are one round: asyncio makes them back to back,
and pauses a second between rounds."""

RECOVERED = 3.0
"""Seconds without a failed round of ``accept()`` after which descriptors are no longer short
(asyncio tries again every second while they are)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HeadGuard:
    """The connections of one server still waiting for their first request head."""

    def __init__(self, where: Where, header_timeout: float, observer: Observer | None) -> None:
        self.where: Where = where
        self.header_timeout = header_timeout
        self._observer = observer
        self._waiting: dict[RequestHandler, asyncio.TimerHandle] = {}
        """Oldest first (insertion order), each with the timer that closes it."""
        self._logged_timeout = False
        self._last_round = -ROUND
        self._recovery: asyncio.TimerHandle | None = None
        """While descriptors are short: the timer that says they are no more (see
        :meth:`out_of_descriptors`)."""

    def accepted(self, handler: RequestHandler) -> None:
        """A connection was accepted (its protocol made): its head's clock starts."""
        loop = asyncio.get_running_loop()
        self._waiting[handler] = loop.call_later(self.header_timeout, self._expired, handler)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A request head arrived on its connection: that connection's clock stops."""
        timer = self._waiting.pop(request.protocol, None)
        if timer is not None:
            timer.cancel()
        return await handler(request)

    def _expired(self, handler: RequestHandler) -> None:
        if self._waiting.pop(handler, None) is None or handler.transport is None:
            return  # its head arrived, or the peer left (or a 400 for a bad head closed it)
        handler.force_close()
        self._observe("header_time")
        if not self._logged_timeout:
            self._logged_timeout = True
            log.warning(
                "connection closed: no request head within --header-timeout",
                server=self.where,
                header_timeout_s=self.header_timeout,
                further="counted, not logged",
            )

    def out_of_descriptors(self, exc: OSError) -> None:
        """An ``accept()`` of this server failed for want of descriptors: once per round of
        failures (asyncio tries ``accept()`` up to its backlog's length in a row, each failing,
        then pauses), it is counted and one connection is shed. The first round is logged; the
        shortage is over (logged too) once :data:`RECOVERED` seconds pass without a round, and
        only then is the next one logged: a shed connection's descriptor, taken by the next
        accepted connection, does not end it."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._last_round < ROUND:
            return
        self._last_round = now
        self._observe("descriptors")
        if self._recovery is not None:
            self._recovery.cancel()
        else:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.warning(
                "out of file descriptors: new connections wait",
                server=self.where,
                error=exc.strerror or str(exc),
                open_files_limit=soft,
            )
        self._recovery = loop.call_later(RECOVERED, self._recovered)
        self._shed()

    def _recovered(self) -> None:
        self._recovery = None
        log.info("accepting connections again", server=self.where)

    def _shed(self) -> None:
        """Close the oldest connection still waiting for its first head (its descriptor is the
        cheapest to give back: it has asked for nothing)."""
        while self._waiting:
            handler = next(iter(self._waiting))
            self._waiting.pop(handler).cancel()
            if handler.transport is not None:
                handler.force_close()
                return

    def forget(self) -> None:
        """The server stopped: no clock runs any more."""
        if self._recovery is not None:
            self._recovery.cancel()
            self._recovery = None
        for timer in self._waiting.values():
            timer.cancel()
        self._waiting.clear()

    def _observe(self, limit: LimitName) -> None:
        if self._observer is not None:
            self._observer.observe(LimitReached(limit, self.where))


class GuardedSite(web.BaseSite):
    """A TCP site whose connections a :class:`HeadGuard` watches (see the module); in TLS with
    ``tls``, each connection's handshake bounded by the guard's ``header_timeout`` too."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: HeadGuard,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=tls)
        self._host = host
        self._port = port
        self._guard = guard
        self._fds: list[int] = []

    @property
    def name(self) -> str:
        """The site's URL."""
        scheme = url_scheme("http", secure=self._ssl_context is not None)
        return f"{scheme}://{authority(self._host, self._port)}"

    async def start(self, *, serve: bool = True) -> None:
        """Bind (with ``SO_REUSEADDR``) and serve (``serve`` false: listen, and leave the
        connections waiting until :meth:`serve`)."""
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = self._guard

        def accepted() -> asyncio.BaseProtocol:
            handler = server()
            guard.accepted(handler)
            return handler

        self._server = await loop.create_server(
            accepted,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
            start_serving=serve,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._guard.header_timeout if self._ssl_context else None,
        )
        self._fds = [sock.fileno() for sock in self._server.sockets]
        guards = _guards_of(loop)
        for fd in self._fds:
            guards[fd] = guard

    async def serve(self) -> None:
        """Accept the connections (after ``start(serve=False)``)."""
        if self._server is not None:
            await self._server.start_serving()

    async def stop(self) -> None:
        """Stop accepting (the connections stay until the runner ends them)."""
        guards = _guards_of(asyncio.get_running_loop())
        for fd in self._fds:
            if guards.get(fd) is self._guard:
                del guards[fd]
        self._fds = []
        self._guard.forget()
        await super().stop()


_GUARDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, HeadGuard]] = (
    weakref.WeakKeyDictionary()
)
"""Per loop, the guard of each listening socket (by descriptor)."""


def _guards_of(loop: asyncio.AbstractEventLoop) -> dict[int, HeadGuard]:
    """The loop's guards, installing :func:`_on_loop_error` the first time."""
    guards = _GUARDS.get(loop)
    if guards is None:
        guards = _GUARDS[loop] = {}
        previous = loop.get_exception_handler()

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if not _on_loop_error(guards, context):
                if previous is not None:
                    previous(loop, context)
                else:
                    loop.default_exception_handler(context)

        loop.set_exception_handler(handle)
    return guards


def _on_loop_error(guards: dict[int, HeadGuard], context: dict[str, Any]) -> bool:
    """Take a failed ``accept()`` of a guarded socket; False for anything else."""
    exc = context.get("exception")
    sock = context.get("socket")
    if not isinstance(exc, OSError) or exc.errno not in OUT_OF_DESCRIPTORS or sock is None:
        return False
    guard = guards.get(sock.fileno())
    if guard is None:
        return False
    guard.out_of_descriptors(exc)
    return True
