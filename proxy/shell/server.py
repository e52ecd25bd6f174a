"""Addresses, upstream connections, and the proxy with a network listener (one link per Client).

``--listen`` and ``--upstream`` take ``stdio``, ``http://HOST:PORT/PATH`` or
``ws://HOST:PORT/PATH``, and ``https://`` or ``wss://`` for the same over TLS
(:mod:`proxy.shell.tls`). Each Client connection on a listener gets its own link and its own
upstream connection (a stdio upstream spawns one Agent per link). ``restart_proxy`` on a listener
closes every connection and link, takes the listener down for the downtime and brings it back on
the same port; the experiment (rules, counters, random stream, id counters) carries over.

Conductor mode (``--keep-upstream``): when a Client leaves, its link keeps the Agent's connection
and the next Client takes it over; that Client's ``initialize`` is answered from the Agent's first
answer, so a session held in the Agent's memory can be resumed after the Client reconnects.
The Client's ``Authorization``, ``Cookie`` and ``X-*`` headers go on to an HTTP or WebSocket Agent,
and the cookies the Agent sets come back to the Client (:mod:`proxy.shell.transports.cookies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import ssl
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from proxy.core.engine import FaultEngine
from proxy.core.errors import ConfigError, StartupError, os_cause
from proxy.core.events import Direction, Side
from proxy.core.relay import MetaFor, Relay
from proxy.shell.defaults import (
    CONNECT_TIMEOUT,
    HTTP_TIMEOUT,
    INITIALIZE_TIMEOUT,
    SHUTDOWN_TIMEOUT,
)
from proxy.shell.endpoint import Endpoint
from proxy.shell.hostport import authority, url_scheme
from proxy.shell.inflight import InflightBytes
from proxy.shell.limits import DEFAULT_LIMITS, DEFAULT_MAX_SESSIONS, LimitReached, Limits
from proxy.shell.link import Link
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer
from proxy.shell.origin_policy import NO_ALLOWANCES, Allowances
from proxy.shell.parsing import Parser
from proxy.shell.tls import UNTRUSTED_HINT, client_context
from proxy.shell.transports.cookies import CookieRoute, CookieSink, SetCookies
from proxy.shell.transports.http_listener import (
    SHUTTING_DOWN,
    HttpConnection,
    Listener,
    ListenerConfig,
    Refused,
)
from proxy.shell.transports.http_upstream import connect_http
from proxy.shell.transports.stdio import spawn_agent
from proxy.shell.transports.websocket import connect_ws

__all__ = [
    "STDIO",
    "Address",
    "NetworkProxy",
    "UpstreamFactory",
    "parse_address",
    "passed_headers",
    "upstream_factory",
]

log = get_logger("proxy.server")

UpstreamFactory = Callable[[Mapping[str, str], CookieSink | None], Awaitable[Endpoint]]
"""Connects one link's Agent; its arguments: the Client's headers to pass on (auth, cookies), and
where the cookies the Agent sets go back to the Client (``None``: nowhere, a stdio Client)."""

UNREACHABLE = Refused("unreachable", "the agent could not be reached")
CLOSING = Refused("closing", SHUTTING_DOWN)


PASSED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
"""Request headers of a Client that go on to an HTTP or WebSocket Agent (also every ``X-*``)."""


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a Client's request that the proxy passes on to the Agent."""
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in PASSED_HEADERS or name.lower().startswith("x-")
    }


@dataclass(frozen=True, slots=True)
class Address:
    """Where a side of the proxy is: ``stdio``, or a host, port and path over http or ws, in
    TLS when ``secure`` (``https://``, ``wss://``)."""

    scheme: Literal["stdio", "http", "ws"]
    host: str = ""
    port: int = 0
    path: str = "/acp"
    secure: bool = False

    @property
    def url(self) -> str:
        """The address as a URL (``stdio`` for stdio)."""
        if self.scheme == "stdio":
            return "stdio"
        scheme = url_scheme(self.scheme, secure=self.secure)
        return f"{scheme}://{authority(self.host, self.port)}{self.path}"


STDIO = Address("stdio")


SCHEMES: dict[str, tuple[Literal["http", "ws"], bool]] = {
    "http": ("http", False),
    "ws": ("ws", False),
    "https": ("http", True),
    "wss": ("ws", True),
}
"""Each URL scheme an address takes: its transport, and whether it is in TLS."""


def parse_address(text: str, *, option: str) -> Address:
    """Parse ``stdio``, ``http://HOST:PORT/PATH`` or ``ws://HOST:PORT/PATH``, or ``https://``
    and ``wss://`` (path: /acp)."""
    if text == "stdio":
        return Address("stdio")
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed '[' of an IPv6 address
        parts = urlsplit("")
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ConfigError(
            f"{option}: expected stdio, http://HOST:PORT/PATH or ws://HOST:PORT/PATH "
            f"(https:// and wss:// for TLS), got {text!r}"
        )
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{option}: invalid port in {text!r}") from None
    if port is None:
        raise ConfigError(f"{option}: give a port in {text!r} (0 picks a free one)")
    scheme, secure = SCHEMES[parts.scheme]
    return Address(scheme, parts.hostname, port, parts.path or "/acp", secure)


def upstream_factory(
    address: Address,
    agent_argv: tuple[str, ...],
    *,
    limit: int,
    grace: float,
    pipe_bytes: int = 0,
    connect_timeout: float = CONNECT_TIMEOUT,
    http_timeout: float = HTTP_TIMEOUT,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    observer: Observer | None = None,
    parser: Parser | None = None,
    tls: ssl.SSLContext | None = None,
) -> UpstreamFactory:
    """How each link connects to the Agent (``max_sessions``: the session streams one
    connection to an HTTP Agent holds; ``observer`` hears when that bound is reached;
    ``parser`` parses an HTTP Agent's large messages off the event loop; ``tls``: how an
    ``https://`` or ``wss://`` Agent is verified, default the system's trust store;
    ``pipe_bytes``: the room asked of a spawned Agent's pipes, 0 for the system's own)."""
    if address.secure and tls is None:
        tls = client_context()
    elif not address.secure:
        tls = None

    async def connect(headers: Mapping[str, str], cookies: CookieSink | None) -> Endpoint:
        if address.scheme == "stdio":
            return await spawn_agent(agent_argv, limit=limit, grace=grace, pipe_bytes=pipe_bytes)
        if address.scheme == "ws":
            return await connect_ws(
                address.url,
                limit=limit,
                headers=headers,
                open_timeout=connect_timeout,
                cookies=cookies,
                tls=tls,
            )
        return await connect_http(
            address.url,
            limit=limit,
            headers=headers,
            connect_timeout=connect_timeout,
            http_timeout=http_timeout,
            cookies=cookies,
            max_sessions=max_sessions,
            observer=observer,
            parser=parser,
            tls=tls,
        )

    return connect


class NetworkProxy:
    """A listener whose every Client connection is relayed to an upstream connection of its own.

    Shutting down (``stop`` set): the listener stops accepting (requests on open HTTP connections
    get 503), every link closes its Agent's connection and then its Client's, as the relay does
    when an Agent leaves, and the proxy waits for them for ``shutdown_timeout`` seconds at most,
    or until ``hurry`` is set; the links left are then cut (:meth:`Link.abort`).

    At most ``limits.max_links`` links run at once: a Client past them is refused before its
    Agent is connected (:class:`~proxy.shell.transports.http_listener.Refused`, ``full``), counted
    and, the first time until a link ends, logged.
    """

    def __init__(
        self,
        listen: Address,
        connect_upstream: UpstreamFactory,
        engine: FaultEngine,
        observer: Observer,
        *,
        strict: bool,
        limit: int,
        origin: float,
        keep_upstream: bool = False,
        initialize_timeout: float = INITIALIZE_TIMEOUT,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT,
        allowances: Allowances = NO_ALLOWANCES,
        limits: Limits = DEFAULT_LIMITS,
        max_pending: int | None = None,
        inflight: InflightBytes | None = None,
        parser: Parser | None = None,
        meta_for: MetaFor | None = None,
        tls: ssl.SSLContext | None = None,
        observe_after_write: bool = False,
    ) -> None:
        """``allowances``: the hosts and origins admitted beyond the listener's own
        (:mod:`proxy.shell.origin_policy`); ``limits``: what one peer can make the proxy hold;
        ``parser``: the proxy's parser of large messages; ``meta_for``: what each relay writes
        into the ``_meta`` of the requests it forwards (:data:`~proxy.core.relay.MetaFor`);
        ``tls``: the listener's certificate, for an ``https://`` or ``wss://`` address
        (:func:`proxy.shell.tls.server_context`); ``observe_after_write``: see
        :class:`~proxy.shell.link.Link`."""
        self._meta_for = meta_for
        self._observe_after_write = observe_after_write
        self._listen = listen
        self._max_links = limits.max_links
        self._connecting = 0
        """Client connections past the check of ``max_links`` whose link is not made yet."""
        self._full_logged = False
        """The refusal of a Client for ``max_links`` was logged (again once the links drop)."""
        self._connect_upstream = connect_upstream
        self._max_pending = max_pending
        self._inflight = inflight
        self._parser = parser
        self._initialize_timeout = initialize_timeout
        self._shutdown_timeout = shutdown_timeout
        self._keep_upstream = keep_upstream
        self._parked: Link | None = None
        """Conductor mode: the link whose Client left and whose Agent waits for the next one."""
        self._cookie_routes: dict[Link, CookieRoute] = {}
        """Each link's way from its Agent's cookies to its Client connection now."""
        self._engine = engine
        self._observer = observer
        self._strict = strict
        self._origin = origin
        self._ids: dict[Direction, Iterator[int]] = {d: itertools.count() for d in Direction}
        self._links: set[Link] = set()
        self.idle = asyncio.Event()
        """Set while no link runs (every Agent a link spawned has been stopped and reaped)."""
        self.idle.set()
        self._tasks: asyncio.TaskGroup | None = None
        self.listener = Listener(
            ListenerConfig(
                host=listen.host,
                port=listen.port,
                path=listen.path,
                websocket_only=listen.scheme == "ws",
                max_message_bytes=limit,
                initialize_timeout=initialize_timeout,
                allowances=allowances,
                idle_timeout=limits.idle_timeout,
                max_sessions=limits.max_sessions,
                header_timeout=limits.header_timeout,
                tls=tls,
            ),
            self._on_connection,
            observer,
            client_waits=self._client_waits,
            inflight=inflight,
            parser=parser,
        )
        self._restarting = False
        self._restart_task: asyncio.Task[None] | None = None
        self._on_listening: Callable[[str], None] | None = None
        self._stopping = asyncio.Event()

    async def serve(
        self,
        stop: asyncio.Event,
        on_listening: Callable[[str], None] | None = None,
        *,
        hurry: asyncio.Event | None = None,
    ) -> None:
        """Listen until ``stop`` is set, then end every link (see the class).

        ``on_listening`` hears the URL served each time the listener starts (again after each
        ``restart_proxy``). :class:`~proxy.core.errors.StartupError` when it cannot listen.
        """
        try:
            await self.listener.start()
        except OSError as exc:
            await self.listener.stop()
            raise StartupError("--listen", self._listen.url, os_cause(exc)) from None
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            self._on_listening = on_listening
            if on_listening is not None:
                on_listening(self.listener.url)
            await stop.wait()
            await self._shut_down(hurry or asyncio.Event())

    async def _shut_down(self, hurry: asyncio.Event) -> None:
        self._stopping.set()
        if self._restart_task is not None:
            await self._restart_task  # its downtime ends now, and the listener stays down
        await self.listener.stop_accepting()
        for link in list(self._links):
            link.shutdown()
        if not await _first(self.idle, hurry, seconds=self._shutdown_timeout):
            log.warning("links did not end in time; cutting them", links=len(self._links))
        if self._links:
            for link in list(self._links):
                link.abort()
        await self.listener.stop()

    async def _on_connection(
        self, downstream: Endpoint, headers: Mapping[str, str], cookies: SetCookies
    ) -> Refused | None:
        if self._stopping.is_set():
            return CLOSING
        parked, self._parked = self._parked, None
        if parked is not None and parked in self._links and parked.attach_client(downstream):
            log.info("a new client takes over the kept agent connection")
            self._cookie_routes[parked].point(cookies)
            return None
        if len(self._links) + self._connecting >= self._max_links:
            return self._full()
        self._connecting += 1
        try:
            return await self._connect(downstream, headers, cookies)
        finally:
            self._connecting -= 1

    def _full(self) -> Refused:
        """A Client refused: the links are at ``max_links`` (logged once until they drop)."""
        self._observer.observe(LimitReached("links", "listener"))
        if not self._full_logged:
            self._full_logged = True
            log.warning(
                "client refused: the links are at --max-links",
                max_links=self._max_links,
                further="counted, not logged, until a link ends",
            )
        return Refused(
            "full",
            f"the proxy serves {self._max_links} client connections, the most it may "
            "(--max-links); try again later",
        )

    async def _connect(
        self, downstream: Endpoint, headers: Mapping[str, str], cookies: SetCookies
    ) -> Refused | None:
        """Connect the Agent of a new Client connection and start their link."""
        passed = passed_headers(headers)
        route = CookieRoute(cookies)
        try:
            upstream = await self._connect_upstream(passed, route)
        except ssl.SSLCertVerificationError as exc:
            log.error(
                "could not connect to the agent: its certificate is not trusted",
                error=f"{exc} ({UNTRUSTED_HINT})",
            )
            return UNREACHABLE
        except (OSError, ConnectionError, TimeoutError) as exc:
            log.error("could not connect to the agent", error=str(exc) or type(exc).__name__)
            return UNREACHABLE
        except Exception as exc:  # the websockets and aiohttp handshake errors
            log.error("could not connect to the agent", error=str(exc) or type(exc).__name__)
            return UNREACHABLE
        if self._stopping.is_set():  # the proxy began to shut down while the Agent connected
            upstream.sever(flush=False)
            assert self._tasks is not None
            self._tasks.create_task(_closed(upstream))
            return CLOSING
        transport = downstream.transport
        # Over HTTP the listener bounds the initialize POST itself (a 504 without a connection).
        initialize_timeout = None if transport == "http" else self._initialize_timeout
        tokens = itertools.count()  # the link's timers, numbered across its relays

        def new_relay(cached_initialize: bytes | None) -> Relay:
            return Relay(
                strict=self._strict,
                engine=self._engine,
                origin=self._origin,
                ids=self._ids,
                tokens=tokens,
                downstream=transport,
                keep_upstream=self._keep_upstream,
                cached_initialize=cached_initialize,
                initialize_timeout=initialize_timeout,
                max_pending=self._max_pending,
                meta_for=self._meta_for,
            )

        link = Link(
            new_relay,
            {Side.CLIENT: downstream, Side.AGENT: upstream},
            self._observer,
            connect_agent=functools.partial(self._connect_upstream, passed, route),
            on_restart=self.restart,
            on_client_gone=self._park if self._keep_upstream else None,
            on_ended=self._forget,
            inflight=self._inflight,
            parser=self._parser,
            observe_after_write=self._observe_after_write,
        )
        assert self._tasks is not None
        self._links.add(link)
        self._cookie_routes[link] = route
        self.idle.clear()
        self._tasks.create_task(self._run(link))
        return None

    def links(self) -> list[Link]:
        """The links running now (the control API's view)."""
        return list(self._links)

    def _client_waits(self, connection: HttpConnection) -> bool:
        """Whether the Client of an HTTP connection awaits answers to its requests."""
        for link in self._links:
            if link.endpoints[Side.CLIENT] is connection:
                return link.relay.pending(Direction.TO_AGENT) > 0
        return False

    def _park(self, link: Link) -> None:
        log.info("client gone; keeping the agent connection for the next client")
        self._parked = link

    async def _run(self, link: Link) -> None:
        try:
            await link.run()
        finally:
            self._forget(link)  # when the link never started (the proxy is stopping)

    def _forget(self, link: Link) -> None:
        """The link has ended (its last task is done): no action or restart reaches it now."""
        if link not in self._links:
            return
        self._links.discard(link)
        self._cookie_routes.pop(link, None)
        log.info("link ended", link=link.id, links=len(self._links))
        if len(self._links) < self._max_links:
            self._full_logged = False
        if not self._links:
            self.idle.set()
        if self._parked is link:
            self._parked = None

    def restart(self, downtime: float) -> None:
        """``restart_proxy``: every connection closed, listener down for ``downtime``, then back.

        The links are cut at once (the message that triggered it was forwarded, its answer is
        lost); stopping and starting the listener follows.
        """
        if self._tasks is None:
            return
        if self._restarting or self._stopping.is_set():
            log.warning(
                "restart ignored: the proxy is shutting down or already restarting",
                what="proxy",
            )
            return
        self._restarting = True
        log.warning("restarting", what="proxy", downtime_ms=downtime * 1000)
        for link in list(self._links):
            link.sever_all()
        self._parked = None
        self._restart_task = self._tasks.create_task(self._restart(downtime))

    async def _restart(self, downtime: float) -> None:
        try:
            await self.listener.stop()
            if downtime:
                with contextlib.suppress(TimeoutError):  # a shutdown ends the downtime
                    await asyncio.wait_for(self._stopping.wait(), downtime)
            if self._stopping.is_set():
                return
            with contextlib.suppress(OSError):
                await self.listener.start()
                if self._on_listening is not None:
                    self._on_listening(self.listener.url)
        finally:
            self._restarting = False
            self._restart_task = None


async def _first(event: asyncio.Event, other: asyncio.Event, *, seconds: float) -> bool:
    """Wait until ``event`` or ``other`` is set, ``seconds`` at most; ``event.is_set()``."""
    loop = asyncio.get_running_loop()
    waits = [loop.create_task(e.wait()) for e in (event, other)]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return event.is_set()


async def _closed(endpoint: Endpoint) -> None:
    await endpoint.wait_closed()
