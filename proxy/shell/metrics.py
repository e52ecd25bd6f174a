"""Prometheus metrics (DESIGN 9), fed by the core's observations, in a registry of their own.

The counters are read, when scraped, from the run's :class:`~proxy.shell.observers.Tally` (the
one count of every observation, which the closing log line sums too): :data:`_COUNTERS` says
which tally names each counter reads and how its labels follow. What is no count stays here: the
gauges (connections open, requests pending, bytes in flight), the answers' durations and the
failed writes.

Labels are bounded: a method outside ACP's list becomes ``other``, and no label ever holds an id
or a session. Rule names are the operator's own (bounded by the fault files).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, get_args

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
from proxy.core.engine import ActiveFaults
from proxy.core.events import Direction
from proxy.core.ledger import CHECKS
from proxy.core.observations import Connected, Disconnected, HeldOutcome, Observation, Relayed
from proxy.shell.inflight import InflightBytes
from proxy.shell.limits import COUNTED
from proxy.shell.observers import Tally
from proxy.shell.origin_policy import ORIGIN_OPTIONS
from proxy.shell.parsing import Parser

__all__ = ["Metrics"]

Labels = tuple[str, ...]


def _same(labels: Labels) -> Labels:
    return labels


def _with(*more: str) -> Callable[[Labels], Labels]:
    """The tally's labels, then ``more`` (a reason the tally's name says)."""
    return lambda labels: (*labels, *more)


def _as(*fixed: str) -> Callable[[Labels], Labels]:
    """Fixed labels (the tally's name says them all)."""
    return lambda _labels: fixed


@dataclass(frozen=True, slots=True, kw_only=True)
class _Counted:
    """A counter read from the tally."""

    name: str
    """Its name (exposed with ``_total``)."""
    help: str
    labels: Labels
    sources: Mapping[str, Callable[[Labels], Labels]]
    """The tally's names it sums, each with its labels from the tally's."""
    zeros: tuple[Labels, ...] = ()
    """Label values scraped at 0 until counted."""


_COUNTERS: tuple[_Counted, ...] = (
    _Counted(
        name="acp_proxy_messages",
        help="Messages relayed, by direction, kind and method.",
        labels=("direction", "kind", "method"),
        sources={"messages": _same},
    ),
    _Counted(
        name="acp_proxy_faults_injected",
        help="Faults injected, by rule and action.",
        labels=("rule", "action"),
        sources={"faults": _same},
    ),
    _Counted(
        name="acp_proxy_faults_overflow",
        help="Faults refused because --max-active-faults were in progress, by rule and action.",
        labels=("rule", "action"),
        sources={"faults_overflow": _same},
    ),
    _Counted(
        name="acp_proxy_connections",
        help="Connections opened, by side and transport.",
        labels=("side", "transport"),
        sources={"connections": _same},
    ),
    _Counted(
        name="acp_proxy_invalid_messages",
        help="Messages that are not usable JSON-RPC, by direction and reason.",
        labels=("direction", "reason"),
        sources={"invalid": _same},
    ),
    _Counted(
        name="acp_proxy_orphan_responses",
        help="Responses whose id matched no pending request (dropped).",
        labels=("direction",),
        sources={"orphan_responses": _same},
    ),
    _Counted(
        name="acp_proxy_dropped_messages",
        help="Messages the relay dropped for a reason other than a fault.",
        labels=("direction", "reason"),
        sources={
            "cancels_dropped": _with("cancel_unknown_request"),
            "undeliverable": _with("peer_closed"),
            "duplicate_answers_swallowed": _with("duplicate_answer"),
        },
    ),
    _Counted(
        name="acp_proxy_restarts",
        help="Restarts of the data plane (proxy) or of the Agent (agent).",
        labels=("what",),
        sources={"restarts": _same},
    ),
    _Counted(
        name="acp_proxy_config_reloads",
        help="Reloads of the fault files, by result.",
        labels=("result",),
        sources={"reloads": _same},
    ),
    _Counted(
        name="acp_proxy_idempotency_attempts",
        help="Keyed session/prompt attempts, first or retry.",
        labels=("attempt",),
        sources={"keyed_attempts": _same},
        zeros=(("first",), ("retry",)),
    ),
    _Counted(
        name="acp_proxy_findings",
        help="Rules of the idempotency RFD seen broken, by check.",
        labels=("check",),
        sources={"findings": _same},
        zeros=tuple((check,) for check in CHECKS),  # every check, at 0 until seen broken
    ),
    _Counted(
        name="acp_proxy_refused_requests",
        help="HTTP requests refused for their Host or Origin header, by server and reason.",
        labels=("server", "reason"),
        sources={"refused_requests": _same},
        zeros=tuple((server, reason) for server in ORIGIN_OPTIONS for reason in ("host", "origin")),
    ),
    _Counted(
        name="acp_proxy_limit_reached",
        help="Times a bound on what a peer can make the proxy hold refused something or ended "
        "what a peer held, by limit and where (listener, admin, upstream, link).",
        labels=("limit", "where"),
        sources={
            "limits_reached": _same,
            "refused_too_many_pending": _as("pending", "link"),
            "refused_too_much_in_flight": _as("inflight_bytes", "listener"),
        },
        zeros=COUNTED,
    ),
    _Counted(
        name="acp_proxy_held_outcomes",
        help="Messages hold rules held that are held no more, by how their hold ended.",
        labels=("outcome",),
        sources={"held_outcomes": _same},
        zeros=tuple((outcome,) for outcome in get_args(HeldOutcome)),
    ),
)
"""Every counter read from the tally, in the order they are exposed."""


class Metrics:
    """The proxy's metrics, as an observer; :meth:`exposition` renders them for ``/metrics``.

    It owns the run's :attr:`tally` (and so feeds it): the counters are read from it.
    """

    def __init__(
        self,
        pending: Callable[[Direction], int] | None = None,
        inflight: InflightBytes | None = None,
        parser: Parser | None = None,
        active_faults: ActiveFaults | None = None,
        held: Callable[[], int] | None = None,
    ) -> None:
        """``pending`` counts requests awaiting an answer per direction (read at scrape time);
        ``inflight`` is the proxy's count of bytes in flight (read at scrape time too),
        ``parser`` parses large messages in workers (its counts read likewise), and
        ``active_faults`` counts the faults in progress (read likewise), and ``held`` the
        messages ``hold`` rules hold now (likewise)."""
        disable_created_metrics()  # type: ignore[no-untyped-call] # *_created series: noise
        self.tally = Tally()
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        registry.register(_TallyCounters(self.tally))
        if inflight is not None:
            registry.register(_InflightGauges(inflight))
        if parser is not None:
            registry.register(_ParsingCounts(parser))
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
        self.active = Gauge(
            "acp_proxy_active_connections",
            "Connections open now, by side and transport.",
            ["side", "transport"],
            registry=registry,
        )
        self.write_failures = Counter(
            "acp_proxy_write_failures",
            "Writes of the trace or the recording (which then stop) or of the state file that "
            "failed.",
            ["file"],
            registry=registry,
        )
        if active_faults is not None:
            Gauge(
                "acp_proxy_active_faults",
                "Faults in progress now, across the links: messages held, copies spaced, "
                "commands delayed (capped by --max-active-faults).",
                registry=registry,
            ).set_function(lambda: active_faults.count)
        if held is not None:
            Gauge(
                "acp_proxy_held_messages",
                "Messages hold rules hold now, across the links (waiting for the control API or "
                "their timeout).",
                registry=registry,
            ).set_function(held)
        self._durations: dict[str | None, Any] = {}
        for file in ("trace", "state", "record"):
            self.write_failures.labels(file)

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Count one observation (in the tally), and move the gauges and durations it moves."""
        self.tally.observe(observation, link)
        if isinstance(observation, Relayed):  # one per message: before the match's cases
            duration = observation.duration
            if duration is not None:
                method = observation.method
                histogram = self._durations.get(method)
                if histogram is None:
                    histogram = self.durations.labels(method_label(method))
                    self._durations[method] = histogram
                histogram.observe(duration)
            return
        match observation:
            case Connected(side=side, transport=transport):
                self.active.labels(side.value, transport).inc()
            case Disconnected(side=side, transport=transport):
                self.active.labels(side.value, transport).dec()

    def exposition(self) -> bytes:
        """The text format a Prometheus scraper reads."""
        return generate_latest(self.registry)


class _TallyCounters(Collector):
    """The counters of :data:`_COUNTERS` and ``acp_proxy_bytes``, read from the tally."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self._of = {
            source: (index, labels)
            for index, counted in enumerate(_COUNTERS)
            for source, labels in counted.sources.items()
        }

    def collect(self) -> Iterator[Metric]:
        """Every counter as the tally stands."""
        values: list[dict[Labels, int]] = [dict.fromkeys(c.zeros, 0) for c in _COUNTERS]
        for (name, *tallied), count in list(self._tally.counts.items()):
            found = self._of.get(name)
            if found is not None:
                index, label = found
                key = label(tuple(str(value) for value in tallied))
                values[index][key] = values[index].get(key, 0) + count
        for counted, samples in zip(_COUNTERS, values, strict=True):
            family = CounterMetricFamily(counted.name, counted.help, labels=counted.labels)
            for labels, count in samples.items():
                family.add_metric(labels, count)
            yield family
        sizes = CounterMetricFamily(
            "acp_proxy_bytes", "Bytes of messages relayed.", labels=["direction"]
        )
        for direction, size in list(self._tally.relayed_bytes.items()):
            sizes.add_metric([str(direction)], size)
        yield sizes


class _ParsingCounts(Collector):
    """The large messages parsed in worker processes (:mod:`proxy.shell.parsing`), read when
    scraped."""

    def __init__(self, parser: Parser) -> None:
        self._parser = parser

    def collect(self) -> Iterator[Metric]:
        """Messages given to workers, being parsed now, and workers lost."""
        parser = self._parser
        yield CounterMetricFamily(
            "acp_proxy_worker_parses",
            "Large messages parsed in a worker process instead of on the event loop.",
            value=parser.offloaded,
        )
        yield GaugeMetricFamily(
            "acp_proxy_worker_parses_running",
            "Large messages a worker process is parsing now (or that wait for one).",
            value=parser.parsing,
        )
        yield CounterMetricFamily(
            "acp_proxy_parsing_workers_lost",
            "Worker processes that died parsing a message (refused as too complex).",
            value=parser.lost,
        )


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
