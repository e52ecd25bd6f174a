"""What one peer can make the proxy hold, bounded (DESIGN 10): each limit, its default, and what
is counted when it refuses.

Every bound here is a ``run`` option (docs/security.md, "Limits"). A bound that refuses
something, or ends something a peer held, is observed as a :class:`LimitReached` and counted in
``acp_proxy_limit_reached_total{limit,where}``; what the peer hears is each owner's business (the
listener, the control API, the upstream transport), and each owner logs the first refusal of a
run of them, not every one.
"""

from __future__ import annotations

from typing import Literal

from proxy.core.errors import at_least
from proxy.core.observations import Observation
from proxy.core.relay import DEFAULT_MAX_PENDING
from proxy.core.values import value
from proxy.shell.defaults import MIN_TIMEOUT
from proxy.shell.inflight import DEFAULT_MAX_INFLIGHT_BYTES

__all__ = [
    "COUNTED",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_EVENT_SUBSCRIBERS",
    "DEFAULT_MAX_HELD",
    "DEFAULT_MAX_LINKS",
    "DEFAULT_MAX_SESSIONS",
    "EVENT_BACKLOG",
    "RECORD_BACKLOG",
    "RETRY_AFTER_SECONDS",
    "LimitName",
    "LimitReached",
    "Limits",
    "Where",
]

LimitName = Literal[
    "links",
    "idle",
    "sessions",
    "header_time",
    "descriptors",
    "event_subscribers",
    "event_backlog",
    "pending",
    "inflight_bytes",
    "record_backlog",
]
"""Which bound: ``links`` (a Client refused for ``--max-links``), ``idle`` (an HTTP Client
connection ended after ``--idle-timeout``), ``sessions`` (a session over ``--max-sessions`` on
one connection), ``header_time`` (a TCP connection closed for ``--header-timeout``),
``descriptors`` (an ``accept()`` that failed for want of file descriptors),
``event_subscribers`` (an ``/api/events`` subscriber refused for ``--max-event-subscribers``),
``event_backlog`` (a subscriber dropped for not reading), ``pending`` (a request answered -32603
for ``--max-pending``), ``inflight_bytes`` (a POST answered 503 for ``--max-inflight-bytes``),
``record_backlog`` (a message left out of ``--record``'s recording: its writer fell behind)."""

Where = Literal["listener", "admin", "upstream", "link"]
"""Where it was reached: the Clients' listener, the control API, toward an HTTP Agent, or in a
link (either direction)."""

COUNTED: tuple[tuple[LimitName, Where], ...] = (
    ("links", "listener"),
    ("idle", "listener"),
    ("sessions", "listener"),
    ("sessions", "upstream"),
    ("header_time", "listener"),
    ("header_time", "admin"),
    ("descriptors", "listener"),
    ("descriptors", "admin"),
    ("event_subscribers", "admin"),
    ("event_backlog", "admin"),
    ("pending", "link"),
    ("inflight_bytes", "listener"),
    ("record_backlog", "link"),
)
"""Every pair that can be counted (scraped at 0 until it happens)."""

DEFAULT_MAX_LINKS = 100
"""Links alive at once on a listener (``--max-links``). A link may be an Agent process of tens to
hundreds of MB: a lab drives a handful of Clients at once, and 100 leaves room for a load test of
an Agent while a runaway Client (a loop of ``initialize``) stops at 100 Agents, not at the
machine's memory."""
DEFAULT_IDLE_TIMEOUT = 300.0
"""Seconds an HTTP Client connection may stay idle (``--idle-timeout``). The SDK Clients hold
their connection stream open the whole time, which is activity; five minutes outlast any pause of
a Client that means to come back, and free an abandoned connection's Agent soon after."""
DEFAULT_MAX_SESSIONS = 1024
"""Sessions one connection may name (``--max-sessions``): as many buffered session streams as the
TypeScript SDK's server keeps per connection."""
DEFAULT_HEADER_TIMEOUT = 20.0
"""Seconds a TCP connection has to send a complete request head, from its opening or from the
end of its previous response (``--header-timeout``). An idle keep-alive socket is closed after
as long: longer than the keep-alive of common HTTP Clients (aiohttp 15 s, undici 4 s, httpx 5 s),
so no Client reuses a socket just as the proxy closes it; short enough that a peer that dribbles
a head, or connects and says nothing, holds its descriptor 20 s at most."""
DEFAULT_MAX_HELD = 1000
"""Messages ``hold`` rules may hold at once across the proxy (``--max-held``); past it a hold
rule does not act and the message goes on as if it had not matched (counted in
``acp_proxy_faults_overflow_total``, the first refusal logged). A person at the dashboard or a
test acts on a handful; a thousand leaves room for a script that holds a burst, while a rule that
holds what it should not (every ``session/update``) stops there: each held message costs the
proxy about a kilobyte beyond its bytes (20,000 small ones took 24.5 MB), which
``--max-inflight-bytes`` counts but cannot bound."""
DEFAULT_MAX_EVENT_SUBSCRIBERS = 32
"""``GET /api/events`` streams at once (``--max-event-subscribers``): dashboards and test
harnesses, a few at a time; each costs the relay a copy of every record."""
EVENT_BACKLOG = 1024
"""Trace records waiting for one ``/api/events`` subscriber; one more and it is dropped."""
RECORD_BACKLOG = 10_000
"""Messages waiting for the recording's writer (``--record``); one more is left out of the
recording (counted, logged), so a disk slower than the relay costs the relay this many bodies'
memory and then nothing."""
RETRY_AFTER_SECONDS = 5
"""``Retry-After`` of a 503 for a limit that frees itself when another peer leaves."""


@value(kw_only=True)
class Limits:
    """The bounds of a run, as the options gave them (each refused below its least value)."""

    max_links: int = DEFAULT_MAX_LINKS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_sessions: int = DEFAULT_MAX_SESSIONS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    max_event_subscribers: int = DEFAULT_MAX_EVENT_SUBSCRIBERS
    max_pending: int = DEFAULT_MAX_PENDING
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    max_active_faults: int | None = None
    max_held: int = DEFAULT_MAX_HELD

    def __post_init__(self) -> None:
        at_least("--max-links", self.max_links, 1)
        at_least("--idle-timeout", self.idle_timeout, MIN_TIMEOUT)
        at_least("--max-sessions", self.max_sessions, 1)
        at_least("--header-timeout", self.header_timeout, MIN_TIMEOUT)
        at_least("--max-event-subscribers", self.max_event_subscribers, 1)
        at_least("--max-pending", self.max_pending, 1)
        at_least("--max-inflight-bytes", self.max_inflight_bytes, 1)
        if self.max_active_faults is not None:
            at_least("--max-active-faults", self.max_active_faults, 0)
        at_least("--max-held", self.max_held, 0)


DEFAULT_LIMITS = Limits()


@value
class LimitReached(Observation):
    """A bound refused something, or ended what a peer held (counted, never traced)."""

    limit: LimitName
    where: Where
