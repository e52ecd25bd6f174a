"""Bare HTTP to a proxy's control API, for the tests that check what a client library would hide
(status codes, headers, cookies): a request with exactly the headers given, its answer as it came,
and a blocking call run off the event loop so the proxy's output keeps being read meanwhile."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from harness import TIMEOUT

P = ParamSpec("P")
T = TypeVar("T")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


async def off(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking control call in a thread (the event loop keeps reading the proxy)."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kwargs), TIMEOUT)


@dataclass
class Answer:
    """An HTTP answer as it came."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)


def call(
    base: str, method: str, path: str, body: bytes | None = None, token: str | None = None
) -> Answer:
    """One bare HTTP request to the control API (any status is returned, not raised); a body is
    sent as ``application/json``, as the control client sends it."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    http_request = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with OPENER.open(http_request, timeout=TIMEOUT) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, exc.headers, exc.read())


def raw(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One HTTP request with exactly the headers given (``http.client`` adds only ``Host``,
    unless given, and ``Content-Length``)."""
    parts = urlsplit(base)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Answer(response.status, response.msg, response.read())
    finally:
        connection.close()


def assert_error(answer: Answer, status: int, message: str) -> dict[str, Any]:
    """``answer`` is the JSON error ``{"error", "status"}`` with ``status`` and ``message`` in it."""
    assert answer.status == status, answer
    assert answer.headers.get_content_type() == "application/json"
    body: dict[str, Any] = answer.json()
    assert body["status"] == status
    assert message in body["error"], body
    return body
