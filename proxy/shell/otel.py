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
import threading
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
from proxy.core import acp
from proxy.core.errors import StartupError
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind, Message
from proxy.core.observations import (
    Connected,
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

__all__ = ["FLUSH_SECONDS", "MAX_OPEN_SPANS", "Tracing"]

log = get_logger("proxy.otel")

MAX_OPEN_SPANS = 10_000
"""Spans open at once (requests not yet answered, over every link); past it the oldest ends."""

FLUSH_SECONDS = 3.0
"""How long the proxy, stopping, waits for its last spans to be sent (a collector that does not
answer, or a refused port the exporter retries, would hold its exit for the export timeout)."""

_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
"""The variables that choose the OTLP protocol: only ``http/protobuf`` is exported."""

_SERVICE = "acp-fault-proxy"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one."""

_PROPAGATOR = TraceContextTextMapPropagator()

_Key = tuple[int | None, Direction, bytes]
"""A request's span: its link, the direction it travels, its id as its sender wrote it."""


@dataclass(slots=True)
class _Open:
    span: Span
    turn: tuple[int | None, str] | None = None
    """For a ``session/prompt``: its link and session (see :attr:`Tracing._prompts`)."""


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
        """``exporter``: where spans go (default: OTLP/HTTP, configured by ``OTEL_*``);
        :class:`~proxy.core.errors.StartupError` when ``OTEL_*`` asks for another protocol."""
        for variable in _PROTOCOLS:
            protocol = os.environ.get(variable, "").strip()
            if protocol and protocol != "http/protobuf":
                raise StartupError(
                    "--otel",
                    f"with {variable}={protocol}",
                    "only OTLP over HTTP (http/protobuf) is exported; unset it, and point "
                    "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)",
                )
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
        self._of_link: dict[int | None, dict[_Key, None]] = {}
        """Each link's keys in :attr:`_open`, oldest first: a link's end (or its peer's) ends
        its own spans without a look at every link's."""
        self._started: dict[int, tuple[Message, Span]] = {}
        """Spans :meth:`meta_for` opened, by the identity of their message, until the observation
        of that message gives them their link (in the same turn of the loop)."""
        self._max_open = max_open
        self.evicted = 0
        self._gone: dict[int | None, set[Side]] = {}
        """Each link's connections that left (a link whose two left has ended)."""
        self._prompts: dict[tuple[int | None, str], _Key] = {}
        """The last ``session/prompt`` of each link and session still open: an Agent's request
        of that session without a ``traceparent`` of its own is a child of that prompt's span."""

    # -- the relay's question ------------------------------------------------------------------

    def meta_for(self, direction: Direction, message: Message) -> Sequence[tuple[str, str]]:
        """The ``_meta`` members to write into ``message`` as it is forwarded (``--otel-propagate``,
        :data:`~proxy.core.relay.MetaFor`): the ``traceparent`` of its span, opened here."""
        span = self._start(direction, message)
        self._started[id(message)] = (message, span)
        if len(self._started) > self._max_open:  # observed at once, always: only after a bug
            _, lost = self._started.pop(next(iter(self._started)))
            lost.set_attribute("acp.outcome", "unobserved")
            lost.end()
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
                    self._end(key, observation.disposition)
                else:  # an answer stopped: its request's span ends unanswered
                    key = (link, observation.direction.reverse, observation.original_id)
                    self._end(key, f"answer_{observation.disposition}")
            case Undeliverable() if observation.original_id is not None:
                if observation.kind is Kind.REQUEST:
                    key = (link, observation.direction, observation.original_id)
                else:
                    key = (link, observation.direction.reverse, observation.original_id)
                self._end(key, "undeliverable")
            case PeerGone(side=side):
                self._end_where(link, side.other.outbound, "peer_gone")
            case Connected(side=side):
                self._gone.get(link, set()).discard(side)
            case Disconnected(side=side):
                # A Client that closed its stdin still reads its answers (a half-close): only a
                # link both of whose connections left ends its spans.
                gone = self._gone.setdefault(link, set())
                gone.add(side)
                if len(gone) == len(Side):
                    del self._gone[link]
                    self._end_where(link, None, "link_end")
            case _:
                pass

    # -- spans ---------------------------------------------------------------------------------

    def _start(
        self,
        direction: Direction,
        message: Message | None,
        *,
        method: str | None = None,
        under: Span | None = None,
    ) -> Span:
        """A request's span: the child of its ``_meta.traceparent``, else of ``under``."""
        meta = _meta_of(message)
        carrier = {
            name: value
            for name in ("traceparent", "tracestate")
            if isinstance(value := meta.get(name), str)
        }
        if "traceparent" in carrier:
            parent = _PROPAGATOR.extract(carrier)
        elif under is not None:
            parent = trace.set_span_in_context(under)
        else:
            parent = None
        method = method or (message.method if message is not None else None)
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
            span = self._start(
                direction, message, method=seen.method, under=self._turn(link, direction, seen)
            )
        if link is not None:
            span.set_attribute("acp.link", link)
        if seen.session is not None:
            span.set_attribute("acp.session", seen.session)
        turn = None
        if seen.method == acp.PROMPT and seen.session is not None:
            turn = (link, seen.session)
            self._prompts[turn] = key
        opened = self._open[key] = _Open(span, turn)
        self._of_link.setdefault(link, {})[key] = None
        if len(self._open) > self._max_open:
            oldest_key, oldest = self._open.popitem(last=False)
            self._finish(oldest_key, oldest, "evicted", error=True)
            self.evicted += 1
        return opened

    def _turn(
        self, link: int | None, direction: Direction, seen: Relayed | Stopped | FaultInjected
    ) -> Span | None:
        """The span of the prompt whose turn an Agent's request belongs to: the last prompt of
        its session on its link, still open."""
        if direction is not Direction.TO_CLIENT or seen.session is None:
            return None
        key = self._prompts.get((link, seen.session))
        opened = None if key is None else self._open.get(key)
        return None if opened is None else opened.span

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
        if answer.kind is Kind.ERROR:
            error = answer.message.body.get("error") if answer.message is not None else None
            code = error.get("code") if isinstance(error, dict) else None
            if isinstance(code, int):
                opened.span.set_attribute("rpc.jsonrpc.error_code", code)
            self._finish(key, opened, "error", error=True)
        else:
            self._finish(key, opened, "answered")

    def _end(self, key: _Key, outcome: str) -> None:
        opened = self._open.pop(key, None)
        if opened is not None:
            self._finish(key, opened, outcome, error=True)

    def _end_where(self, link: int | None, direction: Direction | None, outcome: str) -> None:
        """End the spans of ``link``'s requests (travelling ``direction``; None: all)."""
        ending = [
            key for key in self._of_link.get(link, ()) if direction is None or key[1] is direction
        ]
        for key in ending:
            self._end(key, outcome)

    def _finish(self, key: _Key, opened: _Open, outcome: str, *, error: bool = False) -> None:
        """End a span the caller took out of :attr:`_open`."""
        keys = self._of_link.get(key[0])
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._of_link[key[0]]
        span = opened.span
        span.set_attribute("acp.outcome", outcome)
        if error:
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
        if opened.turn is not None and self._prompts.get(opened.turn) == key:
            del self._prompts[opened.turn]

    def close(self) -> None:
        """End what is open (``acp.outcome`` ``proxy_stopped``) and send the last spans."""
        self._started.clear()
        while self._open:
            key, opened = self._open.popitem(last=False)
            self._finish(key, opened, "proxy_stopped", error=True)
        # The SDK's worker is a daemon thread: a collector that does not answer loses the last
        # spans after FLUSH_SECONDS, and never holds the proxy's exit.
        flushing = threading.Thread(target=self._provider.shutdown, daemon=True)
        flushing.start()
        flushing.join(FLUSH_SECONDS)
        if flushing.is_alive():
            log.warning(
                "the last spans were not sent: the collector did not answer in time",
                seconds=FLUSH_SECONDS,
            )
