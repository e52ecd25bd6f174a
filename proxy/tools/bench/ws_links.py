"""The many-links check (``--ws-links N``): N concurrent WebSocket links through one proxy, all
open at once, every answer right. (The method: the package's docstring.)

The proxy, ``python -m proxy run --listen ws://127.0.0.1:0/acp --upstream ws://...``, stands in
front of *one* WebSocket bench Agent process (:mod:`.ws_agent`); a link is a Client WebSocket into
the proxy and one out of it to that Agent. The bench opens N Client WebSockets, at most
:data:`CONNECT_CONCURRENCY` handshakes in flight; once all are open every link sends
:data:`WS_PINGS` pings, all links at once, then one link ping-pongs while the others idle.

``websockets`` is imported where it is used: the bench Agents import this package, and the stdio
one stays a standard-library process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core import acp
from proxy.tools.bench.messages import PING_METHOD, READ_LIMIT, echo_result
from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import ANSWER_TIMEOUT, BenchError, Server, open_fds, proc_kib
from proxy.tools.bench.stats import concurrent, latency

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

__all__ = ["CONNECT_CONCURRENCY", "WS_PINGS", "WsLink", "ws_argv", "ws_links"]

WS_PINGS = 3
"""Pings each WebSocket link sends while all are open."""
CONNECT_CONCURRENCY = 50
"""WebSocket handshakes in flight at once while the links open."""
FDS_PER_LINK = 2
"""Descriptors a link holds in the proxy: the Client's socket and the Agent's."""
FD_HEADROOM = 128
"""Descriptors a process needs besides its links (pipes, logs, the listener, Python itself)."""


def _raise_fd_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (children inherit it); both, after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass(slots=True)
class WsLink:
    """One Client WebSocket into the proxy."""

    connection: ClientConnection
    number: int
    sent: int = 0

    async def call(self, method: str, params: dict[str, Any]) -> float:
        """One round trip, in seconds; the answer must carry its id and echo its params."""
        self.sent += 1
        request_id = self.sent
        data = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        start = time.perf_counter()
        await self.connection.send(data)
        try:
            reply = await asyncio.wait_for(self.connection.recv(), ANSWER_TIMEOUT)
        except TimeoutError:
            raise BenchError(f"link {self.number}: no answer in {ANSWER_TIMEOUT} s") from None
        elapsed = time.perf_counter() - start
        message = json.loads(reply)
        expected = echo_result(params)
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise BenchError(f"link {self.number}: expected the answer to {request_id}: {reply!r}")
        if message.get("result") != expected:
            raise BenchError(f"link {self.number}: a wrong answer to {method}: {reply!r}")
        return elapsed

    async def ping(self, count: int) -> list[float]:
        return [await self.call(PING_METHOD, {"link": self.number, "seq": n}) for n in range(count)]


async def _open_ws_link(url: str, number: int, gate: asyncio.Semaphore) -> tuple[WsLink, float]:
    """Connect and initialize; the link and the seconds from the connect to the answer."""
    from websockets.asyncio.client import connect  # noqa: PLC0415 - see the module

    async with gate:
        start = time.perf_counter()
        connection = await connect(
            url,
            compression=None,
            max_size=READ_LIMIT,
            open_timeout=ANSWER_TIMEOUT,
            ping_interval=None,
            proxy=None,
        )
        link = WsLink(connection, number)
        try:
            await link.call(acp.INITIALIZE, {"protocolVersion": 1, "link": number})
        except Exception:
            await connection.close()
            raise
        return link, time.perf_counter() - start


def ws_argv(options: BenchOptions, upstream: str) -> list[str]:
    return [
        *(options.python, "-P", "-m", "proxy", "run"),
        *("--log-format", "json", "--log-level", "info"),
        *("--listen", "ws://127.0.0.1:0/acp", "--upstream", upstream),
        *("--max-links", str(max(options.ws_links, 1))),  # every link open at once
    ]


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def ws_links(options: BenchOptions) -> dict[str, Any]:
    """The many-links check (see the module docstring)."""
    count = options.ws_links
    soft, hard = _raise_fd_limit()
    needed = FDS_PER_LINK * count + FD_HEADROOM
    report: dict[str, Any] = {
        "links": count,
        "pings_per_link": WS_PINGS,
        "command": ws_argv(options, "ws://AGENT"),
        "fd_limit": {"soft": soft, "hard": hard, "needed": needed},
    }
    if soft != resource.RLIM_INFINITY and soft < needed:
        report["skipped"] = (
            f"RLIMIT_NOFILE is {soft} (hard {hard}), below the {needed} descriptors that "
            f"{count} links need in the proxy; raise it (ulimit -n) or lower --ws-links"
        )
        return report
    failures: list[str] = []
    agent = await Server.start([options.python, "-m", "proxy.tools.bench.ws_agent"])
    try:
        proxy = await Server.start(ws_argv(options, agent.url))
        try:
            await _drive_ws_links(options, proxy, report, failures)
        finally:
            report["proxy"]["peak_rss_kib"] = proc_kib(proxy.process.pid, "VmHWM")
            await proxy.stop()
        if failures:
            report["proxy_output_tail"] = list(proxy.tail)
    finally:
        await agent.stop()
    report["failures"] = failures[:10]
    report["failure_count"] = len(failures)
    return report


async def _drive_ws_links(
    options: BenchOptions, proxy: Server, report: dict[str, Any], failures: list[str]
) -> None:
    """Open the links, ping on all at once, then on one; fill ``report`` as it goes."""
    pid = proxy.process.pid
    figures: dict[str, Any] = {
        "rss_before_kib": proc_kib(pid, "VmRSS"),
        "fds_before": open_fds(pid),
    }
    report["proxy"] = figures
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    start = time.perf_counter()
    opened = await asyncio.gather(
        *(_open_ws_link(proxy.url, n, gate) for n in range(options.ws_links)),
        return_exceptions=True,
    )
    links: list[WsLink] = []
    connect_times: list[float] = []
    for outcome in opened:
        if isinstance(outcome, BaseException):
            failures.append(f"connect: {_failure(outcome)}")
        else:
            links.append(outcome[0])
            connect_times.append(outcome[1])
    report["established"] = len(links)
    report["connect"] = concurrent(connect_times, time.perf_counter() - start)
    try:
        # Every link is open now: none has pinged before the last one was established.
        start = time.perf_counter()
        pinged = await asyncio.gather(
            *(link.ping(WS_PINGS) for link in links), return_exceptions=True
        )
        wall = time.perf_counter() - start
        answered: list[WsLink] = []
        ping_times: list[float] = []
        for link, result in zip(links, pinged, strict=True):
            if isinstance(result, BaseException):
                failures.append(f"ping: {_failure(result)}")
            else:
                answered.append(link)
                ping_times.extend(result)
        one_link: list[float] = []
        if answered:
            try:
                one_link = await answered[0].ping(options.requests)
            except Exception as exc:
                failures.append(f"one link of N: {_failure(exc)}")
                answered.pop(0)
        figures["rss_all_open_kib"] = proc_kib(pid, "VmRSS")
        figures["fds_all_open"] = open_fds(pid)
    finally:
        await asyncio.gather(*(link.connection.close() for link in links), return_exceptions=True)
    report["answered"] = len(answered)
    report["passed"] = len(answered) == options.ws_links
    report["pings_all_links"] = concurrent(ping_times, wall)
    report["one_link_of_n"] = latency(one_link) if one_link else None
    before, after = figures["rss_before_kib"], figures["rss_all_open_kib"]
    figures["rss_per_link_kib"] = (
        (after - before) / len(links)
        if links and before is not None and after is not None
        else None
    )
