"""The dashboard: a live page at ``/`` on the admin port, and the login that guards it.

The page and its scripts are files of the package (:data:`ASSETS`: no CDN, nothing fetched from
elsewhere; it works offline). It reads the control API like any client: ``/api/events?bodies=1``
for the live records, ``/api/rules``, ``/api/links``, ``/api/findings``, ``/api/held``.

Routes: ``GET /`` (the page, or the login page), ``GET /dashboard/{asset}``, ``POST /api/login``
and ``POST /api/logout``. With a token set (``--admin-token``), ``/`` without a login shows the
login page; it posts the token as JSON (``{"token": ...}``; the control API takes no other body)
to ``/api/login``, which compares it in constant time and answers with a cookie: HttpOnly,
SameSite=Strict, Path=/, named after the port (cookies are shared by every port of a host), whose
value is a random login id kept in memory, never the token. The control API then accepts either
``Authorization: Bearer TOKEN`` or that cookie (:meth:`Dashboard.refusal`). A request that
changes something (any method but GET and HEAD) authenticated by the cookie must also carry the
login's own CSRF token in :data:`CSRF_HEADER`, which the page reads from a ``meta`` tag of its
HTML; that is on top of the ``Origin`` and ``Host`` checks every request passes
(:mod:`proxy.shell.origin_policy`) and of SameSite=Strict. ``/api/logout`` ends the login and
clears the cookie. Logins are bounded (:data:`~proxy.shell.defaults.DASHBOARD_LOGINS`, a new one
past them ends the oldest) and last :data:`~proxy.shell.defaults.DASHBOARD_LOGIN_SECONDS`. Without
a token the page is as open as the API, and ``/api/login`` is a 404. The token never travels in a
URL.

Every answer of the admin port carries a strict Content-Security-Policy (:data:`CSP`: scripts,
styles and connections from the page's own origin only, no inline script, no framing),
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from proxy.shell.defaults import DASHBOARD_LOGIN_SECONDS, DASHBOARD_LOGINS

__all__ = ["ASSETS", "COOKIE", "CSP", "CSRF_HEADER", "SECURITY_HEADERS", "Dashboard", "Logins"]

ASSETS = Path(__file__).with_name("dashboard_assets")
"""The page's files, shipped in the package."""
COOKIE = "acp_proxy_login_"
"""The login cookie's name, before the port it is for."""
CSRF_HEADER = "X-CSRF-Token"
"""The header that carries a login's CSRF token on a request that changes something."""
CSRF_PLACEHOLDER = b"{{csrf}}"
"""Where ``index.html`` takes the login's CSRF token."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The Content-Security-Policy of every answer."""
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
SAFE_METHODS = frozenset({"GET", "HEAD"})
MAX_LOGIN_BODY = 4096
"""The largest login body read (a token is one short line)."""


@dataclass(slots=True)
class Login:
    """One browser's login: its CSRF token and when it ends (monotonic seconds)."""

    csrf: str
    ends: float


class Logins:
    """The logins of one proxy, in memory: at most ``limit`` (a new one past them ends the
    oldest), each for ``lifetime`` seconds. Kept by a digest of the cookie's value, so that no
    lookup compares the secret itself."""

    def __init__(
        self,
        limit: int = DASHBOARD_LOGINS,
        lifetime: float = DASHBOARD_LOGIN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.lifetime = lifetime
        self._clock = clock
        self._logins: dict[bytes, Login] = {}

    def open(self) -> tuple[str, Login]:
        """A new login: the cookie's value and the login."""
        self._forget_ended()
        while len(self._logins) >= self.limit:
            del self._logins[next(iter(self._logins))]  # the oldest
        value = secrets.token_urlsafe(32)
        login = Login(secrets.token_urlsafe(32), self._clock() + self.lifetime)
        self._logins[_digest(value)] = login
        return value, login

    def find(self, value: str | None) -> Login | None:
        """The login of a cookie's value, while it lasts."""
        if not value:
            return None
        key = _digest(value)
        login = self._logins.get(key)
        if login is not None and login.ends <= self._clock():
            del self._logins[key]
            return None
        return login

    def close(self, value: str | None) -> None:
        """End the login of a cookie's value (nothing if there is none)."""
        if value:
            self._logins.pop(_digest(value), None)

    def __len__(self) -> int:
        self._forget_ended()
        return len(self._logins)

    def _forget_ended(self) -> None:
        now = self._clock()
        for key in [key for key, login in self._logins.items() if login.ends <= now]:
            del self._logins[key]


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class Dashboard:
    """The page, its assets and its logins, for the admin server (:mod:`proxy.shell.admin`)."""

    def __init__(self, token: str | None, logins: Logins | None = None) -> None:
        """``token``: the control API's (None: no login, the page is open like the API)."""
        self._token = token
        self.logins = logins or Logins()
        self._assets = {
            path.name: path.read_bytes()
            for path in ASSETS.iterdir()
            if path.suffix in CONTENT_TYPES
        }

    def add_routes(self, app: web.Application) -> None:
        """The dashboard's routes, and its headers on every answer of ``app``."""
        app.router.add_get("/", self._page)
        app.router.add_get("/dashboard/{asset}", self._asset)
        app.router.add_post("/api/login", self._login)
        app.router.add_post("/api/logout", self._logout)
        app.on_response_prepare.append(_secure)

    @staticmethod
    def public(request: web.Request) -> bool:
        """Whether a request needs no token: the page (it shows the login without one), its
        assets (which hold no secret) and the login itself."""
        path = request.path
        return path in ("/", "/api/login") or path.startswith("/dashboard/")

    def refusal(self, request: web.Request) -> tuple[int, str] | None:
        """Why a request without the bearer token is refused (status, message); None when its
        login cookie is valid and, for a request that changes something, it carries the login's
        CSRF token."""
        login = self.logins.find(request.cookies.get(_cookie_name(request)))
        if login is None:
            return 401, "a bearer token is required (or a login to the dashboard)"
        if request.method not in SAFE_METHODS:
            given = request.headers.get(CSRF_HEADER, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, login.csrf.encode()):
                return 403, f"a request of the dashboard's login needs its {CSRF_HEADER} header"
        return None

    async def _page(self, request: web.Request) -> web.Response:
        csrf = ""
        if self._token is not None:
            login = self.logins.find(request.cookies.get(_cookie_name(request)))
            if login is None:
                return self._file("login.html")
            csrf = login.csrf
        page = self._assets["index.html"].replace(
            CSRF_PLACEHOLDER, html.escape(csrf, quote=True).encode()
        )
        return web.Response(
            body=page, headers={"Content-Type": CONTENT_TYPES[".html"], "Cache-Control": "no-store"}
        )

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        if name not in self._assets or name == "index.html":
            raise web.HTTPNotFound(reason=f"no dashboard file {name!r}")
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        content_type = CONTENT_TYPES[Path(name).suffix]
        return web.Response(
            body=self._assets[name],
            headers={"Content-Type": content_type, "Cache-Control": "no-cache"},
        )

    async def _login(self, request: web.Request) -> web.Response:
        """``{"token": ...}`` -> a login cookie (the token compared in constant time)."""
        if self._token is None:
            raise web.HTTPNotFound(reason="no token is set: the dashboard needs no login")
        raw = await request.content.read(MAX_LOGIN_BODY + 1)
        given = _token_of(raw)
        expected = self._token.encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected):
            raise web.HTTPUnauthorized(reason="wrong token")
        self.logins.close(request.cookies.get(_cookie_name(request)))
        value, _ = self.logins.open()
        response = web.json_response({"login": True})
        response.set_cookie(
            _cookie_name(request),
            value,
            max_age=int(self.logins.lifetime),
            path="/",
            httponly=True,
            samesite="Strict",
        )
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        """End the login of the request's cookie and clear it (authenticated like any route)."""
        name = _cookie_name(request)
        self.logins.close(request.cookies.get(name))
        response = web.json_response({"login": False})
        response.del_cookie(name, path="/", samesite="Strict")
        return response


def _token_of(raw: bytes) -> str:
    """The token of a login's body, ``{"token": "..."}``; 400 for anything else."""
    if len(raw) > MAX_LOGIN_BODY:
        raise web.HTTPBadRequest(reason=f"a login's body is at most {MAX_LOGIN_BODY} bytes")
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(reason='the body is JSON: {"token": "..."}') from None
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or set(body) != {"token"}:
        raise web.HTTPBadRequest(reason='the body is {"token": "..."}')
    return token


def _cookie_name(request: web.Request) -> str:
    """The login cookie of the port the browser used (a browser sends a host's cookies to every
    port of it: two proxies on one machine keep a login each)."""
    return f"{COOKIE}{request.url.port or 80}"


async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
    """:data:`SECURITY_HEADERS` on an answer, whatever its route."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
