"""Consumers of the core's observations: counters and log lines.

Every :class:`~proxy.core.observations.Observation` the relay returns is handed to one
:class:`Observer`.
:class:`Tally` counts them under bounded labels (the closing log line sums it, the Prometheus
metrics read it) and :class:`LogObserver` turns the noteworthy ones into one clear log line each.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol

from proxy.core import acp
from proxy.core.jsonrpc import Kind
from proxy.core.observations import (
    CancelDropped,
    Connected,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    FaultOverflowed,
    Finding,
    Held,
    HeldEnded,
    IdReused,
    InflightRefused,
    InitializeTimedOut,
    InvalidSeen,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Orphaned,
    PeerGone,
    Relayed,
    RelayedRun,
    Restarted,
    RulesCounted,
    RulesReloaded,
    StallEnded,
    Stopped,
    TooManyPending,
    Undeliverable,
    Unroutable,
)
from proxy.shell.limits import LimitReached
from proxy.shell.log import get_logger, shorten
from proxy.shell.origin_policy import RequestRefused

__all__ = ["Fanout", "LogObserver", "Observer", "Tally"]


class Observer(Protocol):
    """Something that wants to know what the relay saw."""

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Take one observation (of link ``link``, if any); must not raise nor block."""
        ...


class Fanout:
    """Hand each observation to several observers, in order."""

    def __init__(self, observers: Iterable[Observer]) -> None:
        self._observers = list(observers)

    def extend(self, observers: Iterable[Observer]) -> None:
        """Add observers (after those given at construction)."""
        self._observers.extend(observers)

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Pass ``observation`` on to every observer."""
        for observer in self._observers:
            observer.observe(observation, link)


class Tally:
    """The one count of what the relay saw: ``(name, label, ...)`` -> count, every label bounded.

    The closing log line (``proxy finished``) sums it per name (:meth:`summary`), and the
    Prometheus counters are read from it (:class:`~proxy.shell.metrics.Metrics` owns one): a new
    observation is counted here only. Labels are text (a method is its bounded
    :func:`~proxy.core.acp.method_label`).
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, ...]] = Counter()
        self.relayed_bytes: Counter[str] = Counter()
        """Bytes of the messages relayed, by direction (a sum, not a count: not in the log line)."""

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Count ``observation`` under its name and bounded labels."""
        counts = self.counts
        if isinstance(observation, Relayed):  # one per message: before the match's cases
            direction = observation.direction
            label = acp.method_label(observation.method)
            counts["messages", direction, observation.kind, label] += 1
            self.relayed_bytes[direction] += observation.size
            return
        if isinstance(observation, RelayedRun):  # many messages, counted at once
            direction = observation.direction
            label = acp.method_label(observation.method)
            counts["messages", direction, Kind.NOTIFICATION, label] += len(observation.raws)
            self.relayed_bytes[direction] += observation.size
            return
        match observation:
            case Held(relayed=relayed):
                counts["held", relayed.direction] += 1
            case HeldEnded(outcome=outcome):
                counts["held_outcomes", outcome] += 1
            case Stopped(direction=direction, disposition=disposition):
                counts["stopped", direction, disposition] += 1
            case InvalidSeen(direction=direction, reason=reason):
                counts["invalid", direction, reason] += 1
            case Orphaned(direction=direction):
                counts["orphan_responses", direction] += 1
            case TooManyPending(direction=direction):
                counts["refused_too_many_pending", direction] += 1
            case InflightRefused(direction=direction):
                counts["refused_too_much_in_flight", direction] += 1
            case CancelDropped(direction=direction):
                counts["cancels_dropped", direction] += 1
            case IdReused(direction=direction):
                counts["ids_reused", direction] += 1
            case Undeliverable(direction=direction):
                counts["undeliverable", direction] += 1
            case Unroutable(direction=direction):
                counts["unroutable", direction] += 1
            case PeerGone(side=side, abandoned=abandoned):
                counts["peers_gone", side] += 1
                counts["abandoned_requests", side] += abandoned
            case FaultInjected(rule=rule, action=action):
                counts["faults", rule, action] += 1
            case FaultOverflowed(rule=rule, action=action):
                counts["faults_overflow", rule, action] += 1
            case DuplicateSwallowed(direction=direction):
                counts["duplicate_answers_swallowed", direction] += 1
            case Restarted(what=what, abandoned=abandoned):
                counts["restarts", what] += 1
                counts["abandoned_requests", "restart"] += abandoned
            case RulesReloaded(result=result):
                counts["reloads", result] += 1
            case Connected(side=side, transport=transport):
                counts["connections", side, transport] += 1
            case Finding(check=check):
                counts["findings", check] += 1
            case KeyedAttempt(retry=retry):
                counts["keyed_attempts", "retry" if retry else "first"] += 1
            case KeyedMessage(via=via):
                counts["keyed_messages", via] += 1
            case InitializeTimedOut():
                counts["timeouts", acp.INITIALIZE] += 1
            case RequestRefused(server=server, reason=reason):
                counts["refused_requests", server, reason] += 1
            case LimitReached(limit=limit, where=where):
                counts["limits_reached", limit, where] += 1
            case RulesCounted() | Disconnected() | StallEnded():
                pass  # counted elsewhere (a stall as the fault that began it), or not at all
            case _:
                counts["other", type(observation).__name__] += 1

    def summary(self) -> dict[str, int]:
        """Totals per name, for a closing log line; reloads per result (``reloads_success``,
        ``reloads_error``): a refused reload is no reload."""
        totals: Counter[str] = Counter()
        for key, count in self.counts.items():
            name = key[0]
            totals[f"{name}_{key[1]}" if name == "reloads" else name] += count
        return dict(sorted(totals.items()))


class LogObserver:
    """One log line per noteworthy observation; at debug level, each message relayed (when it
    left the proxy), held or stopped by a fault."""

    def __init__(self, logger: Any = None) -> None:
        self._log = logger or get_logger("proxy.relay")
        self._per_link: dict[int, Any] = {}

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Log ``observation`` at the level it deserves."""
        log = self._log
        if link is not None:
            log = self._per_link.get(link)
            if log is None:
                log = self._per_link[link] = self._log.bind(link=link)
        if isinstance(observation, RelayedRun):  # a line each, only at debug level
            if log.is_enabled_for(logging.DEBUG):
                for relayed in observation.each():
                    self.observe(relayed, link)
            return
        if isinstance(observation, Relayed):  # one per message: skip building the line
            if log.is_enabled_for(logging.DEBUG):
                extra = {} if observation.hold is None else {"hold": observation.hold}
                log.debug(
                    "relayed",
                    direction=observation.direction,
                    kind=observation.kind,
                    method=observation.method,
                    id=_text(observation.original_id),
                    forwarded_id=_text(observation.forwarded_id),
                    size=observation.size,
                    **extra,
                )
            return
        match observation:
            case Held(relayed=held):
                log.debug(
                    "held",
                    hold=observation.hold,
                    rules=list(observation.rules),
                    delay_ms=round(observation.delay * 1000, 3),
                    direction=held.direction,
                    kind=held.kind,
                    method=held.method,
                    id=_text(held.original_id),
                    forwarded_id=_text(held.forwarded_id),
                    copy=held.copy,
                    **({} if observation.held_id is None else {"held_id": observation.held_id}),
                )
            case Stopped():
                log.debug(
                    "not relayed",
                    disposition=observation.disposition,
                    rule=observation.rule,
                    direction=observation.direction,
                    kind=observation.kind,
                    method=observation.method,
                    id=_text(observation.original_id),
                    forwarded_id=_text(observation.forwarded_id),
                )
            case InvalidSeen():
                log.warning(
                    "invalid message",
                    direction=observation.direction,
                    reason=observation.reason,
                    detail=shorten(observation.detail),
                    size=observation.size,
                    handling=observation.handling,
                )
            case Orphaned():
                log.warning(
                    "response with unknown id dropped",
                    direction=observation.direction,
                    id=_text(observation.id),
                    kind=observation.kind,
                )
            case TooManyPending(first=True):
                log.warning(
                    "too many pending requests; refusing more with an error until some are "
                    "answered",
                    direction=observation.direction,
                    limit=observation.limit,
                    method=observation.method,
                    id=_text(observation.original_id),
                )
            case TooManyPending():
                log.debug(
                    "request refused: too many pending",
                    direction=observation.direction,
                    method=observation.method,
                    id=_text(observation.original_id),
                )
            case InflightRefused():
                log.debug(  # the first of a stretch is logged where the bound is kept
                    "POST refused: too many bytes in flight",
                    size=observation.size,
                    in_flight=observation.in_flight,
                )
            case CancelDropped():
                log.info(
                    "cancel for an unknown or answered request dropped",
                    direction=observation.direction,
                    request_id=_text(observation.request_id),
                )
            case IdReused():
                log.warning(
                    "request id reused while still pending; both relayed",
                    direction=observation.direction,
                    id=_text(observation.id),
                    method=observation.method,
                )
            case Undeliverable():
                named = {}
                if observation.hold is not None:
                    named = {
                        "method": observation.method,
                        "id": _text(observation.original_id),
                        "hold": observation.hold,
                    }
                what = (
                    "message for a closed peer dropped"
                    if observation.hold is None
                    else "held message not delivered: its peer closed, or the timeout that held "
                    "it cut the connection"
                )
                log.warning(
                    what,
                    direction=observation.direction,
                    kind=observation.kind,
                    size=observation.size,
                    **named,
                )
            case Unroutable():
                log.info("error with null id forwarded as is", direction=observation.direction)
            case PeerGone():
                log.info(
                    "peer disconnected",
                    side=observation.side,
                    abandoned_requests=observation.abandoned,
                )
            case FaultInjected():
                log.info(
                    "fault injected",
                    rule=observation.rule,
                    action=observation.action,
                    direction=observation.direction,
                    kind=observation.kind,
                    method=observation.method,
                    session=observation.session,
                    **_fault_ids(observation),
                )
            case HeldEnded(relayed=held):
                edit = {}
                if observation.edited_digest is not None:
                    edit = {
                        "digest": observation.digest,
                        "edited_digest": observation.edited_digest,
                    }
                log.info(
                    "held message: " + observation.outcome.replace("_", " "),
                    held_id=observation.held_id,
                    rule=observation.rule,
                    direction=held.direction,
                    method=held.method,
                    id=_text(held.original_id),
                    **edit,
                )
            case StallEnded(cut=cut):
                ending: dict[str, Any] = (
                    {"cut": [side.value for side in cut]}
                    if cut
                    else {"released": observation.released}
                )
                log.info(
                    "timeout: connection cut; what it held is lost"
                    if cut
                    else "stall ended; what it held goes on",
                    rule=observation.rule,
                    direction=observation.direction,
                    held=observation.held,
                    **ending,
                )
            case FaultOverflowed(bound="max_held", first=True):
                log.warning(
                    "hold refused: as many messages held as --max-held allows; the message goes on",
                    rule=observation.rule,
                    direction=observation.direction,
                    method=observation.method,
                    further="counted in acp_proxy_faults_overflow_total, not logged",
                )
            case FaultOverflowed(bound="max_held"):
                log.debug(
                    "hold refused: --max-held",
                    rule=observation.rule,
                    direction=observation.direction,
                    method=observation.method,
                )
            case FaultOverflowed():
                log.debug(
                    "fault refused: as many faults in progress as --max-active-faults allows",
                    rule=observation.rule,
                    action=observation.action,
                    direction=observation.direction,
                    method=observation.method,
                )
            case DuplicateSwallowed():
                log.info(
                    "answer to an injected copy swallowed",
                    direction=observation.direction,
                    method=observation.method,
                    id=_text(observation.original_id),
                    copy_id=_text(observation.forwarded_id),
                    answer=shorten(observation.data),
                )
            case Connected():
                log.info("connected", side=observation.side, transport=observation.transport)
            case InitializeTimedOut():
                log.warning(
                    "the agent did not answer initialize in time; the client got an error",
                    id=_text(observation.id),
                    forwarded_id=_text(observation.forwarded_id),
                    timeout_s=observation.timeout,
                )
            case Finding():
                log.warning(
                    "finding",
                    check=observation.check,
                    session=observation.session,
                    detail=observation.detail,
                )
            case Restarted() | RulesReloaded() | RulesCounted() | Disconnected():
                pass  # logged where they happen, with their context
            case _:
                log.debug("observation", observation=repr(observation))


def _text(token: bytes | None) -> str | None:
    return None if token is None else shorten(token, 80)


def _fault_ids(fault: FaultInjected) -> dict[str, str | None]:
    """The ids a fault's log line shows: an answer's as its requester wrote it (what a user
    finds in the Client's own log), and the one on the wire where it differs."""
    if fault.request_id is None or fault.request_id == fault.id:
        return {"id": _text(fault.id)}
    return {"id": _text(fault.request_id), "wire_id": _text(fault.id)}
