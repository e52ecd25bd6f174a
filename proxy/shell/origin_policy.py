"""Who may use the proxy's HTTP servers from a web browser: the ``Host`` and ``Origin`` checks.

A web page in the user's browser can send requests to any address, loopback included: a form or
a ``fetch`` to the control API, a WebSocket to the listener, a page whose DNS name was rebound to
127.0.0.1. Two headers tell such requests apart, and both servers (the listener of
:mod:`proxy.shell.transports.http_listener` and the control API of :mod:`proxy.shell.admin`) check
them on every request, before any route runs (the WebSocket upgrade too: no Agent is started for a
refused one):

* ``Host`` must name the address the server is bound to: its bind host; for a loopback bind
  ``localhost``, ``127.0.0.1`` and ``[::1]`` as well; for a wildcard bind (``0.0.0.0``, ``::``)
  any IP address or ``localhost``. A rebound page sends its own name: refused. The port is not
  checked: a tunnel or a port mapping (``ssh -L``, ``kubectl port-forward``, ``docker -p``)
  changes the port a Client uses, and only a page served by this server could send its name with
  the bound port anyway (the ``Origin`` check names the port). More names are given with
  ``--allow-host NAME`` (any port) or ``NAME:PORT``; they are names of this machine, so the
  listener and the control API share them. A ``Host`` without a port names the scheme's default
  one (80, or 443 for a listener in TLS).
* ``Origin``, when present (a browser sends it on every WebSocket upgrade, on POST and on
  cross-origin requests), must be the server's own (``http://`` and the request's ``Host``;
  ``https://`` for a listener in TLS, :mod:`proxy.shell.tls`) or
  one given with ``--allow-origin`` (``--admin-allow-origin`` for the control API: trusting a web
  Client with ACP must not hand it the faults); ``*`` admits every page, which is dangerous.
  Requests without an ``Origin`` (the SDKs, curl) do not come from a page, and are accepted.

A refused request gets 403 with a JSON body naming the reason. Each refused value is logged once
(the first :data:`MAX_LOGGED` of them) and every refusal is counted
(``acp_proxy_refused_requests_total{server,reason}``). No ``Access-Control-Allow-*`` header is
ever sent: a preflight grants nothing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from aiohttp import hdrs, web

from proxy.core.errors import ConfigError
from proxy.core.observations import Observation
from proxy.core.values import value
from proxy.shell.log import get_logger

if TYPE_CHECKING:
    from proxy.shell.observers import Observer

__all__ = [
    "HOST_OPTION",
    "NO_ALLOWANCES",
    "ORIGIN_OPTIONS",
    "Allowances",
    "OriginPolicy",
    "RequestRefused",
    "Server",
    "parse_allowed_host",
    "parse_allowed_origin",
]

log = get_logger("proxy.origin")

Server = Literal["listener", "admin"]
HOST_OPTION = "--allow-host"
ORIGIN_OPTIONS: dict[Server, str] = {"listener": "--allow-origin", "admin": "--admin-allow-origin"}
"""The option that admits more origins, per server (named in each refusal)."""
ANY_ORIGIN = "*"
MAX_LOGGED = 256
"""Distinct refused values logged, per server; past them refusals are only counted."""
SHOWN = 100
"""Characters of a refused header value repeated in an answer or a log line."""
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::"})

_AUTHORITY = r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._~-]+))(?::(?P<port>[0-9]{1,5}))?"
HOST_SYNTAX = re.compile(_AUTHORITY)
"""``HOST[:PORT]``: a name or an IPv4 address, or an IPv6 address in brackets; nothing else (no
user, path or percent-escape that could make one host read as another)."""
ORIGIN_SYNTAX = re.compile(rf"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://{_AUTHORITY}")


@value
class RequestRefused(Observation):
    """A request was refused for its ``Host`` or its ``Origin`` (counted, never traced)."""

    server: Server
    reason: Literal["host", "origin"]


@value
class Allowances:
    """What the user opened up, as given on the command line (checked by the policy)."""

    hosts: tuple[str, ...] = ()
    """``--allow-host``: ``NAME`` (any port) or ``NAME:PORT``."""
    origins: tuple[str, ...] = ()
    """``--allow-origin`` (``--admin-allow-origin``): ``scheme://host[:port]``, ``null``, ``*``."""


NO_ALLOWANCES = Allowances()
"""Only the server's own address and origin."""


def _canonical(host: str) -> str:
    """A host as compared: an IP address in its canonical form, a name in lower case without a
    trailing dot."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _authority(match: re.Match[str]) -> tuple[str, int | None] | None:
    """(host, port) of a match of :data:`_AUTHORITY`; None for an invalid IPv6 address or port."""
    v6, port = match["v6"], match["port"]
    if v6 is not None and not _is_ip(v6):
        return None
    number = int(port) if port is not None else None
    if number is not None and number > 65535:
        return None
    return _canonical(v6 if v6 is not None else match["name"]), number


def _host(text: str) -> tuple[str, int | None] | None:
    """(host, port or None) of a ``Host`` value, or None when it is not ``HOST[:PORT]``."""
    match = HOST_SYNTAX.fullmatch(text)
    return _authority(match) if match is not None else None


def _origin(text: str) -> str | None:
    """An origin as compared (lower case, the scheme's default port left out), ``null`` as
    itself; None when ``text`` is neither."""
    if text == "null":
        return text
    match = ORIGIN_SYNTAX.fullmatch(text)
    authority = _authority(match) if match is not None else None
    if match is None or authority is None:
        return None
    scheme = match["scheme"].lower()
    host, port = authority
    shown = f"[{host}]" if ":" in host else host
    if port is not None and port != DEFAULT_PORTS.get(scheme):
        shown = f"{shown}:{port}"
    return f"{scheme}://{shown}"


def parse_allowed_host(text: str) -> tuple[str, int | None]:
    """An ``--allow-host`` value: ``(host, port)``, port None for any."""
    parsed = _host(text)
    if parsed is None:
        raise ConfigError(
            f"{HOST_OPTION}: expected NAME or NAME:PORT (an IPv6 address in brackets), got {text!r}"
        )
    return parsed


def parse_allowed_origin(text: str, *, option: str = ORIGIN_OPTIONS["listener"]) -> str:
    """An ``--allow-origin`` value as compared: ``scheme://host[:port]``, ``null`` or ``*``."""
    if text == ANY_ORIGIN:
        return text
    parsed = _origin(text)
    if parsed is None:
        raise ConfigError(
            f"{option}: expected an origin such as https://app.example or http://localhost:3000 "
            f"(no path), null or *, got {text!r}"
        )
    return parsed


def _shown(value: str) -> str:
    return value if len(value) <= SHOWN else value[:SHOWN] + "..."


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OriginPolicy:
    """The ``Host`` and ``Origin`` checks of one server (see the module), as aiohttp middleware."""

    def __init__(
        self,
        server: Server,
        bind_host: str,
        allowances: Allowances = NO_ALLOWANCES,
        observer: Observer | None = None,
        *,
        secure: bool = False,
    ) -> None:
        """``bind_host``: the host the server binds (as ``--listen`` or ``--admin`` gave it);
        ``secure``: it serves TLS (its own pages are ``https://``).

        Raises :class:`~proxy.core.errors.ConfigError` for an allowance that does not parse.
        """
        self.server = server
        self._scheme = "https" if secure else "http"
        self._origin_option = ORIGIN_OPTIONS[server]
        bind = _canonical(bind_host)
        self._wildcard = bind in WILDCARDS
        loopback = bind == "localhost" or (_is_ip(bind) and ipaddress.ip_address(bind).is_loopback)
        self._names = frozenset({bind, *(LOOPBACK_NAMES if loopback else ())})
        self._hosts = frozenset(parse_allowed_host(host) for host in allowances.hosts)
        self._origins = frozenset(
            parse_allowed_origin(origin, option=self._origin_option)
            for origin in allowances.origins
        )
        self._observer = observer
        self._logged: set[tuple[str, str]] = set()
        if ANY_ORIGIN in self._origins:
            log.warning(
                "every origin is allowed: any web page the user opens may use this server",
                server=server,
                option=f"{self._origin_option} '*'",
            )

    def refusal(
        self, host: str | None, origin: str | None
    ) -> tuple[Literal["host", "origin"], str] | None:
        """Why a request with these ``Host`` and ``Origin`` headers is refused: the reason and
        the message; None when it is accepted."""
        if host is None:
            return "host", f"a Host header is required (see {HOST_OPTION})"
        parsed = _host(host)
        if parsed is None or not self._host_allowed(*parsed):
            return "host", f"host {_shown(host)} is not allowed (see {HOST_OPTION})"
        if origin is not None and not self._origin_allowed(origin, host):
            return "origin", f"origin {_shown(origin)} is not allowed (see {self._origin_option})"
        return None

    def _host_allowed(self, name: str, port: int | None) -> bool:
        given = DEFAULT_PORTS[self._scheme] if port is None else port
        if (name, None) in self._hosts or (name, given) in self._hosts:
            return True
        if self._wildcard:
            return name == "localhost" or _is_ip(name)
        return name in self._names

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if ANY_ORIGIN in self._origins:
            return True
        canonical = _origin(origin)
        if canonical is None:
            return False
        return canonical in self._origins or canonical == _origin(f"{self._scheme}://{host}")

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse (403) a request the policy does not accept; pass the others on."""
        headers = request.headers
        host, origin = headers.get(hdrs.HOST), headers.get(hdrs.ORIGIN)
        refused = self.refusal(host, origin)
        if refused is None:
            return await handler(request)
        reason, message = refused
        self._note(reason, (host if reason == "host" else origin) or "", message)
        return web.json_response({"error": message, "status": 403}, status=403)

    def _note(self, reason: Literal["host", "origin"], value: str, message: str) -> None:
        """Count a refusal; log it the first time its value is seen."""
        if self._observer is not None:
            self._observer.observe(RequestRefused(self.server, reason))
        key = (reason, value[:SHOWN])
        if key in self._logged or len(self._logged) > MAX_LOGGED:
            return
        self._logged.add(key)
        if len(self._logged) > MAX_LOGGED:
            log.warning(
                "more refused requests; from now on they are counted, not logged",
                server=self.server,
            )
            return
        log.warning("request refused", server=self.server, reason=reason, detail=message)
