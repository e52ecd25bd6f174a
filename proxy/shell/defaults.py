"""The shell's defaults and fixed timings, each once, with why it has that value.

The command line's options default to these, :class:`~proxy.shell.app.RunOptions` too, and the
README's tables state them (``tests/shell/test_defaults.py`` keeps them in step). The bounds an
operator sets with the limit options (``--max-links``, ``--idle-timeout``...) have theirs in
:mod:`proxy.shell.limits`, next to :class:`~proxy.shell.limits.Limits`; the one of the core's
relay (``--max-pending``) is :data:`proxy.core.relay.DEFAULT_MAX_PENDING`; the guard of orphaned
process groups, a script that imports nothing of the proxy, keeps its own
(:data:`proxy.shell.transports.orphans.MAX_GRACE`).
"""

from __future__ import annotations

__all__ = [
    "AGENT_EXIT_WAIT",
    "AGENT_GRACE",
    "CONNECT_TIMEOUT",
    "DASHBOARD_LOGINS",
    "DASHBOARD_LOGIN_SECONDS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DROP_GRACE",
    "HANDLERS_GRACE",
    "HELD_HIGH_WATER",
    "HTTP_INBOX_HIGH_WATER",
    "HTTP_OUTBOX_HIGH_WATER",
    "HTTP_TIMEOUT",
    "INITIALIZE_TIMEOUT",
    "KEEPALIVE_SECONDS",
    "LARGE_MESSAGE_BYTES",
    "MIN_TIMEOUT",
    "PARSING_WORKERS",
    "PIPE_BYTES",
    "SHUTDOWN_TIMEOUT",
    "STALL_SECONDS",
    "STREAM_HIGH_WATER",
    "WEBSOCKET_HIGH_WATER",
    "WORKER_MESSAGE_BYTES",
    "WORKER_MESSAGE_VALUES",
    "WRITE_SLICE",
]

# -- the dashboard ------------------------------------------------------------------------------

DASHBOARD_LOGINS = 16
"""Dashboard logins (browser sessions) a proxy keeps at once; a new one past them ends the
oldest. A person has a browser or two on it: sixteen never shut anyone out, and a script that
logs in in a loop holds sixteen random values, not more."""

DASHBOARD_LOGIN_SECONDS = 12 * 3600.0
"""How long a dashboard login lasts (its cookie's ``Max-Age`` too): a working day, after which
the page asks for the token again."""

# -- options (each an option's default) ----------------------------------------------------------

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The bound on one message, on every transport (``--max-message-bytes``; DESIGN 10): far above
any ACP message (a prompt with an embedded image is a few MiB), low enough that a peer cannot
make the proxy buffer without end."""

PIPE_BYTES = 256 * 1024
"""The room a stdio proxy asks of each pipe between it and its Client and Agent (``--pipe-bytes``;
:func:`~proxy.shell.descriptors.widen_pipe`): four times the 64 KiB a pipe holds by default. A
64 KiB prompt then crosses each pipe in one write and one read: 10-20% of its round trip through
the proxy (docs/bench.md). The kernel charges pipes to their user (``pipe-user-pages-soft``, 64
MiB by default) and, past that, makes the user's new pipes hold 8 KiB: a stdio proxy's four
pipes take 1 MiB of it, as sixteen pipes of the default size do, so 64 proxies may run at once
before it is reached (pipes of 1 MiB, Linux's bound for a process without privileges, saved a 1
MB prompt 8% more, and reach it at 16). A proxy serving a network listener, one Agent per link,
leaves its Agents' pipes as the system makes them."""

LARGE_MESSAGE_BYTES = 64 * 1024
"""Messages this large may be parsed in a worker process (:mod:`proxy.shell.parsing`), not on
the event loop. Parsing costs the loop about 4 ms per MB of text and up to 120 ms per MB of tiny
containers (``[],[],...``), so a smaller message holds the other links 8 ms at worst; most ACP
messages are a few KiB and never pay the worker's round trip (a millisecond idle, several on a
busy machine)."""

WORKER_MESSAGE_BYTES = 256 * 1024
"""Messages this large are always parsed in a worker. Between :data:`LARGE_MESSAGE_BYTES` and
this, a message goes to a worker only when it holds :data:`WORKER_MESSAGE_VALUES` values or
more: a 100 KiB prompt of one long text costs the loop about 0.4 ms to parse in place, far less
than the worker's round trip, while 256 KiB of tiny containers would cost it 30 ms."""

WORKER_MESSAGE_VALUES = 4096
"""Values from which a message under :data:`WORKER_MESSAGE_BYTES` is parsed in a worker: about
1.5 ms of parsing at the costliest shape, so that no message parsed in place holds the loop
longer than that and its text (1 ms). A message with fewer bytes than this outside its strings
(in a few strings: a long text) is parsed in place; another is counted, as the bytes ``,``,
``[`` and ``{`` (each opens a container or separates two values; one inside a string counts all
the same) (:mod:`proxy.core.parse_cost`)."""

WRITE_SLICE = 256 * 1024
"""The most a pipe's writer copies into its buffer in one turn of the event loop: a message of
many MB is written a slice at a time, each once the peer has read the one before (a copy of
60 MB at once held every other link for tens of ms); a slice costs the loop well under 1 ms."""

PARSING_WORKERS = 2
"""Worker processes that parse large messages, started on the first one: two large messages
are parsed at once while a third waits; messages below :data:`LARGE_MESSAGE_BYTES` never wait
for them."""

AGENT_GRACE = 5.0
"""Seconds a spawned Agent gets to exit after its stdin closes or a signal, before SIGTERM, then
SIGKILL (``--agent-grace``): an Agent that flushes its state and exits needs well under a
second; five leave room for a loaded machine without holding a shutdown for long."""

AGENT_EXIT_WAIT = 2.0
"""Seconds to wait, once a spawned Agent's output has ended, for its exit status, to say why it
ended (a WebSocket Client's close reason, the reference Client's error); an Agent still running
then is taken for one that ended cleanly."""

CONNECT_TIMEOUT = 10.0
"""Seconds to reach a network Agent (``--connect-timeout``): the TCP connection and, for a
WebSocket, its opening handshake. A loopback or LAN Agent answers in milliseconds; 10 s leaves
room for a cold container or a congested link, and a dead address fails well before a Client
gives up."""

INITIALIZE_TIMEOUT = 30.0
"""Seconds the Agent has to answer ``initialize`` (``--initialize-timeout``). An Agent answers
it in milliseconds once it runs; 30 s cover a slow start (an ``npx`` download, a cold JIT), and a
Client is told before its own patience ends."""

HTTP_TIMEOUT = 120.0
"""Seconds one exchange with an HTTP Agent may take (``--http-timeout``): a POST or DELETE until
its whole answer has been read, a GET until its headers. An Agent answers a POST at once (202; a
request's answer comes on a stream) except ``initialize``, whose answer is the POST's body; two
minutes cover an Agent that starts slowly or a loaded machine, and a dead one is noticed."""

SHUTDOWN_TIMEOUT = 15.0
"""Seconds the links get to end after SIGTERM or SIGINT, before they are cut
(``--shutdown-timeout``): enough for a spawned Agent's default grace (:data:`AGENT_GRACE` after
EOF, then as much after SIGTERM) and the last writes."""

MIN_TIMEOUT = 0.001
"""The least a timeout option takes (``--connect-timeout``, ``--idle-timeout``...): a millisecond;
zero or less would give up before anything could answer."""

# -- fixed timings -------------------------------------------------------------------------------

HANDLERS_GRACE = 2.0
"""Seconds the requests still being served when an HTTP server (the listener, the control API)
stops get to finish (their links have ended by then, so they are only writing their last bytes);
then their connections close."""

KEEPALIVE_SECONDS = 15.0
"""Seconds of silence on an SSE stream (a Client's, ``/api/events``) before a comment is sent:
under the 30 to 60 s after which proxies and load balancers commonly close an idle connection."""

DROP_GRACE = 1.0
"""Seconds a dropped event subscriber's last comment may take to be written."""

STALL_SECONDS = 1.0
"""How long a peer may leave the proxy waiting to write before it is logged as stalled."""

# -- high-water marks (bytes held before a reader waits) -----------------------------------------

HELD_HIGH_WATER = 8 * 1024 * 1024
"""Bytes a link's timers may hold (delayed messages, spaced copies) before its readers wait."""

WEBSOCKET_HIGH_WATER = 4 * 1024 * 1024
"""Bytes queued toward a WebSocket peer before the reader on the other side waits."""

STREAM_HIGH_WATER = 8 * 1024 * 1024
"""Bytes a Client's Streamable HTTP stream may hold for its receiver before the reader on the
Agent's side waits."""

HTTP_INBOX_HIGH_WATER = 4 * 1024 * 1024
"""Bytes read from an HTTP Agent and not yet taken by the relay before reading pauses (a count of
messages would let large messages pile up)."""

HTTP_OUTBOX_HIGH_WATER = 8 * 1024 * 1024
"""Bytes waiting to be POSTed to an HTTP Agent before the Client's reader waits (backpressure)."""
