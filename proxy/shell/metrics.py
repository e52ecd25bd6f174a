"""Prometheus metrics (DESIGN 9), fed by the core's observations, in a registry of their own.

Labels are bounded: a method outside ACP's list becomes ``other``, and no label ever holds an id
or a session. Rule names are the operator's own (bounded by the fault files).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.core.acp import method_label
from proxy.core.events import Direction
from proxy.core.jsonrpc import Kind
from proxy.core.ledger import CHECKS
from proxy.core.observations import (
    CancelDropped,
    Connected,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    Finding,
    InflightRefused,
    InvalidSeen,
    KeyedAttempt,
    Observation,
    Orphaned,
    Relayed,
    Restarted,
    RulesReloaded,
    TooManyPending,
    Undeliverable,
)
from proxy.shell.inflight import InflightBytes
from proxy.shell.limits import COUNTED, LimitReached
from proxy.shell.origin_policy import ORIGIN_OPTIONS, RequestRefused

__all__ = ["Metrics"]


class Metrics:
    """The proxy's metrics, as an observer; :meth:`exposition` renders them for ``/metrics``."""

    def __init__(
        self,
        pending: Callable[[Direction], int] | None = None,
        inflight: InflightBytes | None = None,
    ) -> None:
        """``pending`` counts requests awaiting an answer per direction (read at scrape time);
        ``inflight`` is the proxy's count of bytes in flight (read at scrape time too)."""
        disable_created_metrics()  # type: ignore[no-untyped-call] # *_created series: noise
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._relayed = _RelayedCounts()
        registry.register(self._relayed)
        if inflight is not None:
            registry.register(_InflightGauges(inflight))
        self.faults = Counter(
            "acp_proxy_faults_injected",
            "Faults injected, by rule and action.",
            ["rule", "action"],
            registry=registry,
        )
        self.pending = Gauge(
            "acp_proxy_pending_requests",
            "Requests forwarded and not yet answered.",
            ["direction"],
            registry=registry,
        )
        if pending is not None:
            for direction in Direction:
                self.pending.labels(direction.value).set_function(
                    functools.partial(pending, direction)
                )
        self.durations = Histogram(
            "acp_proxy_request_duration_seconds",
            "Time from a request's arrival at the proxy to its answer's delivery (held answers "
            "count when they are sent; injected delays included).",
            ["method"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
        )
        self.connections = Counter(
            "acp_proxy_connections",
            "Connections opened, by side and transport.",
            ["side", "transport"],
            registry=registry,
        )
        self.active = Gauge(
            "acp_proxy_active_connections",
            "Connections open now, by side and transport.",
            ["side", "transport"],
            registry=registry,
        )
        self.invalid = Counter(
            "acp_proxy_invalid_messages",
            "Messages that are not usable JSON-RPC, by direction and reason.",
            ["direction", "reason"],
            registry=registry,
        )
        self.orphans = Counter(
            "acp_proxy_orphan_responses",
            "Responses whose id matched no pending request (dropped).",
            ["direction"],
            registry=registry,
        )
        self.dropped = Counter(
            "acp_proxy_dropped_messages",
            "Messages the relay dropped for a reason other than a fault.",
            ["direction", "reason"],
            registry=registry,
        )
        self.restarts = Counter(
            "acp_proxy_restarts",
            "Restarts of the data plane (proxy) or of the Agent (agent).",
            ["what"],
            registry=registry,
        )
        self.reloads = Counter(
            "acp_proxy_config_reloads",
            "Reloads of the fault files, by result.",
            ["result"],
            registry=registry,
        )
        self.attempts = Counter(
            "acp_proxy_idempotency_attempts",
            "Keyed session/prompt attempts, first or retry.",
            ["attempt"],
            registry=registry,
        )
        self.findings = Counter(
            "acp_proxy_findings",
            "Rules of the idempotency RFD seen broken, by check.",
            ["check"],
            registry=registry,
        )
        self.write_failures = Counter(
            "acp_proxy_write_failures",
            "Writes of the trace (which then stops) or of the state file that failed.",
            ["file"],
            registry=registry,
        )
        self.refused = Counter(
            "acp_proxy_refused_requests",
            "HTTP requests refused for their Host or Origin header, by server and reason.",
            ["server", "reason"],
            registry=registry,
        )
        self.limits = Counter(
            "acp_proxy_limit_reached",
            "Times a bound on what a peer can make the proxy hold refused something or ended "
            "what a peer held, by limit and where (listener, admin, upstream, link).",
            ["limit", "where"],
            registry=registry,
        )
        self._durations: dict[str | None, Any] = {}
        for check in CHECKS:
            self.findings.labels(check)  # every check is scraped, at 0 until seen broken
        for attempt in ("first", "retry"):
            self.attempts.labels(attempt)
        for file in ("trace", "state"):
            self.write_failures.labels(file)
        for server in ORIGIN_OPTIONS:
            for reason in ("host", "origin"):
                self.refused.labels(server, reason)  # scraped at 0 until a request is refused
        for limit, where in COUNTED:
            self.limits.labels(limit, where)

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Count one observation."""
        match observation:
            case Relayed(direction=direction, kind=kind, method=method, size=size):
                self._relayed.count(direction, kind, method, size)
                if observation.duration is not None:
                    histogram = self._durations.get(method)
                    if histogram is None:
                        histogram = self.durations.labels(method_label(method))
                        self._durations[method] = histogram
                    histogram.observe(observation.duration)
            case FaultInjected(rule=rule, action=action):
                self.faults.labels(rule, action).inc()
            case InvalidSeen(direction=direction, reason=reason):
                self.invalid.labels(direction.value, reason.value).inc()
            case Orphaned(direction=direction):
                self.orphans.labels(direction.value).inc()
            case TooManyPending():
                self.limits.labels("pending", "link").inc()
            case InflightRefused():
                self.limits.labels("inflight_bytes", "listener").inc()
            case CancelDropped(direction=direction):
                self.dropped.labels(direction.value, "cancel_unknown_request").inc()
            case Undeliverable(direction=direction):
                self.dropped.labels(direction.value, "peer_closed").inc()
            case DuplicateSwallowed(direction=direction):
                self.dropped.labels(direction.value, "duplicate_answer").inc()
            case Connected(side=side, transport=transport):
                self.connections.labels(side.value, transport).inc()
                self.active.labels(side.value, transport).inc()
            case Disconnected(side=side, transport=transport):
                self.active.labels(side.value, transport).dec()
            case Restarted(what=what):
                self.restarts.labels(what).inc()
            case RulesReloaded(result=result):
                self.reloads.labels(result).inc()
            case KeyedAttempt(retry=retry):
                self.attempts.labels("retry" if retry else "first").inc()
            case Finding(check=check):
                self.findings.labels(check).inc()
            case RequestRefused(server=server, reason=reason):
                self.refused.labels(server, reason).inc()
            case LimitReached(limit=limit, where=where):
                self.limits.labels(limit, where).inc()
            case _:
                pass

    def exposition(self) -> bytes:
        """The text format a Prometheus scraper reads."""
        return generate_latest(self.registry)


class _InflightGauges(Collector):
    """The bytes in flight across the proxy (``--max-inflight-bytes``), read when scraped."""

    def __init__(self, inflight: InflightBytes) -> None:
        self._inflight = inflight

    def collect(self) -> Iterator[Metric]:
        """The count now, its peak, its bound, and how often readers waited for room."""
        inflight = self._inflight
        yield GaugeMetricFamily(
            "acp_proxy_inflight_bytes",
            "Bytes read from peers (or admitted POST bodies) not yet taken by their destinations "
            "or released by timers, across the proxy.",
            value=inflight.count,
        )
        yield GaugeMetricFamily(
            "acp_proxy_inflight_bytes_peak",
            "The largest acp_proxy_inflight_bytes since the proxy started.",
            value=inflight.peak,
        )
        if inflight.bound is not None:
            yield GaugeMetricFamily(
                "acp_proxy_inflight_bytes_bound",
                "The bound on bytes in flight (--max-inflight-bytes).",
                value=inflight.bound,
            )
        yield CounterMetricFamily(
            "acp_proxy_inflight_waits",
            "Times a reader waited for the bytes in flight to fall under their bound.",
            value=inflight.waits,
        )


class _RelayedCounts(Collector):
    """``acp_proxy_messages_total`` and ``acp_proxy_bytes_total``, counted as plain integers.

    They move once per message, the proxy's hot path: a dictionary increment here, where a
    ``prometheus_client`` child takes a lock and two calls. Scrapes read the integers.
    """

    def __init__(self) -> None:
        self._messages: dict[tuple[Direction, Kind, str | None], int] = {}
        self._bytes: dict[Direction, int] = {}

    def count(self, direction: Direction, kind: Kind, method: str | None, size: int) -> None:
        """One message of ``size`` bytes relayed."""
        key = (direction, kind, method)
        self._messages[key] = self._messages.get(key, 0) + 1
        self._bytes[direction] = self._bytes.get(direction, 0) + size

    def collect(self) -> Iterator[Metric]:
        """The two counters as they stand (methods folded into their bounded labels)."""
        messages = CounterMetricFamily(
            "acp_proxy_messages",
            "Messages relayed, by direction, kind and method.",
            labels=["direction", "kind", "method"],
        )
        folded: dict[tuple[str, str, str], int] = {}
        for (direction, kind, method), count in list(self._messages.items()):
            labels = (direction.value, kind.value, method_label(method))
            folded[labels] = folded.get(labels, 0) + count
        for labels, count in folded.items():
            messages.add_metric(list(labels), count)
        yield messages
        sizes = CounterMetricFamily(
            "acp_proxy_bytes", "Bytes of messages relayed.", labels=["direction"]
        )
        for direction, size in list(self._bytes.items()):
            sizes.add_metric([direction.value], size)
        yield sizes
