"""The proxy as a Streamable HTTP Client of an Agent (``--upstream http://...``), on aiohttp.

It speaks as the SDK Clients do (wire brief 1.2): the first message (``initialize``) is POSTed
without a connection id and answered 200 with the response as the body and an
``Acp-Connection-Id`` header, which every later request carries; then a GET opens the connection
stream. Other messages are POSTed in order, one at a time (FIFO). A message that names a session
(its ``params.sessionId``, or for an answer the ``params.sessionId`` of the Agent's request it
answers) is POSTed with ``Acp-Session-Id`` equal to it, whatever its method, as the TypeScript
SDK's server requires. The first time a message to or from the Agent names a session, a GET with
``Acp-Session-Id`` opens that session's stream; before a message to the Agent is POSTed, the GET
of its session's stream has been answered, as the TypeScript Client does, so that what the Agent
sends for the session while it handles the message (the history a ``session/load`` replays, the
answer to a ``session/resume``) has a receiver. An Agent that refuses the stream of a session it
does not know yet (the Python SDK's server, before a ``session/load`` or ``session/resume`` of a
session made on another connection) gets the GET again once it has accepted the message; one
that answers 404 to the header itself (the same server, for the same reason) gets the message
once more without it.

A failed POST is reported, not hidden: a request whose POST failed is answered with a JSON-RPC
error -32603 whose ``data`` holds the HTTP status and body (as the TS SDK's Client does); 401,
403, 404 and 410 mean the connection is gone, and the link ends. The end of the connection
stream ends the link; a session stream that ends is opened again when a message names it. At
most ``max_sessions`` session streams (``--max-sessions``) are open at once; a message naming a
session past them is POSTed without a stream for it, counted (``acp_proxy_limit_reached_total``
with ``limit="sessions", where="upstream"``) and, the first time, logged.
Cookies are kept per connection (sticky sessions) and passed back to the Client
(:mod:`proxy.shell.transports.cookies`); the Client's auth headers are passed on.

Every exchange is bounded: the TCP connection by ``connect_timeout``, a POST or DELETE and its
whole answer by ``http_timeout``, a GET until its headers by ``http_timeout`` too (its stream
then lasts as long as the Agent keeps it open). A POST that times out is answered to the Client
as a failed POST (status 504), and the connection goes on: the Agent may only be slow, and may
or may not have acted on the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import hdrs

from proxy.core.commands import FailPost
from proxy.core.jsonrpc import ErrorCode, IdKey, Kind, Message, error_response
from proxy.core.sse import SseDecoder
from proxy.shell.defaults import (
    CONNECT_TIMEOUT,
    HTTP_INBOX_HIGH_WATER,
    HTTP_OUTBOX_HIGH_WATER,
    HTTP_TIMEOUT,
)
from proxy.shell.endpoint import Received, Sliced, bytes_of
from proxy.shell.limits import DEFAULT_MAX_SESSIONS, LimitReached
from proxy.shell.log import get_logger, shorten
from proxy.shell.observers import Observer
from proxy.shell.parsing import Parser
from proxy.shell.transports.cookies import CookieSink
from proxy.shell.transports.http_listener import CONNECTION_ID, SESSION_ID

__all__ = ["HttpUpstream", "connect_http"]

log = get_logger("proxy.http_upstream")

GONE = frozenset({401, 403, 404, 410})
"""POST statuses after which the connection is considered lost (as the TS Client does)."""


@dataclass(frozen=True, slots=True)
class _SessionStream:
    """The GET that holds one session's stream."""

    task: asyncio.Task[None]
    settled: asyncio.Event
    """Set once the GET has been answered (any status) or has ended."""


class _CutShort:
    """A message to POST cut short (``truncate``): routed as the whole of ``data`` is, its
    body the first ``cut`` bytes."""

    __slots__ = ("cut", "data")

    def __init__(self, data: bytes, cut: int) -> None:
        self.data = data
        self.cut = cut

    def __len__(self) -> int:
        return len(self.data)


class HttpUpstream:
    """One Streamable HTTP connection to an Agent."""

    transport = "http"

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        *,
        limit: int,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        http_timeout: float = HTTP_TIMEOUT,
        cookies: CookieSink | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        observer: Observer | None = None,
        parser: Parser | None = None,
    ) -> None:
        self.url = url
        self._parser = parser or Parser(large=None)
        self._max_sessions = max_sessions
        self._observer = observer
        self._cookies = cookies
        self._http = session
        self._limit = limit
        self._headers = dict(headers or {})
        self._seconds = http_timeout
        self._connect_seconds = connect_timeout
        self._timeout = aiohttp.ClientTimeout(total=http_timeout, sock_connect=connect_timeout)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        self.connection_id: str | None = None
        self._inbox: asyncio.Queue[Received | None] = asyncio.Queue()
        self._inbox_size = 0
        self._inbox_room = asyncio.Event()
        self._inbox_room.set()
        self._outbox: asyncio.Queue[bytes | Sliced | _CutShort | None] = asyncio.Queue()
        self._queued = 0
        self._room = asyncio.Event()
        self._room.set()
        self._session_streams: dict[str, _SessionStream] = {}
        self._streams_bound_logged = False
        self._agent_request_sessions: dict[IdKey, str] = {}
        self._ended = False
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._writer = self._spawn(self._write())

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A task that failed unexpectedly (a bug, not a network error: those are handled where
        they happen) is logged, and the connection is cut: the link sees the Agent go, where it
        would otherwise wait for ever on a writer or a stream that is no more."""
        self._tasks.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        log.error(
            "the connection to the agent failed; ending it",
            error=str(error) or type(error).__name__,
            exc_info=error,
        )
        self.sever(flush=False)

    # -- Endpoint --------------------------------------------------------------------------------

    async def receive(self) -> Received | None:
        """The next message from the Agent's streams (or an initialize body)."""
        if self._ended and self._inbox.empty():
            return None
        received = await self._inbox.get()
        if (raw := bytes_of(received)) is not None:
            self._inbox_size -= len(raw)
            if self._inbox_size <= HTTP_INBOX_HIGH_WATER:
                self._inbox_room.set()
        return received

    def send(self, data: bytes) -> None:
        """Queue a message to POST (in order)."""
        if not self._closing:
            self._outbox.put_nowait(data)
            self._queued += len(data)
            if self._queued > HTTP_OUTBOX_HIGH_WATER:
                self._room.clear()

    def send_run(self, messages: Sequence[bytes]) -> None:
        """Queue a POST each (in order)."""
        for data in messages:
            self.send(data)

    def send_cut(self, data: bytes, cut: int) -> None:
        """A POST whose body is the message cut short (its headers those of the whole: its
        session's ``Acp-Session-Id``)."""
        if not self._closing:
            self._outbox.put_nowait(_CutShort(data, cut))
            self._queued += len(data)
            if self._queued > HTTP_OUTBOX_HIGH_WATER:
                self._room.clear()

    def send_sliced(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        """A POST whose body is written in chunks of those sizes (chunked transfer coding)."""
        if not self._closing:
            self._outbox.put_nowait(Sliced(data, sizes, gap))
            self._queued += len(data)
            if self._queued > HTTP_OUTBOX_HIGH_WATER:
                self._room.clear()

    def will_flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    def flush(self) -> None:
        """Nothing: the endpoint's own task writes what is queued."""

    async def drain(self) -> None:
        """Wait while too much waits to be POSTed (an Agent slow to accept slows the Client)."""
        await self._room.wait()

    def receive_ready(self) -> bool:
        """Each message is written on its own: the link drains after every one."""
        return False

    def buffered(self) -> int:
        """Bytes waiting to be POSTed."""
        return self._queued

    def processed(self, failure: FailPost | None) -> None:
        """Nothing to settle."""

    def close(self) -> None:
        """POST what is queued, then DELETE the connection."""
        if not self._closing:
            self._closing = True
            self._outbox.put_nowait(None)

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Drop the connection without DELETE (as a crashed Client would)."""
        self._closing = True
        for task in list(self._tasks):
            if task is not self._writer or not flush:
                task.cancel()
        if flush:
            self._outbox.put_nowait(None)
        self._end()

    async def wait_closed(self) -> None:
        """Wait for the last POST (and the DELETE) to finish, then release the HTTP session."""
        await asyncio.wait([self._writer])  # however it ended; a cancel of ours still raises
        for task in list(self._tasks):
            task.cancel()
        await self._http.close()

    # -- inside ----------------------------------------------------------------------------------

    def _end(self) -> None:
        self._room.set()
        if not self._ended:
            self._ended = True
            self._inbox.put_nowait(None)

    def _session_of(self, message: Message | None) -> str | None:
        """The session a message to the Agent names: its ``params.sessionId``, or for an answer
        the ``params.sessionId`` of the Agent's request it answers."""
        if message is None:
            return None
        if message.kind is Kind.REQUEST or message.kind is Kind.NOTIFICATION:
            return message.session
        if message.id_key is not None:
            return self._agent_request_sessions.pop(message.id_key, None)
        return None

    def _post_headers(self, session: str | None) -> dict[str, str]:
        headers = {**self._headers, "Content-Type": "application/json"}
        if self.connection_id is not None:
            headers[CONNECTION_ID] = self.connection_id
        if session is not None:
            headers[SESSION_ID] = session
        return headers

    async def _write(self) -> None:
        try:
            while (data := await self._outbox.get()) is not None:
                await self._post(data)
                self._queued -= len(data)
                del data  # posted: not kept alive while the next one is awaited
                if self._queued <= HTTP_OUTBOX_HIGH_WATER:
                    self._room.set()
            if self.connection_id is not None and not self._ended:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self._http.delete(
                        self.url,
                        headers={**self._headers, CONNECTION_ID: self.connection_id},
                        timeout=self._timeout,
                    ) as response:
                        self._answered(response)
                        await response.read()
        finally:
            self._end()

    async def _post(self, outgoing: bytes | Sliced | _CutShort) -> None:
        data = outgoing if isinstance(outgoing, bytes) else outgoing.data
        parsed = await self._parser.parse(data)
        message = parsed if isinstance(parsed, Message) else None
        session = self._session_of(message)
        if session is not None and (settled := self._open_stream(session)) is not None:
            await settled.wait()  # bounded: the GET's own timeout until its headers
        headers = self._post_headers(session)
        try:
            status, body = await self._exchange(outgoing, headers)
            if status == 404 and session is not None:
                log.info(
                    "the agent refused Acp-Session-Id (404); POSTing the message again without it",
                    session=session,
                    body=shorten(body),
                )
                del headers[SESSION_ID]
                status, body = await self._exchange(outgoing, headers)
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutError too
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                detail = f"could not connect within {self._connect_seconds:g} s"
            else:
                detail = f"no answer within {self._seconds:g} s"
            log.warning("POST to the agent timed out", error=detail)
            await self._failed(message, 504, detail.encode(), "the POST to the agent timed out")
            if self.connection_id is None:
                self._end()  # initialize never got through: no connection to go on with
            return
        except aiohttp.ClientError as exc:
            log.warning("POST to the agent failed", error=str(exc) or type(exc).__name__)
            text = str(exc) or type(exc).__name__
            await self._failed(message, 502, text.encode(), "the POST to the agent failed")
            self._end()
            return
        if status in (200, 202):
            if session is not None:
                self._open_stream(session)  # refused before the Agent had this message: again
            if body.strip():
                await self._incoming(body)
            return
        log.warning("the agent refused a POST", status=status, body=shorten(body))
        await self._failed(message, status, body)
        if status in GONE or self.connection_id is None:
            self._end()

    async def _exchange(
        self, outgoing: bytes | Sliced | _CutShort, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        """POST ``outgoing``: the status and body of the answer. The answer to ``initialize``
        gives the connection its id and opens its stream."""
        # From a buffer, the body is written in chunks, each waiting for the socket to take
        # the last (as raw bytes, a large body would sit whole in the transport's buffer).
        # In pieces (``slice``), each is a chunk of its own, ``gap`` after the one before.
        payload: io.BytesIO | AsyncIterator[bytes]
        timeout = self._timeout
        if isinstance(outgoing, bytes):
            payload = io.BytesIO(outgoing)
        elif isinstance(outgoing, Sliced):  # its gaps are the fault's, not the Agent's delay
            payload = outgoing.chunks()
            total = self._seconds + outgoing.span()
            timeout = aiohttp.ClientTimeout(total=total, sock_connect=self._connect_seconds)
        else:
            payload = io.BytesIO(outgoing.data[: outgoing.cut])
        async with self._http.post(
            self.url, data=payload, headers=headers, timeout=timeout
        ) as response:
            self._answered(response)
            body = await response.read()
            if self.connection_id is None and response.status == 200:
                self.connection_id = response.headers.get(CONNECTION_ID)
                if self.connection_id is None:
                    log.error("the agent answered initialize without a connection id")
                else:
                    self._spawn(self._stream(None, asyncio.Event()))
            return response.status, body

    async def _failed(
        self, message: Message | None, status: int, body: bytes, why: str | None = None
    ) -> None:
        """Tell the Client its request failed at the HTTP level (no answer is invented).

        ``status`` is the Agent's, or 502 (the POST failed) or 504 (it timed out), with ``why``.
        """
        if message is None or message.kind is not Kind.REQUEST or message.id_token is None:
            return
        text = body.decode("utf-8", "replace")[:2000]
        error = error_response(
            message.id_token,
            ErrorCode.INTERNAL_ERROR,
            why or f"the agent's HTTP endpoint answered {status}",
            {"status": status, "body": text},
        )
        await self._put(error)

    async def _incoming(self, data: Received) -> None:
        if isinstance(data, bytes):
            data = await self._parser.parse(data)  # the relay takes the parse
        if isinstance(data, Message):
            self._watch_sessions(data)
        await self._put(data)

    async def _deliver(self, items: Sequence[Received]) -> None:
        """Queue the messages one chunk of a stream completed (once this returns, nothing here
        refers to them: a stream waiting for its next chunk keeps no message alive)."""
        for item in items:
            await self._incoming(item)

    async def _put(self, data: Received) -> None:
        """Queue ``data`` for the relay, once the inbox is below its high-water mark."""
        while self._inbox_size > HTTP_INBOX_HIGH_WATER:
            self._inbox_room.clear()
            await self._inbox_room.wait()
        if (raw := bytes_of(data)) is not None:
            self._inbox_size += len(raw)
        self._inbox.put_nowait(data)

    def _watch_sessions(self, message: Message) -> None:
        """Open a session stream for each session a message names; remember Agent requests."""
        sessions = []
        if message.session is not None:
            sessions.append(message.session)
            if message.kind is Kind.REQUEST and message.id_key is not None:
                self._agent_request_sessions[message.id_key] = message.session
        result = message.body.get("result")
        if isinstance(result, dict) and isinstance(result.get("sessionId"), str):
            sessions.append(result["sessionId"])
        for session in sessions:
            self._open_stream(session)

    def _open_stream(self, session: str) -> asyncio.Event | None:
        """Open the session's stream unless a GET holds it: an event set once that GET has been
        answered or has ended, or None (no connection yet, or ``max_sessions`` are open)."""
        stream = self._session_streams.get(session)
        if stream is not None and not stream.task.done():
            return stream.settled
        if self.connection_id is None or self._closing:
            return None
        if len(self._session_streams) >= self._max_sessions:
            self._session_streams = {
                key: held for key, held in self._session_streams.items() if not held.task.done()
            }
            if len(self._session_streams) >= self._max_sessions:
                if self._observer is not None:
                    self._observer.observe(LimitReached("sessions", "upstream"))
                if not self._streams_bound_logged:
                    self._streams_bound_logged = True
                    log.warning(
                        "too many session streams open; no stream for more sessions",
                        limit=self._max_sessions,
                        session=session,
                    )
                return None
        settled = asyncio.Event()
        task = self._spawn(self._stream(session, settled))
        task.add_done_callback(lambda _: settled.set())  # cancelled before it ran, too
        self._session_streams[session] = _SessionStream(task, settled)
        return settled

    def _answered(self, response: aiohttp.ClientResponse) -> None:
        """The Agent's response headers are in: the cookies it set go back to the Client too
        (the session's jar keeps them toward the Agent)."""
        if self._cookies is not None:
            self._cookies.add(response.headers.getall(hdrs.SET_COOKIE, ()))

    async def _stream(self, session: str | None, settled: asyncio.Event) -> None:
        """Read one stream (the connection's, or ``session``'s) until it ends; ``settled`` is
        set once its GET has been answered."""
        assert self.connection_id is not None
        headers = {
            **self._headers,
            "Accept": "text/event-stream",
            CONNECTION_ID: self.connection_id,
        }
        if session is not None:
            headers[SESSION_ID] = session
        decoder = SseDecoder(self._limit)
        try:
            async with asyncio.timeout(self._seconds):  # until the headers; not the stream
                response = await self._http.get(
                    self.url, headers=headers, timeout=self._stream_timeout
                )
            async with response:
                self._answered(response)
                settled.set()
                if response.status != 200:
                    refused = log.warning if session is None else log.info  # tried again
                    refused(
                        "the agent refused a stream",
                        status=response.status,
                        session=session,
                    )
                    return
                async for chunk in response.content.iter_any():
                    await self._deliver(decoder.feed(chunk))
                await self._deliver(decoder.eof())
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("a stream from the agent ended", session=session, error=str(exc))
        finally:
            if session is None and not self._closing:
                log.info("the agent's connection stream ended")
                self._end()


async def connect_http(
    url: str,
    *,
    limit: int,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    http_timeout: float = HTTP_TIMEOUT,
    cookies: CookieSink | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    observer: Observer | None = None,
    parser: Parser | None = None,
    tls: ssl.SSLContext | None = None,
) -> HttpUpstream:
    """An HTTP connection to ``url`` (nothing is sent until the Client's initialize); the cookies
    the Agent sets go to ``cookies`` as well; at most ``max_sessions`` session streams
    (``observer`` hears when more are named); ``parser`` parses large messages off the loop;
    an ``https://`` URL is verified by ``tls`` (default: the system's trust store)."""
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.CookieJar(unsafe=True),
        connector=aiohttp.TCPConnector(ssl=tls if tls is not None else True),
    )
    return HttpUpstream(
        url,
        session,
        limit=limit,
        headers=headers,
        connect_timeout=connect_timeout,
        http_timeout=http_timeout,
        cookies=cookies,
        max_sessions=max_sessions,
        observer=observer,
        parser=parser,
    )
