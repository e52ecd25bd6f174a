"""The control API and ``/metrics`` on ``--admin HOST:PORT`` (DESIGN 9), on aiohttp.

Routes: ``GET /healthz``, ``GET /metrics``, ``GET|PUT|POST /api/rules``,
``DELETE /api/rules/{name}``, ``POST /api/reset``,
``POST /api/actions/{sever|kill_agent|restart_proxy|release}``, ``GET /api/links``,
``GET /api/held``, ``GET /api/held/{id}``, ``POST /api/held/{id}/{release|drop|edit}`` (the
messages ``hold`` rules hold: :mod:`proxy.core.held`), ``GET /api/ledger``,
``GET /api/findings`` and ``GET /api/events`` (SSE of trace records; ``?bodies=1``: with the
messages' bodies), ``PATCH /api/rules/{name}`` (``{"enabled": bool}``) and ``POST /api/rules/text``
(rules as YAML text, located as ``validate`` locates them); the dashboard at ``/`` and its login
(:mod:`proxy.shell.dashboard`). Rules are validated exactly as in a fault file. Every error is
JSON ``{"error": ..., "status": ...}`` (validation errors add ``errors``, each located). The API
can kill agents and drop traffic: it binds to loopback unless told otherwise, and with a token set
every route but ``/healthz`` and the dashboard's page and login needs
``Authorization: Bearer TOKEN`` or the dashboard's login cookie (with its CSRF header on a request
that changes something). Another site's page cannot drive it: every request passes the ``Host``
and ``Origin`` checks of :mod:`proxy.shell.origin_policy`, and a request with a body (or a
``Content-Type``) must say ``application/json`` (415), which no form or ``text/plain`` POST can.
Request bodies are bounded and parsed strictly (no NaN, no deep nesting); the rules routes and the
actions need one (``{}`` for an action's defaults), an edit of a held message too
(``{"body": MESSAGE}``), reset, delete and a held message's release and drop take none; an
action's body is validated like a rule, with strict types and no unknown field. Event streams
end when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import orjson
from aiohttp import hdrs, web
from pydantic import BaseModel, ConfigDict

from proxy.core.actions.kill_agent import SignalNumber
from proxy.core.actions.restart_proxy import Downtime
from proxy.core.actions.sever import CloseCode
from proxy.core.commands import Sever, SignalAgent
from proxy.core.engine import FaultEngine
from proxy.core.errors import ConfigError
from proxy.core.events import Direction, Side
from proxy.core.faultfile import (
    MAX_RULES,
    FaultFileError,
    Rule,
    dump_rules,
    parse_rules_text,
    validate_rules,
    validated,
)
from proxy.core.held import EditRefused, HeldMessage
from proxy.core.splice import member_spans
from proxy.core.sse import KEEPALIVE
from proxy.shell.dashboard import Dashboard
from proxy.shell.defaults import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DROP_GRACE,
    HANDLERS_GRACE,
    KEEPALIVE_SECONDS,
)
from proxy.shell.hostport import authority
from proxy.shell.limits import DEFAULT_HEADER_TIMEOUT, RETRY_AFTER_SECONDS, LimitReached
from proxy.shell.link import Link
from proxy.shell.log import get_logger
from proxy.shell.metrics import Metrics
from proxy.shell.origin_policy import NO_ALLOWANCES, Allowances, OriginPolicy
from proxy.shell.trace import EventFeed, Subscription
from proxy.shell.transports.guarded_site import GuardedSite, HeadGuard

__all__ = [
    "ADMIN_TOKEN_ENV",
    "AdminServer",
    "Runtime",
    "admin_token_from",
    "check_admin_host",
    "check_admin_token",
    "read_admin_token_file",
]

log = get_logger("proxy.admin")

MAX_BODY = 1024 * 1024
"""The largest request body the control API reads."""
ADMIN_TOKEN_ENV = "ACP_PROXY_ADMIN_TOKEN"
"""The environment variable that may give ``--admin-token``."""
MAX_TOKEN_FILE = 4096
"""The largest ``--admin-token-file`` read (a token is one short line)."""
LISTED_BODY_BYTES = 16 * 1024
"""The largest held message whose ``body`` ``GET /api/held`` shows; a larger one's is null, with
``truncated: true`` (``GET /api/held/{id}`` shows it whole)."""
LISTED_HELD = 100
"""The held messages ``GET /api/held`` lists by default (the oldest; ``?limit=N`` for another
number, its ``total`` says how many there are): a hundred bodies of at most 16 KiB each."""
MAX_LISTED_HELD = 10_000
"""The most ``GET /api/held?limit=N`` lists at once."""
HELD_ACTS = ("release", "drop", "edit")
"""What ``POST /api/held/{id}/{act}`` does to a held message."""


class Runtime(Protocol):
    """What the control API acts on: the running links and a restart of the data plane."""

    def links(self) -> list[Link]:
        """The links running now."""
        ...

    def restart(self, downtime: float) -> None:
        """``restart_proxy`` now."""
        ...


def check_admin_host(host: str, *, allow_remote: bool) -> None:
    """Refuse a non-loopback admin address unless the operator explicitly allows it."""
    if allow_remote:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"--admin {host}: the control API can kill agents and drop traffic; it binds to "
            "loopback only, unless --admin-allow-remote is given"
        )


def check_admin_token(token: str, where: str = f"--admin-token (or {ADMIN_TOKEN_ENV})") -> None:
    """Refuse a token that would not guard the API as meant: an empty one (a secret that was never
    filled in must not turn authentication off), or one no ``Authorization`` header can carry
    (whitespace at its ends, control characters). The message never repeats the token."""
    if not token:
        raise ConfigError(
            f"{where} is empty: give a token, or unset it to run the control API without one"
        )
    if token != token.strip() or not token.isprintable():
        raise ConfigError(
            f"{where} has whitespace at its ends or characters that are not printable; "
            "an Authorization header cannot carry it"
        )


def read_admin_token_file(path: Path) -> str:
    """The token in ``--admin-token-file``: its one line, without the line end, checked as
    :func:`check_admin_token` does. No message repeats what the file holds."""
    where = f"--admin-token-file {path}"
    try:
        with path.open("rb") as file:  # a pipe too: --admin-token-file <(pass show acp)
            data = file.read(MAX_TOKEN_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_TOKEN_FILE:
        raise ConfigError(f"{where}: over {MAX_TOKEN_FILE} bytes; it holds one line, the token")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    token = text.removesuffix("\n").removesuffix("\r")
    if "\n" in token:
        raise ConfigError(f"{where}: holds more than one line; it holds one line, the token")
    check_admin_token(token, where)
    return token


def admin_token_from(
    given: str | None, file: Path | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The control API's token, checked: from ``--admin-token`` or ``--admin-token-file`` (not
    both), else from :data:`ADMIN_TOKEN_ENV` in ``environ`` (default ``os.environ``); None
    without any. :class:`~proxy.core.errors.ConfigError` when it cannot guard the API."""
    if file is not None:
        if given is not None:
            raise ConfigError("give --admin-token or --admin-token-file, not both")
        return read_admin_token_file(file)
    if given is None:
        given = (os.environ if environ is None else environ).get(ADMIN_TOKEN_ENV)
    if given is not None:
        check_admin_token(given)
    return given


class ApiError(Exception):
    """An error answered as JSON ``{"error", "status"}``."""

    def __init__(self, status: int, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.errors = errors


class _Body(BaseModel):
    """An action's body: strict JSON types (``true`` is no number, ``"no"`` no boolean), finite
    numbers, no unknown field."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _OnLinks(_Body):
    link: int | None = None
    """One link's id; every link without it."""


class SeverBody(_OnLinks):
    """``POST /api/actions/sever``."""

    side: Literal["client", "agent", "both"] = "both"
    close_code: CloseCode = 1001


class KillAgentBody(_OnLinks):
    """``POST /api/actions/kill_agent``."""

    signal: SignalNumber = int(signal.SIGKILL)
    respawn: bool = False


class RestartProxyBody(_Body):
    """``POST /api/actions/restart_proxy``."""

    downtime_ms: Downtime = 0.0


class RuleChange(_Body):
    """``PATCH /api/rules/{name}``."""

    enabled: bool


class RulesText(_Body):
    """``POST /api/rules/text``: one rule, or a list of them, as YAML (or JSON) text."""

    text: str


class ReleaseBody(_OnLinks):
    """``POST /api/actions/release``: end the ``stall`` faults of the links now."""


ACTIONS = ("sever", "kill_agent", "restart_proxy", "release")
"""The actions ``POST /api/actions/{action}`` carries out."""


B = TypeVar("B", bound=_Body)


class AdminServer:
    """The aiohttp server of ``--admin``."""

    def __init__(
        self,
        runtime: Runtime,
        engine: FaultEngine,
        metrics: Metrics,
        feed: EventFeed,
        *,
        initial_rules: list[Rule],
        token: str | None = None,
        ledger: Callable[[], Any] = lambda: [],
        findings: Callable[[], Any] = lambda: [],
        degraded: Callable[[], dict[str, str]] = dict,
        allowances: Allowances = NO_ALLOWANCES,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        """``degraded``: what no longer works as asked (``{"trace": why}``), for ``/healthz``.
        ``allowances``: the hosts and origins admitted beyond the server's own
        (:mod:`proxy.shell.origin_policy`). ``header_timeout``: seconds a connection has for each
        request head (:mod:`proxy.shell.transports.guarded_site`); the event subscribers are bounded
        by ``feed``. ``max_message_bytes``: the largest edit of a held message
        (``--max-message-bytes``)."""
        self._runtime = runtime
        self._engine = engine
        self._metrics = metrics
        self._feed = feed
        self._initial_rules = list(initial_rules)
        self._token = token
        self._dashboard = Dashboard(token)
        self._ledger = ledger
        self._findings = findings
        self._degraded = degraded
        self._allowances = allowances
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None
        self._closing = asyncio.Event()
        """Set when the server stops: every event stream ends."""
        self._subscribers_logged = False
        self._header_timeout = header_timeout
        self._max_message_bytes = max_message_bytes
        self._loop = asyncio.get_running_loop()
        self._held_since: dict[int, float] = {}
        """When each held message shown so far was held, in Unix seconds, fixed when it is first
        shown: the offset between the wall clock and the loop's, read per answer, moves by a
        microsecond from one read to the next, and a message's times must not (at most
        ``--max-held`` entries: those held no more are forgotten at each listing)."""
        self.port = 0
        self.url = ""
        """Where it serves, once started (``http://HOST:PORT``)."""

    def app(self, bind_host: str, guard: HeadGuard | None = None) -> web.Application:
        """The aiohttp application, checking hosts and origins as bound to ``bind_host`` (and
        telling ``guard`` of each request head)."""
        policy = OriginPolicy("admin", bind_host, self._allowances, self._metrics)
        middlewares = [policy.middleware, self._errors, self._auth, self._json_only]
        if guard is not None:
            middlewares.insert(0, guard.middleware)
        app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
        routes = app.router
        routes.add_get("/healthz", self._healthz)
        routes.add_get("/metrics", self._metrics_route)
        routes.add_get("/api/rules", self._get_rules)
        routes.add_put("/api/rules", self._put_rules)
        routes.add_post("/api/rules", self._post_rule)
        routes.add_delete("/api/rules/{name}", self._delete_rule)
        routes.add_post("/api/reset", self._reset)
        routes.add_post("/api/actions/{action}", self._action)
        routes.add_get("/api/links", self._links)
        routes.add_get("/api/held", self._held_list)
        routes.add_get("/api/held/{id}", self._held_one)
        routes.add_post("/api/held/{id}/{act}", self._held_act)
        routes.add_get("/api/ledger", self._get_ledger)
        routes.add_get("/api/findings", self._get_findings)
        routes.add_get("/api/events", self._events)
        routes.add_patch("/api/rules/{name}", self._change_rule)
        routes.add_post("/api/rules/text", self._post_rules_text)
        self._dashboard.add_routes(app)
        return app

    async def start(self, host: str, port: int, *, serve: bool = True) -> None:
        """Bind (port 0 picks one, in :attr:`port`) and serve (``serve`` false: listen, the
        connections waiting until :meth:`serve`)."""
        guard = HeadGuard("admin", self._header_timeout, self._metrics)
        self._runner = web.AppRunner(
            self.app(host, guard),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=HANDLERS_GRACE,
            keepalive_timeout=self._header_timeout,
        )
        await self._runner.setup()
        self._site = GuardedSite(self._runner, host, port, guard)
        await self._site.start(serve=serve)
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{authority(host, self.port)}"
        if serve:
            log.info("control API listening", url=self.url)

    async def serve(self) -> None:
        """Answer requests (after ``start(serve=False)``): those that waited, then the rest."""
        if self._site is not None:
            await self._site.serve()
            log.info("control API listening", url=self.url)

    async def stop(self) -> None:
        """Stop serving: every event stream ends (the records queued for it written, then the end
        of its response); requests still running get ``HANDLERS_GRACE`` seconds."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- middlewares ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return _json_error(exc.status, str(exc), exc.errors)
        except web.HTTPRequestEntityTooLarge:
            return _json_error(413, f"request body over {MAX_BODY} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _json_error(exc.status, exc.reason)
            raise

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._token is not None and request.path != "/healthz":
            # As bytes: a header that is not UTF-8 (kept by aiohttp as lone surrogates) is just
            # another wrong token.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            expected = f"Bearer {self._token}".encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected) and not self._dashboard.public(request):
                refused = self._dashboard.refusal(request)  # or the dashboard's login
                if refused is not None and given:
                    raise ApiError(401, "the bearer token is not this proxy's admin token")
                if refused is not None:
                    raise ApiError(*refused)
        return await handler(request)

    @web.middleware
    async def _json_only(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A request with a body, or that names its type, is JSON: a page's form or ``text/plain``
        POST (which a browser sends anywhere without asking) never reaches a route."""
        typed = hdrs.CONTENT_TYPE in request.headers
        if (request.body_exists or typed) and request.content_type != "application/json":
            raise ApiError(415, "Content-Type must be application/json")
        return await handler(request)

    # -- routes ----------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 while the proxy relays, ``degraded`` (with what and why) when its trace or state
        file failed: the relay goes on, and a probe must not restart it for that."""
        body: dict[str, Any] = {"status": "ok", "links": len(self._runtime.links())}
        if degraded := self._degraded():
            body["status"] = "degraded"
            body["degraded"] = degraded
        return web.json_response(body)

    async def _metrics_route(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._metrics.exposition(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    def _rules_body(self) -> dict[str, Any]:
        states = self._engine.states
        return {
            "rules": dump_rules(self._engine.rules),
            "counters": {
                name: {"matched": state.matched, "fired": state.fired}
                for name, state in states.items()
            },
        }

    async def _get_rules(self, request: web.Request) -> web.Response:
        return web.json_response(self._rules_body())

    async def _put_rules(self, request: web.Request) -> web.Response:
        body = await _body(request)
        data = body.get("rules") if isinstance(body, dict) else body
        self._engine.replace(_rules(data))
        return web.json_response(self._rules_body())

    async def _post_rule(self, request: web.Request) -> web.Response:
        body = await _body(request)
        return self._add(_rules([body]))

    async def _post_rules_text(self, request: web.Request) -> web.Response:
        """Rules written as YAML, errors located in the text as ``acp-proxy validate`` does."""
        text = _action_body(RulesText, await _body(request)).text
        try:
            rules = parse_rules_text(text)
        except FaultFileError as exc:
            raise ApiError(400, "invalid rules", [str(error) for error in exc.errors]) from None
        return self._add(rules)

    def _add(self, rules: list[Rule]) -> web.Response:
        """Add ``rules`` at the end (201), or refuse them all (409)."""
        names = {existing.name for existing in self._engine.rules}
        for rule in rules:
            if rule.name in names:
                raise ApiError(409, f"a rule named {rule.name!r} already exists")
        if len(self._engine.rules) + len(rules) > MAX_RULES:
            raise ApiError(409, f"there are {MAX_RULES:,} rules already: the most a run holds")
        self._engine.replace([*self._engine.rules, *rules])
        return web.json_response(self._rules_body(), status=201)

    async def _change_rule(self, request: web.Request) -> web.Response:
        """Enable or disable one rule (its counters stay)."""
        change = _action_body(RuleChange, await _body(request))
        name = request.match_info["name"]
        rules = self._engine.rules
        if not any(rule.name == name for rule in rules):
            raise ApiError(404, f"no rule named {name!r}")
        self._engine.replace(
            rule.model_copy(update={"enabled": change.enabled}) if rule.name == name else rule
            for rule in rules
        )
        log.info("rule changed over the control API", rule=name, enabled=change.enabled)
        return web.json_response(self._rules_body())

    async def _delete_rule(self, request: web.Request) -> web.Response:
        await _no_body(request)
        name = request.match_info["name"]
        rules = self._engine.rules
        if not any(rule.name == name for rule in rules):
            raise ApiError(404, f"no rule named {name!r}")
        self._engine.replace([rule for rule in rules if rule.name != name])
        return web.json_response(self._rules_body())

    async def _reset(self, request: web.Request) -> web.Response:
        """The rules of the fault files again, every counter at zero."""
        await _no_body(request)
        self._engine.replace(self._initial_rules)
        self._engine.reset()
        return web.json_response(self._rules_body())

    async def _action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        if action not in ACTIONS:
            raise ApiError(404, f"unknown action {action!r}: {', '.join(ACTIONS)}")
        body = await _body(request, empty=" ({} for the defaults)")
        if not isinstance(body, dict):
            raise ApiError(400, "the body is a JSON object")
        if action == "restart_proxy":
            downtime = _action_body(RestartProxyBody, body).downtime_ms
            self._runtime.restart(downtime / 1000)
            log.warning("restart requested over the control API", downtime_ms=downtime)
            return web.json_response({"action": action, "downtime_ms": downtime})
        if action == "release":
            links = self._selected(_action_body(ReleaseBody, body).link)
            released = sum(link.release_stalls() for link in links)
            log.info("release over the control API", links=[x.id for x in links], stalls=released)
            ids = [link.id for link in links]
            return web.json_response({"action": action, "links": ids, "stalls": released})
        if action == "sever":
            sever = _action_body(SeverBody, body)
            links = self._selected(sever.link)
            sides = [Side.CLIENT, Side.AGENT] if sever.side == "both" else [Side(sever.side)]
            for link in links:
                link.inject([Sever(s, flush=False, close_code=sever.close_code) for s in sides])
        else:
            kill = _action_body(KillAgentBody, body)
            links = self._selected(kill.link)
            for link in links:
                link.inject([SignalAgent(kill.signal, kill.respawn)])
        log.warning("action over the control API", action=action, links=[link.id for link in links])
        return web.json_response({"action": action, "links": [link.id for link in links]})

    def _selected(self, wanted: int | None) -> list[Link]:
        links = self._runtime.links()
        if wanted is None:
            return links
        chosen = [link for link in links if link.id == wanted]
        if not chosen:
            raise ApiError(404, f"no link {wanted!r}")
        return chosen

    async def _links(self, request: web.Request) -> web.Response:
        return web.json_response({"links": [_describe(link) for link in self._runtime.links()]})

    async def _held_list(self, request: web.Request) -> web.Response:
        """The messages ``hold`` rules hold now, oldest first, at most ``?limit=N`` of them
        (:data:`LISTED_HELD` by default), and how many there are (``total``); a large one
        without its body."""
        limit = _held_limit(request.query.get("limit"))
        held = [
            (message.id, link, message)
            for link in self._runtime.links()
            for message in link.held_messages()
        ]
        held.sort(key=lambda entry: entry[0])
        ids = {entry[0] for entry in held}
        self._held_since = {i: since for i, since in self._held_since.items() if i in ids}
        listed = b",".join(
            _held_entry(link, message, self._since(message), full=False)
            for _, link, message in held[:limit]
        )
        return _json_text(b'{"held":[' + listed + b'],"total":' + str(len(held)).encode() + b"}")

    async def _held_one(self, request: web.Request) -> web.Response:
        """One held message, its body whole."""
        link, message = self._holding(request.match_info["id"])
        return _json_text(_held_entry(link, message, self._since(message), full=True))

    def _since(self, held: HeldMessage) -> float:
        """When ``held`` was held, in Unix seconds as the trace's: the relay's time plus the
        offset of the wall clock read when the message is first shown (the wall clock may have
        been set since the proxy started), the same at every later read."""
        since = self._held_since.get(held.id)
        if since is None:
            since = self._held_since[held.id] = time.time() - self._loop.time() + held.at
        return since

    async def _held_act(self, request: web.Request) -> web.Response:
        """Release, drop or edit one held message: 404 for an id never given, 409 for one held
        no more, 400 for an edit that cannot replace it."""
        act = request.match_info["act"]
        if act not in HELD_ACTS:
            raise ApiError(404, f"unknown act {act!r}: {', '.join(HELD_ACTS)}")
        link, message = self._holding(request.match_info["id"])
        if act == "edit":
            data = _edit_message(await request.read())
            try:
                done = link.edit_held(message.id, data, self._max_message_bytes)
            except EditRefused as exc:
                raise ApiError(400, str(exc)) from None
        else:
            await _no_body(request)
            settle = link.release_held if act == "release" else link.drop_held
            done = settle(message.id)
        if not done:  # its link ended meanwhile
            raise ApiError(409, _held_no_more(message.id))
        log.info("held message over the control API", held_id=message.id, act=act, link=link.id)
        return web.json_response({"id": message.id, "link": link.id, "outcome": act})

    def _holding(self, given: str) -> tuple[Link, HeldMessage]:
        """The link holding the message of id ``given``, and that message; 404 for an id no
        message was given, 409 for one held no more."""
        try:
            held_id = int(given)
        except ValueError:
            raise ApiError(404, f"no held message {given!r}: ids are whole numbers") from None
        for link in self._runtime.links():
            for message in link.held_messages():
                if message.id == held_id:
                    return link, message
        if self._engine.held_ids.issued(held_id):
            raise ApiError(409, _held_no_more(held_id))
        raise ApiError(404, f"no held message {held_id}")

    async def _get_ledger(self, request: web.Request) -> web.Response:
        return web.json_response({"ledger": self._ledger()})

    async def _get_findings(self, request: web.Request) -> web.Response:
        return web.json_response({"findings": self._findings()})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """The live trace records; a subscriber too many gets 503, one that does not read is
        dropped (:class:`~proxy.shell.trace.EventFeed`) and its stream ends with a comment saying
        so."""
        bodies = request.query.get("bodies") == "1"
        # Subscribed before the headers: one that has them is fed.
        subscription = self._feed.subscribe(bodies=bodies)
        if subscription is None:
            return self._too_many_subscribers()
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        loop = asyncio.get_running_loop()
        closing = loop.create_task(self._closing.wait())
        dropped = loop.create_task(subscription.dropped.wait())
        pump: asyncio.Task[None] | None = None
        try:
            await response.prepare(request)
            pump = loop.create_task(_pump(subscription, response))
            await asyncio.wait((pump, closing, dropped), return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                pump.result()  # the Client left (ConnectionError)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            if subscription.dropped.is_set():
                await _end_dropped(request, response, self._feed.backlog)
            else:
                events = subscription.events
                while not events.empty():  # what was observed before the end, then the end
                    await response.write(events.get_nowait())
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for task in (pump, closing, dropped):
                if task is not None:
                    task.cancel()
            self._feed.unsubscribe(subscription)
        return response

    def _too_many_subscribers(self) -> web.Response:
        self._metrics.observe(LimitReached("event_subscribers", "admin"))
        limit = self._feed.max_subscribers
        if not self._subscribers_logged:
            self._subscribers_logged = True
            log.warning(
                "event subscriber refused: at --max-event-subscribers",
                max_event_subscribers=limit,
                further="counted, not logged",
            )
        response = _json_error(
            503,
            f"{limit} event subscribers already, the most there may be "
            "(--max-event-subscribers); try again later",
        )
        response.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER_SECONDS)
        return response


async def _pump(subscription: Subscription, response: web.StreamResponse) -> None:
    """Write a subscription's events as they come, a keep-alive comment after a quiet while."""
    events = subscription.events
    while True:
        try:
            event = await asyncio.wait_for(events.get(), KEEPALIVE_SECONDS)
        except TimeoutError:
            event = KEEPALIVE
        await response.write(event)


async def _end_dropped(request: web.Request, response: web.StreamResponse, backlog: int) -> None:
    """End a dropped subscriber's stream with a comment saying why. A Client that does not read
    has :data:`DROP_GRACE` seconds to take it; then, or if it is still not written out, its
    connection is cut (a socket nobody reads would never flush)."""
    comment = f": dropped: {backlog} records waited for this subscriber, unread\n\n".encode()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DROP_GRACE):
            await response.write(comment)
            await response.write_eof()
    transport = request.transport
    if transport is not None and transport.get_write_buffer_size():
        transport.abort()


def _json_error(status: int, message: str, errors: list[str] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message, "status": status}
    if errors:
        body["errors"] = errors
    return web.json_response(body, status=status)


async def _body(request: web.Request, *, empty: str = "") -> Any:
    """The request's JSON, parsed strictly: no NaN or Infinity, no number beyond a double, at
    most 1024 levels deep, UTF-8 without lone surrogates (an integer past 64 bits is read as a
    float: no rule or action field takes one). ``empty``: what to send instead of none."""
    raw = await request.read()
    if not raw.strip():
        raise ApiError(400, f"a JSON body is required{empty}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None


def _reject_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: ``NaN``, ``Infinity`` and ``-Infinity`` are no JSON."""
    raise ValueError(f"{name} is not valid JSON")


async def _no_body(request: web.Request) -> None:
    """Refuse a body where the route takes none: it would be ignored, as a typo would."""
    if (await request.read()).strip():
        raise ApiError(400, f"{request.method} {request.path} takes no body")


def _rules(data: Any) -> list[Rule]:
    if not isinstance(data, list):
        raise ApiError(400, "rules are a JSON list (or an object with a 'rules' list)")
    try:
        return validate_rules(data)
    except FaultFileError as exc:
        raise ApiError(400, "invalid rules", [str(error) for error in exc.errors]) from None


def _action_body(model: type[B], body: dict[str, Any]) -> B:
    try:
        return validated(model, body)
    except FaultFileError as exc:
        raise ApiError(400, "invalid body", [str(error) for error in exc.errors]) from None


def _held_no_more(held_id: int) -> str:
    """The error of an act on a message that was held but is held no more (409)."""
    return (
        f"message {held_id} is held no more: released, dropped, edited, timed out, or its link "
        "ended"
    )


def _edit_message(raw: bytes) -> bytes:
    """The message an edit's body ``{"body": MESSAGE}`` gives: MESSAGE's bytes exactly as the
    request wrote them (never parsed and written again, so that an integer past 64 bits, a
    number's spelling and the order of members stay as the user sent them). The body must be
    JSON (no NaN or Infinity) with that one member."""
    if not raw.strip():
        raise ApiError(400, 'a JSON body is required ({"body": MESSAGE})')
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise ApiError(400, f"the body is not JSON: {exc}") from None
        try:  # valid JSON orjson refuses: a number beyond a double, a lone surrogate escape
            body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            raise ApiError(400, f"the body is not JSON: {exc}") from None
    shape = 'an edit\'s body is {"body": MESSAGE}, MESSAGE the new JSON-RPC message'
    if not isinstance(body, dict) or set(body) != {"body"}:
        raise ApiError(400, shape)
    try:
        spans = member_spans(raw, "body")
    except ValueError as exc:  # ScanLimit: past the steps a scan may take
        raise ApiError(400, f"the body is too complex to read: {exc}") from None
    if len(spans) != 1:
        raise ApiError(400, shape + " (one body member)")
    start, end = spans[0]
    return raw[start:end]


def _held_limit(given: str | None) -> int:
    """``GET /api/held?limit=N``: how many to list (:data:`LISTED_HELD` when not given)."""
    if given is None:
        return LISTED_HELD
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LISTED_HELD:
        raise ApiError(400, f"limit is a whole number from 1 to {MAX_LISTED_HELD}, not {given!r}")
    return limit


def _json_text(text: bytes) -> web.Response:
    """An answer whose JSON is written already."""
    return web.Response(body=text, content_type="application/json")


def _held_entry(link: Link, held: HeldMessage, since: float, *, full: bool) -> bytes:
    """What the API shows of a held message, as JSON text; its times in Unix seconds from
    ``since`` (when it was held), as the trace's. Its ids and body are the bytes its sender
    wrote, spliced in (never parsed and written again: an integer past 64 bits stays exact).
    Not ``full``: the body of a message over :data:`LISTED_BODY_BYTES` is left out."""
    shown = full or len(held.data) <= LISTED_BODY_BYTES
    relayed = held.relayed
    members: list[tuple[bytes, bytes]] = [
        (b"id", orjson.dumps(held.id)),
        (b"link", orjson.dumps(link.id)),
        (b"rule", orjson.dumps(held.rule)),
        (b"direction", orjson.dumps(relayed.direction.value)),
        (b"kind", orjson.dumps(relayed.kind.value)),
        (b"method", orjson.dumps(relayed.method)),
        (b"session", orjson.dumps(relayed.session)),
        (b"jsonrpc_id", _json_id(relayed.original_id)),
        (b"forwarded_id", _json_id(relayed.forwarded_id)),
        (b"size", orjson.dumps(relayed.size)),
        (b"held_since", orjson.dumps(since)),
        (b"deadline", orjson.dumps(since + (held.deadline - held.at))),
        (b"timeout_ms", orjson.dumps(held.timeout * 1000)),
        (b"then", orjson.dumps(held.then)),
        (b"body", held.data if shown else b"null"),
        (b"truncated", orjson.dumps(not shown)),
    ]
    return b"{" + b",".join(b'"%s":%s' % member for member in members) + b"}"


def _json_id(token: bytes | None) -> bytes:
    """An id as JSON text: its token as its sender wrote it (``null`` for none)."""
    return b"null" if token is None else token


def _describe(link: Link) -> dict[str, Any]:
    sides = {}
    for side in Side:
        endpoint = link.endpoints[side]
        info: dict[str, Any] = {"transport": endpoint.transport}
        pid = getattr(endpoint, "pid", None)
        if isinstance(pid, int):
            info["pid"] = pid
        sides[side.value] = info
    return {
        "id": link.id,
        **sides,
        "pending": {direction.value: link.relay.pending(direction) for direction in Direction},
        "held": {direction.value: link.relay.held(direction) for direction in Direction},
    }
