"""``acp-proxy bench``: the proxy's cost, measured as ratios in one run (DESIGN 11).

What is measured
----------------
The bench process plays the Client. For each *target* it spawns, on loopback pipes, one process
tree and drives three *workloads* through it, with blocking reads and writes in a thread of its
own (:mod:`.driver`), so that the Client is never the bottleneck (the ``direct`` column runs
several times above any relay, and a check says so):

* ``ping``: small requests, one in flight at a time (ping-pong); the round trip of each is timed
  with :func:`time.perf_counter` from just before the write to just after the answer is read;
* ``stream``: one request asks the Agent for N ``session/update`` notifications, written as fast as
  it can; throughput is N over the time from the request's write to the last message read;
* ``prompt64k``: ``session/prompt`` requests carrying a 64 KiB text, one in flight, each round
  trip timed.

The targets are the same bench Agent (a tiny stdio echo Agent, :mod:`.agent`, started as
``python -m proxy.tools.bench.agent``) reached

* ``direct``: spawned by the bench itself;
* ``socat``: through a byte relay, ``socat -b 262144 STDIO EXEC:...`` (only when ``socat`` is on
  ``PATH``; ``apt-get install socat`` to get the column; the report says when it is absent);
* ``asyncio``: through :mod:`.relay` (``python -m proxy.tools.bench.relay -- AGENT``), the floor
  of any relay written in Python: asyncio streams copying lines, nothing parsed. The proxy's
  added latency over this one is its own work; this one's over socat is Python's and asyncio's
  (socat is shown, never a target: no CPython relay reaches it);
* ``asyncio-protocol``: the same floor written with asyncio protocols, every complete line of a
  read written in one call (``relay --protocol``);
* ``proxy``: through ``python -m proxy run -- AGENT`` with no rules;
* ``proxy+rules``: the same with :data:`RULES` loaded, a realistic fault file whose rules are
  evaluated on every message but never fire (other methods, a params subset that does not match, a
  probability-0 rule on ``session/prompt``): 12 rules, as DESIGN 11 asks.

Both proxies run with ``--log-level warning``. A round runs every target in turn, each in a fresh
process tree; samples of all rounds are pooled, so slow drift touches every target alike.

The report gives p50/p99 round trip per target and workload, the latency added over ``direct``
(and as a multiple of the ``asyncio`` relay's), throughput and its ratio to ``direct`` and to the
``asyncio`` relay, and the peak resident
memory of the process the bench spawned (the Agent for ``direct``, socat, the proxy): ``VmHWM``
read from ``/proc/PID/status`` before the process is told to stop, or, without ``/proc``,
``ru_maxrss`` of :func:`resource.getrusage` (``RUSAGE_CHILDREN``, the largest child so far, a
coarser figure; ``rss_source`` says which). The DESIGN 11 targets are checked and marked PASS,
MISS or SKIP next to their figures; they are information only, the exit status does not depend on
them (0, or 1 when a target could not be driven at all). A check of added latency also gives its
ratio in each round alone (``rounds`` in ``--json``; each target's ``round_p50_ms``): how far
the rounds, each in fresh processes, agree on a verdict the pooled figure gives.

Over WebSocket
--------------
The same three workloads, with a blocking WebSocket Client (:mod:`.ws_driver`: a blocking
socket in the bench's worker thread, a MiB read at a time, the frames received parsed in one
pass, what it sends framed by ``websockets``' sans-I/O protocol; no ``Origin`` header, no
permessage-deflate, the stream's messages counted undecoded), through the WebSocket bench Agent
(:mod:`.ws_agent`, which writes a stream's notifications as frames built once, in one write, as
the stdio Agent writes its lines in one block; it answers a request with its params echoed, so
a 64 KiB prompt's answer is 64 KiB too) reached (:mod:`.ws_targets`)

* ``direct``: the bench connects to the Agent;
* ``websockets``: through :mod:`.ws_relay` (``python -m proxy.tools.bench.ws_relay AGENT_URL``),
  the floor of any WebSocket relay written with ``websockets``: one upstream connection per
  Client, every message copied as it came, nothing parsed;
* ``mitmproxy``: through ``mitmdump --mode reverse:http://AGENT --listen-host 127.0.0.1
  --listen-port 0 --flow-detail 0`` (only when ``mitmdump`` is on ``PATH``; the bench never
  installs it, the report says when it is absent; ``--no-mitmproxy`` leaves it out);
* ``proxy``: through ``python -m proxy run --log-format json --log-level info --listen
  ws://127.0.0.1:0/acp --upstream ws://AGENT`` (``info``: the bench reads the bound port from its
  ``listening`` line; it logs a few lines per link, none per message).

A round runs them after the stdio targets, each in fresh processes; ``--no-websocket`` leaves
them out. The report's ``websocket`` member holds their figures and their comparisons to
``direct``, the ``websockets`` relay and mitmproxy; the checks: the proxy's ping added p50 at
most 1.3x the relay's, its stream at least 0.9x the relay's, both ahead of mitmproxy's (SKIP,
with the reason, without mitmproxy), and the direct stream at least 3x the proxy's (the Client's
headroom).

``--memory-check N`` then sends N messages (mostly small requests, with a notification stream
and a 64 KiB prompt every so often, pipelined 32 at a time) through the proxy with the rules
loaded, sampling its ``VmRSS``; memory is *flat* when, after the first 10% (warm-up), the largest
sample of the last quarter is within 10% of the largest of the first quarter.

Many WebSocket links
--------------------
``--ws-links N`` (default 1,000, 100 in short mode, 0 leaves it out) checks "1,000 concurrent
WebSocket links on one process". A stdio upstream spawns one Agent process per link (DESIGN 4), so
1,000 links would measure 1,000 Python Agents (some 20 MiB each), not the proxy. Here the proxy,
``python -m proxy run --listen ws://127.0.0.1:0/acp --upstream ws://...``, stands in front of *one*
bench WebSocket Agent process (:mod:`.ws_agent`: every connection served by one event loop,
every request answered at once with its params echoed); a link is a Client WebSocket into the proxy
and a WebSocket out of it to that Agent. The proxy runs at ``--log-level info``, its default (the
bench reads the bound port from its ``listening`` line), so its few log lines per link are part of
the cost. The bench opens N Client WebSockets (``websockets``, no permessage-deflate offered), at
most :data:`CONNECT_CONCURRENCY` handshakes in flight, each timed from the connect to the answer of
its ``initialize`` (*connect*). Once all N are open:

* every link sends :data:`WS_PINGS` pings, one in flight per link, all links at once (*pings, all
  links at once*: each round trip timed, and the aggregate rate);
* then one link ping-pongs (as many pings as ``--requests``) while the others stay open and idle
  (*one link of N*: what the open links cost a busy one).

The links pass when all N were established, all were open at the same time (no link pings before
the last one has opened, and a link that the proxy closed would fail its pings) and every answer
carried its request's id and echoed its params (the link's number and the ping's), so no answer
went to the wrong link. With them: the proxy's ``VmRSS`` before the first link and with all open,
the difference per link, its ``VmHWM``, and its open descriptors (``/proc/PID/fd``) before and with
all open. The bench raises its ``RLIMIT_NOFILE`` soft limit to the hard limit (the processes it
spawns inherit it); when that is still below what N links need (two sockets per link in the proxy),
the links are not tried and the report says why.

Injected delays
---------------
``--delays M`` (default 200, 10 in short mode, 0 leaves it out) checks "injected delays land within
+2 ms of their setting at p99". A stdio proxy (``--log-level warning``) is loaded with one rule that
holds every ``_bench/delayed`` request toward the Agent for :data:`DELAY_MS` (no jitter). The
Client sends M pairs, one request in flight: a ``_bench/ping``, which the rule does not match (the
*baseline*: the same path, the same proxy, the rule evaluated but not firing), then a
``_bench/delayed`` request (*observed*). The *excess* of a delayed request is its round trip minus
the setting minus the baseline's p50: how much later than asked the held message went on, plus the
round trip's own variation, which the p99 includes (so the figure errs against the proxy: a slow
round trip counts as a late timer). Two variants, in the same proxy process:

* ``idle``: nothing else crosses the proxy;
* ``busy``: the Client also sends :data:`BACKGROUND_RATE` notifications a second to the Agent
  (which reads and ignores them), so the proxy's event loop is relaying when the timers fall due;
  a proxy that takes fewer gets what it takes (what falls behind is skipped, never sent late in a
  burst), and the report gives the rate reached.

Each variant passes when its excess p99 is at most 2 ms. Even an idle proxy's timers fire up to a
millisecond late, half a millisecond on average: asyncio's epoll selector waits in whole
milliseconds, rounded up, so the excess p50 sits near 0.5 ms by construction.

The package, one concern a module
---------------------------------
* the run: :mod:`.options` (:class:`BenchOptions`), :mod:`.command` (``acp-proxy bench``'s
  entry: :func:`make_options`, :func:`bench_main`), :mod:`.run` (:func:`run_bench`: every target,
  every check, the report), :mod:`.render` (the text tables);
* what is measured: :mod:`.targets` (the process trees and their commands, :data:`RULES`),
  :mod:`.workloads` (ping, stream, prompt64k), :mod:`.driver` (the blocking Client that drives
  them), :mod:`.ws_targets` and :mod:`.ws_driver` (the same over WebSocket),
  :mod:`.memory` (the long-run check),
  :mod:`.delays` (injected delays), :mod:`.ws_links` (many WebSocket links), :mod:`.checks` (the
  DESIGN 11 targets), :mod:`.stats` (percentiles, latency figures), :mod:`.processes` (spawning,
  driving and reading the memory of processes);
* the bench's own child processes, each ``python -m proxy.tools.bench.<module>`` with an argument
  list of its own: :mod:`.agent` (the stdio Agent), :mod:`.ws_agent` (the WebSocket Agent),
  :mod:`.relay` (the asyncio floor), :mod:`.ws_relay` (the ``websockets`` floor);
  :mod:`.messages` is what they and the bench say to each other.

Nothing this package imports at its top needs more than the standard library: the bench Agent
runs in it, and ``direct`` must measure a small Agent (``websockets`` is imported where it is
used, or by the WebSocket processes themselves).
"""

from proxy.tools.bench.command import bench_main, make_options
from proxy.tools.bench.delays import DELAY_RULES
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import BenchError
from proxy.tools.bench.render import render
from proxy.tools.bench.run import run_bench
from proxy.tools.bench.targets import RULES, TARGETS
from proxy.tools.bench.workloads import WORKLOADS

__all__ = [
    "DELAY_RULES",
    "RULES",
    "TARGETS",
    "WORKLOADS",
    "BenchError",
    "BenchOptions",
    "bench_main",
    "make_options",
    "render",
    "run_bench",
]
