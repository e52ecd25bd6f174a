"""The dashboard's server side: the page, its assets and headers, the login, its cookie and CSRF.

Each test but the last runs a real proxy process with its control API (the ``controlled``
fixture) and speaks bare HTTP to it (``http.client``: exactly the headers a test gives), as a
browser would: the cookie in a ``Cookie`` header, the page's origin in ``Origin``. The browser
itself drives the page in ``test_dashboard_browser.py``. :class:`Logins` (pure bookkeeping, with a
clock passed in) is checked without sockets.
"""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from control_calls import Answer, assert_error, off, raw
from harness import Controlled, encode, raw_agent

from proxy.shell.dashboard import ASSETS, CSP, CSRF_HEADER, Logins
from proxy.shell.defaults import DASHBOARD_LOGIN_SECONDS, DASHBOARD_LOGINS

TOKEN = "s3cret-dashboard-token"
RULE = {"name": "lose-a", "when": {"method": "_x/a"}, "do": {"action": "drop"}}


def host_of(base: str) -> str:
    return urlsplit(base).netloc


def login(base: str, token: str = TOKEN, origin: str | None = None) -> Answer:
    headers = {"Host": host_of(base), "Content-Type": "application/json"}
    if origin is not None:
        headers["Origin"] = origin
    return raw(base, "POST", "/api/login", encode({"token": token}), headers)


def set_cookie(answer: Answer) -> str:
    """The one ``Set-Cookie`` header of an answer."""
    [header] = answer.headers.get_all("Set-Cookie") or []
    return header


def cookie_of(base: str, answer: Answer) -> tuple[str, str]:
    """The login cookie an answer set: its name and value (the attributes are checked apart)."""
    header = set_cookie(answer)
    cookie = SimpleCookie(header)
    [(name, morsel)] = cookie.items()
    assert name == f"acp_proxy_login_{urlsplit(base).port}"
    return name, morsel.value


def as_browser(
    base: str,
    method: str,
    path: str,
    cookie: tuple[str, str] | None,
    body: dict[str, Any] | None = None,
    *,
    csrf: str | None = None,
    origin: str | None = "same",
) -> Answer:
    """A request as the page sends it: its cookie, its origin, its CSRF header when given."""
    headers = {"Host": host_of(base)}
    if cookie is not None:
        headers["Cookie"] = f"{cookie[0]}={cookie[1]}"
    if origin is not None:
        headers["Origin"] = base if origin == "same" else origin
    if csrf is not None:
        headers[CSRF_HEADER] = csrf
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = encode(body)
    return raw(base, method, path, data, headers)


def csrf_in(page: Answer) -> str:
    match = re.search(rb'<meta name="acp-csrf" content="([^"]*)">', page.body)
    assert match is not None, page.body[:300]
    return match.group(1).decode()


async def test_a_login_sets_a_cookie_that_opens_the_api_and_logout_ends_it(
    controlled: Controlled, capture: Path
) -> None:
    """With a token: ``/`` is the login page; the token posted as JSON (the right one only)
    gives an HttpOnly, SameSite=Strict cookie that is not the token; with it ``/`` is the
    dashboard and the API answers; a change needs the login's CSRF header too; logout ends the
    login and clears the cookie."""
    _, control = await controlled(raw_agent(capture), "--admin-token", TOKEN, token=TOKEN)
    base = control.base_url
    page = await off(as_browser, base, "GET", "/", None, origin=None)
    assert page.status == 200
    assert b"/dashboard/login.js" in page.body
    assert b"dashboard.js" not in page.body
    for wrong in ("wrong", TOKEN[:-1], TOKEN.upper(), ""):
        assert_error(await off(login, base, wrong), 401, "wrong token")
    assert_error(
        await off(
            raw,
            base,
            "POST",
            "/api/login",
            b"token=" + TOKEN.encode(),
            {"Host": host_of(base), "Content-Type": "application/x-www-form-urlencoded"},
        ),
        415,
        "Content-Type must be application/json",
    )
    answer = await off(login, base)
    assert answer.status == 200
    header = set_cookie(answer)
    attributes = {part.strip().split("=")[0].lower() for part in header.split(";")}
    assert {"httponly", "path", "samesite", "max-age"} <= attributes
    assert "SameSite=Strict" in header
    assert "Path=/" in header
    assert f"Max-Age={int(DASHBOARD_LOGIN_SECONDS)}" in header
    cookie = cookie_of(base, answer)
    assert TOKEN not in cookie[1]
    assert len(cookie[1]) >= 40

    page = await off(as_browser, base, "GET", "/", cookie, origin=None)
    assert b"/dashboard/dashboard.js" in page.body
    assert page.headers["Cache-Control"] == "no-store"
    csrf = csrf_in(page)
    assert len(csrf) >= 40
    assert csrf != cookie[1]
    assert (await off(as_browser, base, "GET", "/api/rules", cookie)).json()["rules"] == []
    events = await off(as_browser, base, "GET", "/api/links", cookie)
    assert events.status == 200

    refused = await off(as_browser, base, "POST", "/api/rules", cookie, RULE)
    assert_error(refused, 403, f"needs its {CSRF_HEADER} header")
    refused = await off(as_browser, base, "POST", "/api/rules", cookie, RULE, csrf="forged")
    assert_error(refused, 403, f"needs its {CSRF_HEADER} header")
    assert await off(control.rules) == []  # nothing was added
    added = await off(as_browser, base, "POST", "/api/rules", cookie, RULE, csrf=csrf)
    assert added.status == 201
    assert (
        await off(as_browser, base, "DELETE", "/api/rules/lose-a", cookie, csrf=csrf)
    ).status == 200

    out = await off(as_browser, base, "POST", "/api/logout", cookie, csrf=csrf)
    assert out.status == 200
    cleared = set_cookie(out)
    assert cleared.startswith(f'{cookie[0]}=""') or cleared.startswith(f"{cookie[0]}=;")
    assert "Max-Age=0" in cleared
    assert_error(
        await off(as_browser, base, "GET", "/api/rules", cookie),
        401,
        "a bearer token is required (or a login to the dashboard)",
    )
    page = await off(as_browser, base, "GET", "/", cookie, origin=None)
    assert b"/dashboard/login.js" in page.body


async def test_a_cross_site_login_or_change_is_refused(
    controlled: Controlled, capture: Path
) -> None:
    """A page of another origin can neither log in (even with the right token) nor change
    anything with the user's cookie and the right CSRF token: the Origin check refuses both."""
    _, control = await controlled(raw_agent(capture), "--admin-token", TOKEN, token=TOKEN)
    base = control.base_url
    evil = "http://evil.example"
    refused = await off(login, base, TOKEN, evil)
    assert_error(refused, 403, "origin http://evil.example is not allowed")
    assert refused.headers.get_all("Set-Cookie") is None
    cookie = cookie_of(base, await off(login, base, TOKEN, base))
    csrf = csrf_in(await off(as_browser, base, "GET", "/", cookie, origin=None))
    forged = await off(as_browser, base, "POST", "/api/rules", cookie, RULE, csrf=csrf, origin=evil)
    assert_error(forged, 403, "origin http://evil.example is not allowed")
    assert await off(control.rules) == []


async def test_every_answer_carries_a_strict_policy_and_no_asset_reaches_outside(
    controlled: Controlled, capture: Path
) -> None:
    """The page, its assets, the API's answers and its errors carry the CSP (no inline script,
    no framing) and ``nosniff``; every asset is served with its type, and none names a URL of
    another origin, an inline script or style, or an event handler attribute."""
    _, control = await controlled(raw_agent(capture))
    base = control.base_url
    names = sorted(path.name for path in ASSETS.iterdir())
    assert {"index.html", "login.html", "dashboard.js", "login.js", "dashboard.css"} <= set(names)
    types = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
    for name in names:
        text = (ASSETS / name).read_text()
        assert not re.search(r"(?i)(?:https?:|wss?:)?//[a-z0-9.-]+\.[a-z]", text), name
        assert "@import" not in text, name
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=)", text), name
            assert not re.search(r"\s(?:on\w+|style)=", text), name
        if name == "index.html":
            continue
        answer = await off(as_browser, base, "GET", f"/dashboard/{name}", None, origin=None)
        assert answer.status == 200, name
        assert answer.headers.get_content_type() == types[Path(name).suffix]
        assert answer.body == (ASSETS / name).read_bytes()
    for path in ("/", "/dashboard/dashboard.js", "/api/rules", "/dashboard/nope.js", "/metrics"):
        answer = await off(as_browser, base, "GET", path, None, origin=None)
        assert answer.headers["Content-Security-Policy"] == CSP, path
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["X-Frame-Options"] == "DENY"
    assert "script-src 'self';" in CSP
    assert "frame-ancestors 'none'" in CSP
    assert "unsafe-inline" not in CSP
    assert_error(
        await off(as_browser, base, "GET", "/dashboard/nope.js", None), 404, "no dashboard file"
    )
    assert_error(
        await off(as_browser, base, "GET", "/dashboard/..%2Fdashboard.py", None),
        404,
        "no dashboard file",
    )


async def test_without_a_token_the_dashboard_is_open_and_there_is_no_login(
    controlled: Controlled, capture: Path
) -> None:
    """No token: ``/`` is the dashboard at once (an empty CSRF token: no cookie to guard) and
    ``/api/login`` is a 404."""
    _, control = await controlled(raw_agent(capture))
    base = control.base_url
    page = await off(as_browser, base, "GET", "/", None, origin=None)
    assert b"/dashboard/dashboard.js" in page.body
    assert csrf_in(page) == ""
    assert_error(await off(login, base, "anything", base), 404, "no token is set")


def test_logins_are_bounded_in_number_and_in_time() -> None:
    """A login past the bound ends the oldest; a login past its lifetime is gone; logout ends
    one; a value never given (or empty) finds none."""
    now = [0.0]
    logins = Logins(limit=3, lifetime=100.0, clock=lambda: now[0])
    values = [logins.open()[0] for _ in range(4)]
    assert logins.find(values[0]) is None  # the oldest made room
    assert all(logins.find(value) is not None for value in values[1:])
    assert len(logins) == 3
    logins.close(values[1])
    assert logins.find(values[1]) is None
    now[0] = 100.0
    assert logins.find(values[2]) is None
    assert len(logins) == 0
    assert logins.find("") is None
    assert logins.find(None) is None
    assert logins.find("never-given") is None
    assert (DASHBOARD_LOGINS, DASHBOARD_LOGIN_SECONDS) == (16, 12 * 3600.0)


@pytest.mark.parametrize("body", [b'"s3cret"', b'{"token": 1}', b'{"token": "x", "more": 1}', b"{"])
async def test_a_login_body_that_is_not_a_token_is_a_400(
    controlled: Controlled, capture: Path, body: bytes
) -> None:
    """The login takes ``{"token": "..."}`` and nothing else."""
    _, control = await controlled(raw_agent(capture), "--admin-token", TOKEN, token=TOKEN)
    base = control.base_url
    headers = {"Host": host_of(base), "Content-Type": "application/json"}
    answer = await off(raw, base, "POST", "/api/login", body, headers)
    assert answer.status == 400
    assert answer.headers.get_all("Set-Cookie") is None
