"""The listener toward Clients: Streamable HTTP and WebSocket on aiohttp (wire brief 1.2, 1.3).

One endpoint path serves POST, GET (SSE), DELETE and the WebSocket upgrade (``--listen http://``),
or the upgrade alone (``--listen ws://``). Each ``initialize`` POST (and each WebSocket) is a new
Client connection, with an ``Acp-Connection-Id`` minted here, and becomes a link of its own.

Streamable HTTP as the SDKs speak it:

* POST needs ``Content-Type: application/json`` (415); a batch is refused (501); ``initialize`` is
  answered 200 with the JSON-RPC response as the body and the ``Acp-Connection-Id`` header; every
  other POST needs a known connection id (400 without, 404 unknown) and is answered 202 once the
  relay has taken the message (so an ``http_status`` fault can answer it instead).
  ``Acp-Session-Id`` must equal ``params.sessionId``, and is required for the methods of
  :data:`SESSION_ID_REQUIRED` (400).
* GET with ``Accept: text/event-stream`` (406 otherwise) opens the connection stream, or with
  ``Acp-Session-Id`` a session stream (of a session not seen yet too: it buffers until the session
  appears, as the SDKs' servers do); a second receiver of the same stream gets 409. Streams are
  mailboxes: messages wait, bounded, until a receiver attaches; a message already written to a
  receiver that dies is lost, as in the SDKs. Keep-alive comments go out every 15 s.
* Routing: a response goes to the session stream of its request's session, an Agent message to
  its own session's stream, when that stream exists (a ``session/new`` answer creates it);
  everything else goes to the connection stream.
* DELETE ends the connection and its streams (202; 400; 404).
* A POST's body is admitted against the bytes in flight (:mod:`proxy.shell.inflight`) before it is
  read: one that does not fit gets 503 with ``Retry-After`` (its message is not relayed).
* An ``initialize`` the Agent does not answer within ``initialize_timeout`` gets 504 with a
  JSON-RPC error; the attempt's connection is dropped.
* Once the proxy shuts down (:meth:`Listener.stop_accepting`), no connection is accepted and every
  request gets 503; a pending ``initialize`` too.

Bounds (:mod:`proxy.shell.limits`): a new Client connection the proxy refuses for ``--max-links``
gets 503 with ``Retry-After`` (an ``initialize`` POST a JSON-RPC error too; a WebSocket upgrade is
not made). A connection may name ``max_sessions`` sessions: a POST naming one more (or making one,
``session/new``), or a GET of one more session's stream, gets 429 with a JSON-RPC error naming the
limit. A connection whose Client is idle for ``idle_timeout`` (no request being served, a stream
it reads counting as one, and no request of its awaiting an answer) is ended as a DELETE would
end it. Every TCP connection has ``header_timeout`` for each request head
(:mod:`proxy.shell.transports.guarded_site`).

The Agent's cookies (:mod:`proxy.shell.transports.cookies`) come back to the Client on its next
response (the ``initialize`` answer, a 202, a stream's headers); a WebSocket upgrade is answered
only once the Agent is connected, so that its ``101`` carries the cookies of the Agent's handshake.

Before any of this, every request (the upgrade too) passes the ``Host`` and ``Origin`` checks of
:mod:`proxy.shell.origin_policy` (403 otherwise). With a certificate (``ListenerConfig.tls``) the
listener serves all of it over TLS (``https://``, ``wss://``), and nothing in plain.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from aiohttp import hdrs, web
from multidict import CIMultiDict

from proxy.core import acp
from proxy.core.client_faults import ACP_FAULT
from proxy.core.commands import FailPost
from proxy.core.events import Direction
from proxy.core.jsonrpc import (
    Batch,
    ErrorCode,
    IdKey,
    Invalid,
    Kind,
    Message,
    error_response,
    parse,
)
from proxy.core.observations import Handling, InflightRefused, InvalidSeen
from proxy.core.sse import KEEPALIVE, encode_event
from proxy.shell.defaults import (
    HANDLERS_GRACE,
    INITIALIZE_TIMEOUT,
    KEEPALIVE_SECONDS,
    STREAM_HIGH_WATER,
)
from proxy.shell.endpoint import Endpoint, Received, Severed, Sliced, joined
from proxy.shell.hostport import authority, url_scheme
from proxy.shell.inflight import INFLIGHT_RETRY_AFTER_SECONDS, InflightBytes, Reservation
from proxy.shell.limits import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_SESSIONS,
    RETRY_AFTER_SECONDS,
    LimitReached,
)
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer
from proxy.shell.origin_policy import NO_ALLOWANCES, Allowances, OriginPolicy
from proxy.shell.parsing import Parser
from proxy.shell.transports.cookies import SetCookies
from proxy.shell.transports.guarded_site import GuardedSite, HeadGuard
from proxy.shell.transports.websocket import MaskedOnlyWebSocketResponse, WsServerEndpoint

__all__ = ["HttpConnection", "Listener", "ListenerConfig", "Refused"]

log = get_logger("proxy.http")

CONNECTION_ID = "Acp-Connection-Id"
SESSION_ID = "Acp-Session-Id"
"""The session a POST is about: equal to its message's ``params.sessionId``
(:attr:`~proxy.core.jsonrpc.Message.session`), wherever that is present. Toward an Agent every such
POST carries it, whatever its method (the TypeScript SDK's server refuses one without it), and
so does the answer to an Agent's request that named a session. From a Client it is taken
wherever it comes if it equals ``params.sessionId``, and required for
:data:`SESSION_ID_REQUIRED`."""
SESSION_ID_REQUIRED = frozenset(
    {
        acp.PROMPT,
        acp.SESSION_CANCEL,
        acp.CLOSE_SESSION,
        "session/set_config_option",
        "session/set_mode",
    }
)
"""Methods whose POST from a Client must carry ``Acp-Session-Id``: those every SDK Client sends
it for. The Python SDK's Client sends it for these only (not on ``session/load`` or
``session/resume``), the TypeScript one whenever ``params.sessionId`` is present: requiring more
would refuse the Python Client's own ``session/load``."""
SESSION_MAKERS = frozenset({acp.NEW_SESSION, "session/fork"})
"""Methods whose answer names a new session: refused on a connection that has all it may."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a new Client connection was not made, and what its Client is told."""

    reason: Literal["unreachable", "full", "closing"]
    """``unreachable``: no upstream could be reached (502, or a WebSocket closed 1011);
    ``full``: the links are at their bound (503 with ``Retry-After``, before any upgrade);
    ``closing``: the proxy shuts down (503, or a WebSocket closed 1001)."""
    message: str


OnConnection = Callable[[Endpoint, Mapping[str, str], SetCookies], Awaitable[Refused | None]]
"""Starts a link for a new Client connection (given its request headers, and where the cookies
its Agent sets are left for the Client's next response); None once it runs, or why not."""

ClientWaits = Callable[["HttpConnection"], bool]
"""Whether the Client of a connection awaits answers to requests it sent (its link knows)."""


_KILL = b""
"""In a mailbox's queue: the receiver that reaches this point is cut (``close_stream``)."""


class Mailbox:
    """One SSE stream: buffered messages and at most one receiver (a GET) at a time."""

    def __init__(self, drained: asyncio.Event) -> None:
        self._queue: deque[bytes | Sliced] = deque()
        self.size = 0
        self._drained = drained
        """Set whenever this mailbox shrinks (wakes a waiting :meth:`HttpConnection.drain`)."""
        self._wake = asyncio.Event()
        self.receiver: web.Request | None = None
        self._cut = asyncio.Event()
        """Set by :meth:`cut`: an event being written in pieces stops."""
        self.blocked_since: float | None = None
        """When the write to the receiver now under way began (None: no write waits)."""
        self._ended = False

    def put(self, event: bytes | Sliced) -> None:
        self._queue.append(event)
        self.size += len(event)
        self._wake.set()

    def end(self) -> None:
        """Finish the current receiver's response cleanly; no receiver can attach any more."""
        self._ended = True
        self._wake.set()

    def kill(self) -> None:
        """``close_stream``: the receiver dies after what is queued; later messages wait."""
        self._queue.append(_KILL)
        self._wake.set()

    def has_receiver(self) -> bool:
        """Whether a GET is attached and its connection still open."""
        receiver = self.receiver
        if receiver is None:
            return False
        transport = receiver.transport
        if transport is None or transport.is_closing():
            self._wake.set()  # let the dead receiver's loop notice and leave
            return False
        return True

    def cut(self) -> None:
        """``sever``: drop what is queued and cut the receiver now."""
        self._queue.clear()
        self.size = 0
        self._cut.set()
        self.kill()

    async def serve(self, request: web.Request, headers: CIMultiDict[str]) -> web.StreamResponse:
        """Stream to one receiver until it leaves, the stream is killed or ended."""
        headers.extend({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        self.receiver = request
        try:
            while True:
                while self._queue:
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        return response  # the receiver left: the message waits for the next
                    event = self._queue.popleft()
                    if event is _KILL:
                        transport = request.transport
                        if transport is not None:
                            transport.abort()
                        return response
                    self.size -= len(event)
                    self._drained.set()
                    if type(event) is bytes:
                        await self._write(response, event)  # lost if the receiver is gone
                    else:  # in pieces: a chunk each (a cut stops them: see below)
                        assert isinstance(event, Sliced)
                        async for chunk in event.chunks(cut=self._cut):
                            await self._write(response, chunk)
                    del event  # written: not kept alive while the stream waits for the next
                if self._ended:
                    await response.write_eof()
                    return response
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    await self._write(response, KEEPALIVE)
        except Severed:
            if request.transport is not None:
                request.transport.abort()
            return response
        except (ConnectionError, RuntimeError):
            return response
        finally:
            if self.receiver is request:
                self.receiver = None

    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        self.blocked_since = asyncio.get_running_loop().time()
        try:
            await response.write(data)
        finally:
            self.blocked_since = None

    def stalled(self, now: float, patience: float) -> bool:
        """Whether a write to the receiver has waited ``patience`` seconds or more: a Client
        that holds its stream open without reading it."""
        return self.blocked_since is not None and now - self.blocked_since >= patience

    def abort_receiver(self) -> None:
        """Cut the receiver's connection now (one that does not read would never see an end)."""
        transport = self.receiver.transport if self.receiver is not None else None
        if transport is not None:
            transport.abort()


@dataclass
class _Post:
    """A POSTed message waiting for the relay to take it (parsed: the relay takes the parse)."""

    message: Message
    settled: asyncio.Future[FailPost | None]
    reservation: Reservation | None
    """Its bytes in flight, handed over to the link when it takes the message."""


class HttpConnection:
    """One Streamable HTTP Client connection, as an endpoint of its link.

    It holds at most ``max_sessions`` sessions (each with its stream): a Client's POST or GET
    naming one more is refused by the listener (:meth:`admits`), an Agent's message naming one
    more goes to the connection stream.
    """

    transport = "http"

    def __init__(self, connection_id: str, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.connection_id = connection_id
        self.max_sessions = max_sessions
        self.requests_open = 0
        """Requests of the Client on this connection being served now (a GET stream too)."""
        self.last_active = asyncio.get_running_loop().time()
        """When the Client last began or ended a request here (or was last seen busy)."""
        self.idle_timer: asyncio.TimerHandle | None = None
        """When the listener looks next whether the Client is idle."""
        # Unbounded, but each POST waits until the relay took its message: at most one message
        # per POST in flight, so the Client's own concurrency bounds it.
        self._inbox: asyncio.Queue[_Post | None] = asyncio.Queue()
        self._unsettled: deque[asyncio.Future[FailPost | None]] = deque()
        self._drained = asyncio.Event()
        self._streams: dict[str | None, Mailbox] = {None: Mailbox(self._drained)}
        self._sessions: set[str] = set()
        self._request_sessions: dict[IdKey, str | None] = {}
        self._initialize: tuple[IdKey, asyncio.Future[bytes | Sliced]] | None = None
        self.closed = False
        self.cut = asyncio.Event()
        """Set by a :meth:`sever` that drops what is queued (an answer in pieces stops)."""
        self._closed_event = asyncio.Event()
        self.cookies = SetCookies()
        """The cookies the Agent set, until a response to the Client carries them."""

    # -- the listener's side -------------------------------------------------------------------

    def response_headers(self, headers: Mapping[str, str] | None = None) -> CIMultiDict[str]:
        """``headers`` and a ``Set-Cookie`` for each cookie the Agent set since the last one."""
        out = CIMultiDict(headers or {})
        for value in self.cookies.take():
            out.add(hdrs.SET_COOKIE, value)
        return out

    async def submit(
        self, message: Message, reservation: Reservation | None = None
    ) -> FailPost | None:
        """Hand a POSTed message (its bytes in flight in ``reservation``) to the relay; the
        answer a fault asked for, once taken (None: accepted)."""
        if message.kind is Kind.REQUEST and message.id_key is not None:
            session = message.session
            self._request_sessions[message.id_key] = session
        self._note_session(message.session)
        settled: asyncio.Future[FailPost | None] = asyncio.get_running_loop().create_future()
        await self._inbox.put(_Post(message, settled, reservation))
        return await settled

    def expect_initialize(self, key: IdKey) -> asyncio.Future[bytes | Sliced]:
        """A future for the answer to the ``initialize`` that opens this connection."""
        answer: asyncio.Future[bytes | Sliced] = asyncio.get_running_loop().create_future()
        self._initialize = (key, answer)
        return answer

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around each request of the Client on this connection: it is active meanwhile."""
        loop = asyncio.get_running_loop()
        self.requests_open += 1
        self.last_active = loop.time()
        try:
            yield
        finally:
            self.requests_open -= 1
            self.last_active = loop.time()

    def reading(self, now: float, patience: float) -> bool:
        """Whether a request is being served whose stream, if any, the Client reads (a write to
        it has not waited ``patience`` seconds)."""
        stalled = sum(1 for mailbox in self._streams.values() if mailbox.stalled(now, patience))
        return self.requests_open > stalled

    def abort_receivers(self) -> None:
        """Cut every stream's receiver now."""
        for mailbox in self._streams.values():
            mailbox.abort_receiver()

    def admits(self, session: str | None, method: str | None) -> bool:
        """Whether a Client's message about ``session`` (or one that makes a session) stays
        within :attr:`max_sessions`."""
        if len(self._sessions) < self.max_sessions:
            return True
        if method in SESSION_MAKERS:
            return False
        return session is None or session in self._sessions

    def stream(self, session: str | None) -> Mailbox | None:
        """The mailbox a GET attaches to; a session not seen yet gets one that buffers until
        the session appears, as the SDKs' servers do; None when that would be a session too
        many."""
        if session is None:
            return self._streams[None]
        if session not in self._sessions:
            if len(self._sessions) >= self.max_sessions:
                return None
            self._sessions.add(session)
        return self._streams.setdefault(session, Mailbox(self._drained))

    def terminate(self) -> None:
        """End the connection: streams finish, the relay sees the Client leave (DELETE)."""
        if self.closed:
            return
        self.closed = True
        for mailbox in self._streams.values():
            mailbox.end()
        self._fail_waiters()
        self.cookies.close()
        self._inbox.put_nowait(None)
        self._drained.set()
        self._closed_event.set()

    # -- the endpoint's side -------------------------------------------------------------------

    async def receive(self) -> Received | None:
        """The next POSTed message, or None once the connection is over."""
        if self.closed and self._inbox.empty():
            return None
        post = await self._inbox.get()
        if post is None:
            return None
        if post.reservation is not None:
            post.reservation.release()  # the link counts it from here on
        self._unsettled.append(post.settled)
        return post.message

    def admits_in_flight(self) -> bool:
        """Each POST's body is admitted against the bytes in flight before it is read."""
        return True

    def receive_ready(self) -> bool:
        """Each message is written on its own: the link drains after every one."""
        return False

    def processed(self, failure: FailPost | None) -> None:
        """Answer the POST of the message the relay just took (202, or the fault's status)."""
        if self._unsettled:
            settled = self._unsettled.popleft()
            if not settled.done():
                settled.set_result(failure)

    def send(self, data: bytes) -> None:
        """Route a message to the stream that carries it (or to the initialize POST)."""
        if self.closed:
            return
        mailbox = self._route(data)
        if mailbox is not None:
            mailbox.put(encode_event(data))

    def send_run(self, messages: Sequence[bytes]) -> None:
        """Route each message as :meth:`send` does."""
        for data in messages:
            self.send(data)

    def send_cut(self, data: bytes, cut: int) -> None:
        """An event holding the message cut short, on the stream the whole one would take."""
        if self.closed:
            return
        mailbox = self._route(data)
        if mailbox is not None:
            mailbox.put(encode_event(data[:cut]))

    def send_sliced(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        """The event (or the initialize POST's body) written in chunks of those sizes."""
        if self.closed:
            return
        mailbox = self._route(data, sizes, gap)
        if mailbox is not None:
            mailbox.put(Sliced(encode_event(data), sizes, gap))

    def drop_stream(self, data: bytes) -> None:
        """``close_stream``: kill the receiver of the stream that would carry ``data``."""
        mailbox = self._route(data)
        if mailbox is not None:
            mailbox.kill()

    def will_flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    def flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    async def drain(self) -> None:
        """Wait while a stream holds too much: a Client that does not read slows the Agent down."""
        while not self.closed and any(
            mailbox.size > STREAM_HIGH_WATER for mailbox in self._streams.values()
        ):
            self._drained.clear()
            await self._drained.wait()

    def buffered(self) -> int:
        """Bytes waiting in the streams for their receivers."""
        return sum(mailbox.size for mailbox in self._streams.values())

    def close(self) -> None:
        """The Agent side ended: finish the streams, forget the connection."""
        self.terminate()

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Cut every stream now (and an answer to initialize being written in pieces); the
        connection id is forgotten (404 afterwards)."""
        if not flush:
            self.cut.set()
            for mailbox in self._streams.values():
                mailbox.cut()
        self.terminate()

    async def wait_closed(self) -> None:
        """Wait until the connection is over."""
        await self._closed_event.wait()

    # -- routing -------------------------------------------------------------------------------

    def _note_session(self, session: object) -> bool:
        """Know ``session`` from now on; False when it would be a session too many."""
        if not isinstance(session, str):
            return False
        if session in self._sessions:
            return True
        if len(self._sessions) >= self.max_sessions:
            return False  # the Agent's: its messages go to the connection stream
        self._sessions.add(session)
        return True

    def _route(self, data: bytes, sizes: tuple[int, ...] = (), gap: float = 0.0) -> Mailbox | None:
        """The stream that carries ``data``; None when it answers the initialize POST (which
        gets it, in pieces of ``sizes`` when there are any)."""
        parsed = parse(data)
        session: str | None = None
        answers = _answered_id(parsed)
        if answers is not None:
            if self._initialize is not None and self._initialize[0] == answers:
                _, answer = self._initialize
                self._initialize = None
                if not answer.done():
                    answer.set_result(Sliced(data, sizes, gap) if sizes else data)
                return None
            session = self._request_sessions.pop(answers, None)
            result = parsed.body.get("result") if isinstance(parsed, Message) else None
            if isinstance(result, dict) and isinstance(result.get("sessionId"), str):
                if self._note_session(result["sessionId"]):  # session/new: on the connection stream
                    self._streams.setdefault(result["sessionId"], Mailbox(self._drained))
                session = None
        elif isinstance(parsed, Message):
            session = parsed.session
            self._note_session(session)
        mailbox = self._streams.get(session) if session is not None else None
        return mailbox or self._streams[None]

    def _fail_waiters(self) -> None:
        if self._initialize is not None:
            _, answer = self._initialize
            if not answer.done():
                answer.cancel()
        while self._unsettled:
            settled = self._unsettled.popleft()
            if not settled.done():
                settled.set_result(None)


def _answered_id(parsed: Message | Batch | Invalid) -> IdKey | None:
    """The id of the request an answer answers (one no parser reads too, by its readable id)."""
    if isinstance(parsed, Message):
        return parsed.id_key if parsed.kind in (Kind.RESPONSE, Kind.ERROR) else None
    if isinstance(parsed, Invalid) and parsed.reads_as in (Kind.RESPONSE, Kind.ERROR):
        return parsed.id_key
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerConfig:
    """Where and how the listener serves."""

    host: str
    port: int
    path: str
    websocket_only: bool
    max_message_bytes: int
    initialize_timeout: float = INITIALIZE_TIMEOUT
    allowances: Allowances | None = NO_ALLOWANCES
    """The ``Host`` and ``Origin`` checks (:mod:`proxy.shell.origin_policy`) and what the user
    opened up; None checks nothing (the reference Agent, a test peer)."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds an HTTP Client connection may stay idle before it is ended (``--idle-timeout``)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """Sessions one HTTP Client connection may name (``--max-sessions``)."""
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds a TCP connection has for each request head (``--header-timeout``), and for its
    TLS handshake before that."""
    tls: ssl.SSLContext | None = None
    """The certificate served (``https://``, ``wss://``: :mod:`proxy.shell.tls`); None: plain."""


SHUTTING_DOWN = "the proxy is shutting down"


def _failed(failure: FailPost, headers: CIMultiDict[str]) -> web.Response:
    """The answer an ``http_status`` rule asked for, attributed unless the rule said not to."""
    if failure.attribution is not None:
        headers.add(ACP_FAULT, failure.attribution)
    return web.Response(status=failure.status, headers=headers)


def _error(
    status: int,
    message: str,
    code: int = ErrorCode.INVALID_REQUEST,
    request_id: bytes | None = None,
) -> web.Response:
    """An HTTP error whose body is a JSON-RPC error (for ``request_id``, else ``id: null``)."""
    body = error_response(request_id or b"null", code, message)
    return web.Response(status=status, body=body, content_type="application/json")


def _busy(refused: Refused, request_id: bytes | None = None) -> web.Response:
    """503 for a bound that frees itself when another Client leaves: try again later."""
    response = _error(503, refused.message, ErrorCode.INTERNAL_ERROR, request_id)
    response.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER_SECONDS)
    return response


class Listener:
    """The aiohttp server of one ``--listen`` address."""

    def __init__(
        self,
        config: ListenerConfig,
        on_connection: OnConnection,
        observer: Observer,
        *,
        client_waits: ClientWaits | None = None,
        inflight: InflightBytes | None = None,
        parser: Parser | None = None,
    ):
        """``client_waits``: whether a connection's Client awaits answers (then it is not idle);
        without it, no Client is ever seen waiting. ``inflight``: the bytes in flight across the
        proxy, against which each POST's body is admitted before it is read. ``parser`` parses
        large POSTs off the event loop."""
        self.config = config
        self._inflight = inflight or InflightBytes(None)
        self._parser = parser or Parser(large=None)
        self._on_connection = on_connection
        self._observer = observer
        self._client_waits = client_waits
        self._sessions_logged = False
        allowances = config.allowances
        self._policy = (
            OriginPolicy(
                "listener", config.host, allowances, observer, secure=config.tls is not None
            )
            if allowances is not None
            else None
        )
        self.connections: dict[str, HttpConnection] = {}
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None
        self.port = config.port
        self.closing = False
        """Shutting down: nothing new is accepted, every request gets 503."""

    async def start(self) -> None:
        """Bind and serve; the bound port (port 0 picks one) is in :attr:`port`."""
        guard = HeadGuard("listener", self.config.header_timeout, self._observer)
        middlewares = [guard.middleware]
        if self._policy is not None:
            middlewares.append(self._policy.middleware)
        app = web.Application(
            client_max_size=self.config.max_message_bytes, middlewares=middlewares
        )
        app.router.add_route("*", self.config.path, self._dispatch)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=HANDLERS_GRACE,
            keepalive_timeout=self.config.header_timeout,
        )
        await self._runner.setup()
        self._site = GuardedSite(
            self._runner, self.config.host, self.port, guard, tls=self.config.tls
        )
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        log.info("listening", url=self.url)

    @property
    def url(self) -> str:
        """The address served (with the bound port)."""
        scheme = url_scheme(
            "ws" if self.config.websocket_only else "http", secure=self.config.tls is not None
        )
        return f"{scheme}://{authority(self.config.host, self.port)}{self.config.path}"

    async def stop_accepting(self) -> None:
        """The proxy shuts down: close the listening socket; requests on open connections get
        503 from now on. The connections stay until their links have ended (:meth:`stop`)."""
        self.closing = True
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def stop(self) -> None:
        """Stop accepting and close every connection."""
        for connection in list(self.connections.values()):
            self._forget(connection)
            connection.sever(flush=False)
        self._site = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if self.closing:
            return _error(503, SHUTTING_DOWN, ErrorCode.INTERNAL_ERROR)
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if request.method == "GET" and upgrade:
            return await self._websocket(request)
        if self.config.websocket_only:
            return _error(426, "this endpoint serves WebSocket only")
        if request.method == "POST":
            return await self._post(request)
        if request.method == "GET":
            return await self._get(request)
        if request.method == "DELETE":
            return self._delete(request)
        return _error(405, f"method {request.method} not allowed")

    def _invalid(self, reason: Invalid, status: int) -> web.Response:
        self._observer.observe(
            InvalidSeen(
                direction=Direction.TO_AGENT,
                reason=reason.reason,
                size=len(reason.raw),
                detail=reason.detail,
                handling=Handling.ANSWERED,
            )
        )
        code = reason.reason.error_code
        return _error(status, f"{code.name.replace('_', ' ').capitalize()}: {reason.detail}", code)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return _error(415, "Content-Type must be application/json")
        body = await self._admitted_body(request)
        if isinstance(body, web.Response):
            return body
        data, reservation = body
        try:
            return await self._relay_post(request, await self._parser.parse(data), reservation)
        finally:
            reservation.release()  # refused, or taken by the link (which counts it from then)

    async def _admitted_body(
        self, request: web.Request
    ) -> tuple[bytes, Reservation] | web.Response:
        """The body of a POST, admitted against the bytes in flight before it is read; or the
        answer refusing it: 413 past ``--max-message-bytes``, 503 when it does not fit in what
        the proxy may hold now (``Retry-After``: the message was not relayed, a retry is safe).

        The body is read chunk by chunk, never through ``Request.read``, which would keep it
        alive in the request object for as long as its connection is kept open."""
        limit = self.config.max_message_bytes
        declared = request.content_length
        if declared is not None and declared > limit:
            return _error(413, f"body exceeds {limit} bytes")
        reservation = self._inflight.admit(declared or 0)
        if reservation is None:
            return self._too_much_in_flight(declared or 0)
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > limit:
                    reservation.release()
                    return _error(413, f"body exceeds {limit} bytes")
                if declared is None and not reservation.grow(len(chunk)):
                    reservation.release()
                    return self._too_much_in_flight(size)
                chunks.append(chunk)
        except BaseException:
            reservation.release()
            raise
        return await joined(chunks, size), reservation

    def _too_much_in_flight(self, size: int) -> web.Response:
        inflight = self._inflight
        inflight.refused()
        self._observer.observe(InflightRefused(Direction.TO_AGENT, size, inflight.count))
        response = _error(
            503,
            f"the proxy holds {inflight.count} bytes in flight, its bound is {inflight.bound} "
            "(--max-inflight-bytes); retry once peers have read",
            ErrorCode.INTERNAL_ERROR,
        )
        response.headers[hdrs.RETRY_AFTER] = str(INFLIGHT_RETRY_AFTER_SECONDS)
        return response

    async def _relay_post(
        self, request: web.Request, parsed: Message | Batch | Invalid, reservation: Reservation
    ) -> web.StreamResponse:
        if isinstance(parsed, Batch):
            return _error(501, "batches are not supported over Streamable HTTP")
        if isinstance(parsed, Invalid):
            return self._invalid(parsed, 400)
        if parsed.kind is Kind.REQUEST and parsed.method == acp.INITIALIZE:
            return await self._initialize(request, parsed, reservation)
        connection_id = request.headers.get(CONNECTION_ID)
        if not connection_id:
            return _error(400, f"missing {CONNECTION_ID} header")
        connection = self.connections.get(connection_id)
        if connection is None or connection.closed:
            if connection is not None:
                self._forget(connection)
            return _error(404, f"unknown {CONNECTION_ID}")
        with connection.serving():
            session_header = request.headers.get(SESSION_ID)
            if parsed.method in SESSION_ID_REQUIRED and not session_header:
                return _error(400, f"missing {SESSION_ID} header for {parsed.method}")
            if session_header and parsed.session is not None and session_header != parsed.session:
                return _error(400, f"Mismatched {SESSION_ID} and params.sessionId")
            if not connection.admits(parsed.session, parsed.method):
                request_id = parsed.id_token if parsed.kind is Kind.REQUEST else None
                return self._too_many_sessions(connection, request_id)
            asked = request.headers.get(ACP_FAULT)  # a fault the Client asks for (not forwarded)
            if asked is not None and parsed.kind is Kind.REQUEST:
                parsed = replace(parsed, fault_header=asked)
            failure = await connection.submit(parsed, reservation)
            if failure is None:
                return web.Response(status=202, headers=connection.response_headers())
            return _failed(failure, connection.response_headers())

    def _too_many_sessions(
        self, connection: HttpConnection, request_id: bytes | None
    ) -> web.Response:
        """429: a Client's POST or GET would make one session too many on its connection."""
        self._observer.observe(LimitReached("sessions", "listener"))
        limit = connection.max_sessions
        if not self._sessions_logged:
            self._sessions_logged = True
            log.warning(
                "session refused: the connection is at --max-sessions",
                max_sessions=limit,
                further="counted, not logged",
            )
        return _error(
            429,
            f"this connection has {limit} sessions, the most one may have (--max-sessions); "
            "open another connection for more",
            ErrorCode.INVALID_REQUEST,
            request_id,
        )

    async def _initialize(
        self, request: web.Request, message: Message, reservation: Reservation
    ) -> web.StreamResponse:
        assert message.id_key is not None
        connection = HttpConnection(secrets.token_hex(16), self.config.max_sessions)
        answer = connection.expect_initialize(message.id_key)
        refused = await self._on_connection(connection, request.headers, connection.cookies)
        if refused is not None:
            if refused.reason == "full":
                return _busy(refused, message.id_token)
            if self.closing or refused.reason == "closing":
                return _error(503, SHUTTING_DOWN, ErrorCode.INTERNAL_ERROR, message.id_token)
            return _error(502, refused.message, ErrorCode.INTERNAL_ERROR, message.id_token)
        self.connections[connection.connection_id] = connection
        self._watch_idle(connection)
        failure = await connection.submit(message, reservation)
        if failure is not None:
            self._forget(connection)
            connection.terminate()
            return _failed(failure, CIMultiDict())
        timeout = self.config.initialize_timeout
        try:
            body = await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            log.warning("the agent did not answer initialize in time", timeout_s=timeout)
            self._forget(connection)
            connection.terminate()
            return _error(
                504,
                f"the agent did not answer initialize within {timeout:g} s",
                ErrorCode.INTERNAL_ERROR,
                message.id_token,
            )
        except asyncio.CancelledError:
            if not answer.cancelled():
                raise  # this handler is cancelled, not the answer
            self._forget(connection)
            if self.closing:
                return _error(503, SHUTTING_DOWN, ErrorCode.INTERNAL_ERROR, message.id_token)
            return _error(
                502,
                "the agent's connection ended before it answered initialize",
                ErrorCode.INTERNAL_ERROR,
                message.id_token,
            )
        headers = connection.response_headers({CONNECTION_ID: connection.connection_id})
        if isinstance(body, bytes):
            return web.Response(
                status=200, body=body, content_type="application/json", headers=headers
            )
        response = web.StreamResponse(status=200, headers=headers)  # chunked: a chunk a piece
        response.content_type = "application/json"
        await response.prepare(request)
        try:
            async for chunk in body.chunks(cut=connection.cut):
                await response.write(chunk)
            await response.write_eof()
        except Severed:
            if request.transport is not None:
                request.transport.abort()
        except ConnectionError:
            pass  # the Client left
        return response

    async def _get(self, request: web.Request) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        if "text/event-stream" not in accept and "*/*" not in accept:
            return _error(406, "Accept must include text/event-stream")
        connection_id = request.headers.get(CONNECTION_ID)
        if not connection_id:
            return _error(400, f"missing {CONNECTION_ID} header")
        connection = self.connections.get(connection_id)
        if connection is None or connection.closed:
            return _error(404, f"unknown {CONNECTION_ID}")
        with connection.serving():
            session = request.headers.get(SESSION_ID)
            mailbox = connection.stream(session)
            if mailbox is None:
                return self._too_many_sessions(connection, None)
            if mailbox.has_receiver():
                return _error(409, "this stream already has an active receiver")
            echo = {CONNECTION_ID: connection_id}
            if session is not None:
                echo[SESSION_ID] = session
            return await mailbox.serve(request, connection.response_headers(echo))

    def _delete(self, request: web.Request) -> web.StreamResponse:
        connection_id = request.headers.get(CONNECTION_ID)
        if not connection_id:
            return _error(400, f"missing {CONNECTION_ID} header")
        connection = self.connections.get(connection_id)
        if connection is None:
            return _error(404, f"unknown {CONNECTION_ID}")
        self._forget(connection)
        connection.terminate()
        return web.Response(status=202)

    def _forget(self, connection: HttpConnection) -> None:
        """The connection id is unknown from now on (404), its idle timer stopped."""
        if self.connections.get(connection.connection_id) is connection:
            del self.connections[connection.connection_id]
        if connection.idle_timer is not None:
            connection.idle_timer.cancel()
            connection.idle_timer = None

    # -- idle connections ------------------------------------------------------------------------

    def _watch_idle(self, connection: HttpConnection) -> None:
        """End ``connection`` once its Client has been idle for ``idle_timeout``: no request
        served (a stream it reads is one), none of its requests awaiting an answer."""
        self._look_at(connection, connection.last_active + self.config.idle_timeout, False)

    def _look_at(self, connection: HttpConnection, when: float, was_busy: bool) -> None:
        loop = asyncio.get_running_loop()
        connection.idle_timer = loop.call_at(when, self._check_idle, connection, was_busy)

    def _check_idle(self, connection: HttpConnection, was_busy: bool) -> None:
        connection.idle_timer = None
        if self.connections.get(connection.connection_id) is not connection:
            return
        if connection.closed:  # its link ended: the id is forgotten, if no request came since
            self._forget(connection)
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        timeout = self.config.idle_timeout
        waits = self._client_waits is not None and self._client_waits(connection)
        if connection.reading(now, timeout) or waits:
            # Busy now: look again soon, and count the idle time from when it no longer is.
            self._look_at(connection, now + timeout / 4, True)
            return
        if was_busy:
            connection.last_active = max(connection.last_active, now)
        if now - connection.last_active < timeout:
            self._look_at(connection, connection.last_active + timeout, False)
            return
        self._forget(connection)
        connection.abort_receivers()  # a stream its Client does not read would never end
        connection.terminate()
        self._observer.observe(LimitReached("idle", "listener"))
        log.info(
            "idle client connection ended",
            connection=connection.connection_id[:8],
            idle_timeout_s=timeout,
        )

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        ws = MaskedOnlyWebSocketResponse(
            # aiohttp 3.14 refuses a message of exactly max_msg_size, older ones take one byte
            # more: one above the limit here, and the endpoint refuses what exceeds the limit.
            max_msg_size=self.config.max_message_bytes + 1,
            decode_text=False,
            autoping=True,
            compress=False,  # as toward the Agent: nothing is re-compressed hop by hop
        )
        if not ws.can_prepare(request).ok:  # refused before any Agent is started for it
            return _error(
                400,
                "not a WebSocket upgrade: it needs GET, Connection: Upgrade, Upgrade: websocket, "
                "Sec-WebSocket-Key and Sec-WebSocket-Version: 13",
            )
        connection_id = secrets.token_hex(16)
        ws.headers[CONNECTION_ID] = connection_id
        endpoint = WsServerEndpoint(ws, connection_id, self.config.max_message_bytes)
        cookies = SetCookies()
        prepared = False
        try:
            # The Agent first, so that the 101 carries the cookies it set on its own handshake.
            refused = await self._on_connection(endpoint, request.headers, cookies)
            if refused is not None and refused.reason == "full":
                cookies.close()
                return _busy(refused)  # no upgrade: the Client hears the status
            for value in cookies.take():
                ws.headers.add(hdrs.SET_COOKIE, value)
            cookies.close()  # past the 101, no response is left to carry a cookie
            await ws.prepare(request)
            prepared = True
        except ConnectionError as exc:  # the Client left while the Agent was being connected
            log.info("the client left before its upgrade was answered", error=str(exc))
            return ws
        finally:
            endpoint.opened(prepared)
        if refused is not None:
            if self.closing or refused.reason == "closing":
                await ws.close(code=1001, message=SHUTTING_DOWN.encode())
            else:
                await ws.close(code=1011, message=refused.message.encode())
            return ws
        with contextlib.suppress(asyncio.CancelledError):
            await endpoint.wait_closed()
        return ws
