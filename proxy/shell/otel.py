"""OpenTelemetry: a span for each request through the proxy, exported over OTLP/HTTP.

Only ``acp-proxy run --otel`` imports this module, and only it imports OpenTelemetry (the
optional extra ``pip install 'acp-fault-proxy[otel]'``: the SDK and its OTLP/HTTP exporter).
The standard ``OTEL_*`` environment variables configure the export (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` for the batching, ``OTEL_SDK_DISABLED``); spans
are batched and sent from the SDK's own thread, never from the event loop.

:class:`Tracing` is an observer (:mod:`proxy.shell.observers`) of what the core observes. A
request's span opens the first time the proxy sees the request (a rule firing on it, its hold,
its forwarding, its stop) and ends with its answer's delivery, or when it is stopped (a rule
dropped it or answered it), when its answer is stopped, when its peer goes away or its link
ends. Its name is the method; its attributes (``rpc.*`` of the RPC conventions, ``acp.*`` of
ours) say the link, the direction, the session, the request's id, the digest of its
``idempotencyKey`` (never the key: a retry's span carries the same digest) and ``acp.outcome``;
every fault injected on the request or on its answer is an event ``fault`` (rule, action). A
request whose ``params._meta`` holds a W3C ``traceparent`` (ACP reserves ``_meta.traceparent``
and ``_meta.tracestate``) gets a span that is its child. With ``--otel-propagate`` the proxy
writes its own span's ``traceparent`` (and ``tracestate``) into the request it forwards
(:meth:`Tracing.meta_for`, given to each relay), so that the Agent's spans are children of the
proxy's: a change to the forwarded bytes, made only when asked.

Spans open at once are bounded (:data:`MAX_OPEN_SPANS`): past it, the oldest ends with
``acp.outcome`` ``evicted``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import proxy
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind, Message
from proxy.core.observations import (
    Disconnected,
    FaultInjected,
    Held,
    Observation,
    PeerGone,
    Relayed,
    Stopped,
    Undeliverable,
)
from proxy.shell.log import get_logger

__all__ = ["MAX_OPEN_SPANS", "Tracing"]

log = get_logger("proxy.otel")

MAX_OPEN_SPANS = 10_000
"""Spans open at once (requests not yet answered, over every link); past it the oldest ends."""

_SERVICE = "acp-fault-proxy"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one."""

_PROPAGATOR = TraceContextTextMapPropagator()

_Key = tuple[int | None, Direction, bytes]
"""A request's span: its link, the direction it travels, its id as its sender wrote it."""


@dataclass(slots=True)
class _Open:
    span: Span


def _key_digest(key: str) -> str:
    """The digest of an idempotency key that the span carries (the key itself never)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _meta_of(message: Message | None) -> Mapping[str, Any]:
    params = None if message is None else message.params
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}


class Tracing:
    """The proxy's tracer provider and the spans of the requests in flight."""

    def __init__(
        self, exporter: SpanExporter | None = None, *, max_open: int = MAX_OPEN_SPANS
    ) -> None:
        """``exporter``: where spans go (default: OTLP/HTTP, configured by ``OTEL_*``)."""
        attributes: dict[str, str] = {"service.version": proxy.__version__}
        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        if not named:
            attributes["service.name"] = _SERVICE
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("acp-fault-proxy", proxy.__version__)
        self._open: OrderedDict[_Key, _Open] = OrderedDict()
        self._started: dict[int, tuple[Message, Span]] = {}
        """Spans :meth:`meta_for` opened, by the identity of their message, until the observation
        of that message gives them their link (in the same turn of the loop)."""
        self._max_open = max_open
        self.evicted = 0

    # -- the relay's question ------------------------------------------------------------------

    def meta_for(self, direction: Direction, message: Message) -> Sequence[tuple[str, str]]:
        """The ``_meta`` members to write into ``message`` as it is forwarded (``--otel-propagate``,
        :data:`~proxy.core.relay.MetaFor`): the ``traceparent`` of its span, opened here."""
        span = self._start(direction, message)
        self._started[id(message)] = (message, span)
        if len(self._started) > self._max_open:  # observed at once, always: only after a bug
            _, lost = self._started.pop(next(iter(self._started)))
            self._finish(lost, "unobserved", error=True)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return [(name, carrier[name]) for name in ("traceparent", "tracestate") if name in carrier]

    # -- observations -------------------------------------------------------------------------

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Open, annotate or end the span of the request ``observation`` is about."""
        match observation:
            case Relayed(kind=Kind.REQUEST) if observation.original_id is not None:
                self._span(link, observation.direction, observation.original_id, observation)
            case Relayed(kind=Kind.RESPONSE | Kind.ERROR) if observation.original_id is not None:
                self._answered(link, observation)
            case Held(relayed=relayed) if relayed.kind is Kind.REQUEST:
                if relayed.original_id is not None:
                    opened = self._span(link, relayed.direction, relayed.original_id, relayed)
                    opened.span.add_event(
                        "held", {"acp.rules": list(observation.rules), "acp.hold": observation.hold}
                    )
            case FaultInjected():
                self._fault(link, observation)
            case Stopped() if observation.original_id is not None:
                if observation.kind is Kind.REQUEST:
                    self._span(link, observation.direction, observation.original_id, observation)
                    key = (link, observation.direction, observation.original_id)
                    self._end(key, observation.disposition, error=True)
                else:  # an answer stopped: its request's span ends unanswered
                    key = (link, observation.direction.reverse, observation.original_id)
                    self._end(key, f"answer_{observation.disposition}", error=True)
            case Undeliverable() if observation.original_id is not None:
                if observation.kind is Kind.REQUEST:
                    key = (link, observation.direction, observation.original_id)
                else:
                    key = (link, observation.direction.reverse, observation.original_id)
                self._end(key, "undeliverable", error=True)
            case PeerGone(side=side):
                self._end_where(link, side.other.outbound, "peer_gone")
            case Disconnected(side=Side.CLIENT):
                self._end_where(link, None, "link_end")
            case _:
                pass

    # -- spans ---------------------------------------------------------------------------------

    def _start(self, direction: Direction, message: Message | None, **names: Any) -> Span:
        meta = _meta_of(message)
        carrier = {
            name: value
            for name in ("traceparent", "tracestate")
            if isinstance(value := meta.get(name), str)
        }
        parent = _PROPAGATOR.extract(carrier) if "traceparent" in carrier else None
        method = names.get("method") or (message.method if message is not None else None)
        attributes: dict[str, Any] = {
            "rpc.system": "jsonrpc",
            "rpc.jsonrpc.version": "2.0",
            "acp.direction": direction.value,
        }
        if method:
            attributes["rpc.method"] = method
        if message is not None:
            if message.id_token is not None:
                attributes["rpc.jsonrpc.request_id"] = message.id_token.decode("utf-8", "replace")
            if message.session is not None:
                attributes["acp.session"] = message.session
            params = message.params
            key = params.get("idempotencyKey") if isinstance(params, dict) else None
            if isinstance(key, str):
                attributes["acp.idempotency_key.digest"] = _key_digest(key)
        return self._tracer.start_span(
            method or "request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=time.time_ns(),
        )

    def _span(
        self,
        link: int | None,
        direction: Direction,
        original_id: bytes,
        seen: Relayed | Stopped | FaultInjected,
    ) -> _Open:
        """The open span of a request, opened now if it is not open yet."""
        key = (link, direction, original_id)
        opened = self._open.get(key)
        if opened is not None:
            return opened
        message = seen.message
        started = self._started.pop(id(message), None) if message is not None else None
        if started is not None and started[0] is message:
            span = started[1]
        else:
            span = self._start(direction, message, method=seen.method)
        if link is not None:
            span.set_attribute("acp.link", link)
        if seen.session is not None:
            span.set_attribute("acp.session", seen.session)
        opened = self._open[key] = _Open(span)
        if len(self._open) > self._max_open:
            _, oldest = self._open.popitem(last=False)
            self._finish(oldest.span, "evicted", error=True)
            self.evicted += 1
        return opened

    def _fault(self, link: int | None, fault: FaultInjected) -> None:
        opened: _Open | None
        if fault.kind is Kind.REQUEST and fault.id is not None:
            opened = self._span(link, fault.direction, fault.id, fault)
        elif fault.request_id is not None:
            opened = self._open.get((link, fault.direction.reverse, fault.request_id))
        else:
            return
        if opened is not None:
            opened.span.add_event(
                "fault",
                {
                    "acp.rule": fault.rule,
                    "acp.action": str(fault.action),
                    "acp.direction": fault.direction.value,
                },
            )

    def _answered(self, link: int | None, answer: Relayed) -> None:
        key = (link, answer.direction.reverse, answer.original_id or b"")
        opened = self._open.pop(key, None)
        if opened is None:
            return
        span = opened.span
        if answer.kind is Kind.ERROR:
            error = answer.message.body.get("error") if answer.message is not None else None
            code = error.get("code") if isinstance(error, dict) else None
            if isinstance(code, int):
                span.set_attribute("rpc.jsonrpc.error_code", code)
            self._finish(span, "error", error=True)
        else:
            self._finish(span, "answered")

    def _end(self, key: _Key, outcome: str, *, error: bool = False) -> None:
        opened = self._open.pop(key, None)
        if opened is not None:
            self._finish(opened.span, outcome, error=error)

    def _end_where(self, link: int | None, direction: Direction | None, outcome: str) -> None:
        """End the spans of ``link``'s requests (travelling ``direction``; None: all)."""
        ending = [
            key
            for key in self._open
            if key[0] == link and (direction is None or key[1] is direction)
        ]
        for key in ending:
            self._end(key, outcome, error=True)

    @staticmethod
    def _finish(span: Span, outcome: str, *, error: bool = False) -> None:
        span.set_attribute("acp.outcome", outcome)
        if error:
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def close(self) -> None:
        """End what is open (``acp.outcome`` ``proxy_stopped``) and send the last spans."""
        self._started.clear()
        while self._open:
            _, opened = self._open.popitem(last=False)
            self._finish(opened.span, "proxy_stopped", error=True)
        self._provider.shutdown()
