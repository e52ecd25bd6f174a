"""Cookies the Agent sets, carried back to the Client (wire brief 1.2: pass ``Set-Cookie`` on).

The Agent sets cookies on the responses the proxy's upstream connection gets: a WebSocket's
handshake, any HTTP response. The Client can only be given them on a response the listener writes
to it: the ``initialize`` POST's, a later POST's or GET's, a WebSocket's ``101``. One
:class:`SetCookies` per Client connection carries them across: the upstream side :meth:`add` s
each ``Set-Cookie`` value as it arrives, and the listener :meth:`take` s those not given yet for
its next response. A cookie set when no response to the Client is left to carry it (a WebSocket
Client is past its ``101``) is logged (once) and counted in :attr:`SetCookies.undelivered`; the
proxy's own cookie jar keeps every cookie toward the Agent all the same, so stickiness holds
whatever the Client does.

A link's upstream writes to a :class:`CookieRoute`, which leads to its Client connection's
:class:`SetCookies`. Under ``--keep-upstream`` a new Client takes over a kept Agent connection: its
route is pointed at the new connection and gives it the latest value of every cookie the Agent
has set, so the new Client holds what the old one was given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from proxy.shell.log import get_logger

__all__ = ["CookieRoute", "CookieSink", "SetCookies"]

log = get_logger("proxy.cookies")

MAX_PENDING = 64
"""``Set-Cookie`` values kept for the Client at most; an Agent setting more before the Client's
next response loses the oldest (later values of a cookie replace earlier ones in any case)."""


class CookieSink(Protocol):
    """Where an upstream connection puts the ``Set-Cookie`` values the Agent sends."""

    def add(self, values: Iterable[str]) -> None:
        """The Agent set these cookies (the values of its ``Set-Cookie`` headers)."""


class SetCookies:
    """The ``Set-Cookie`` values of one Client connection's Agent, until a response carries them."""

    def __init__(self) -> None:
        self._pending: list[str] = []
        self.closed = False
        """No response to the Client will carry a cookie any more (a WebSocket after its 101)."""
        self.undelivered = 0

    def add(self, values: Iterable[str]) -> None:
        """The Agent set these cookies (the values of its ``Set-Cookie`` headers)."""
        for value in values:
            if self.closed:
                if not self.undelivered:  # once per connection
                    log.warning(
                        "the agent set a cookie after the client's last response; not passed on",
                        cookie=value.split("=", 1)[0][:64],
                    )
                self.undelivered += 1
                continue
            self._pending.append(value)
            if len(self._pending) > MAX_PENDING:
                del self._pending[0]

    def take(self) -> list[str]:
        """The values not given to the Client yet; from now on they are given."""
        taken, self._pending = self._pending, []
        return taken

    def close(self) -> None:
        """No later response will carry a cookie: each one set from now on is counted, not kept."""
        self.closed = True
        self.undelivered += len(self._pending)
        self._pending = []


class CookieRoute:
    """The way from one link's Agent to its Client connection now (a :class:`CookieSink`)."""

    def __init__(self, to: SetCookies) -> None:
        self._to = to
        self._latest: dict[str, str] = {}

    def add(self, values: Iterable[str]) -> None:
        """The Agent set these cookies: on to the Client connection, and remembered by name."""
        values = list(values)
        for value in values:
            name = value.split("=", 1)[0].strip()
            self._latest.pop(name, None)  # the latest value of a name comes last
            self._latest[name] = value
            if len(self._latest) > MAX_PENDING:
                del self._latest[next(iter(self._latest))]
        self._to.add(values)

    def point(self, to: SetCookies) -> None:
        """A new Client connection takes over: it is given every cookie set so far, and the
        later ones. The former connection is closed to cookies."""
        if to is self._to:
            return
        self._to.close()
        self._to = to
        to.add(self._latest.values())
