"""The relay core: one link's state machine, events in, commands out (DESIGN 5).

:meth:`Relay.handle` takes an :mod:`~proxy.core.events` event and returns the
:mod:`~proxy.core.commands` that follow from it, in the order they must happen. It never blocks,
reads a clock, logs or touches a socket; the shell in :mod:`proxy.shell.link` does all of that.

The relay rules, each pinned down by ``tests/core/test_relay.py``:

1. Request ids are rewritten per link and per direction: the proxy mints its own id for the next
   hop and puts the sender's exact id bytes back on the answer.
2. Apart from ids, a forwarded message is byte-identical: ids are spliced into the original bytes.
3. ``$/cancel_request.params.requestId`` (also inside a ``proxy/successor`` envelope) is translated
   to the next hop's id; a cancel for an unknown or answered request is dropped and recorded.
   ``elicitation/create.params.requestId`` is mapped back to the Client's id.
   ``mcp/message`` and every entity id (session, message, tool call...) are never touched.
4. Batches are relayed element by element; the proxy never creates a batch.
5. Notifications are never answered; per direction, order is kept.
6. A response whose id is unknown (or not a valid id) is dropped and recorded, never forwarded
   blindly. An error with ``"id": null`` (a parse-error answer) cannot be routed and is forwarded
   as it is.
7. Invalid input is forwarded untouched (the peer answers it as it would without a proxy), or in
   ``strict`` mode answered by the proxy; an oversized message is always answered, never forwarded.
   One where a lenient peer could still read a request id (bad UTF-8, nesting deeper than parsers
   go, a leading BOM, ``1.0``) has that id rewritten like a valid request's, so that the peer's
   answer goes back to its sender instead of being taken for another request's. Such requests
   are kept apart (the last ``MAX_INVALID_PENDING`` per direction): most peers cannot read them
   and answer under ``null``, so they count as pending nowhere and no cancel reaches them. An
   invalid answer whose readable id names a pending request goes back to its sender (not in
   ``strict`` mode); any other is dropped. Bytes that cannot be scanned at all (a batch that is
   not UTF-8, JSON cut short) are forwarded untouched. All of it lives in
   :mod:`~proxy.core.invalid`.
8. With ``initialize_timeout``, an ``initialize`` the Agent has not answered in that time is
   answered -32603 by the proxy (a timer, like a delay's); a late answer is then an orphan.
9. With ``max_pending``, a request that finds that many requests already pending in its direction
   is not forwarded: its sender gets -32603 under its own id, naming the limit (the proxy is
   overloaded by this peer; the request never reached the other peer, so a retry is safe).
   Notifications and answers always pass. Injected copies (``duplicate``) are pending requests
   too: a request's copies are cut to the room left, so the map never exceeds the bound.

Faults (DESIGN 6): each usable message (each element of a batch) is matched against the
:class:`~proxy.core.engine.FaultEngine`; the actions of the rules that fire are applied in rule
order. ``drop`` and ``error`` stop the message (``error`` answers the sender), ``corrupt`` replaces
its bytes, ``delay`` holds it behind a timer while other messages keep flowing (so a delayed message
is overtaken; undelayed ones keep their order), ``duplicate`` adds copies (a request's copies get
their own ids, and only the first answer of the group is relayed), ``sever`` cuts a connection
before or after forwarding, ``kill_agent`` and ``restart_proxy`` act after forwarding. In a batch,
forwarded elements stay in the batch; delayed elements and copies follow as single messages.

What the observations say happened, happened then: a message a fault stops is
:class:`~proxy.core.observations.Stopped`; a held message (a delay, a copy spaced by ``gap_ms``)
is :class:`~proxy.core.observations.Held` when it arrives, and its
:class:`~proxy.core.observations.Relayed` comes when its timer fires and it is sent (an
:class:`~proxy.core.observations.Undeliverable` when its peer left meanwhile), so that
observations follow the order of the wire. An answer's duration runs
from its request's arrival to its own delivery. Its id was mapped when it arrived: a held request's
answer, a cancel of it, find it.

The fast path changes none of this, only its cost. A notification no rule matches and nothing
rewrites (no cancel, no successor envelope) skips the steps that cannot change it. Messages read
together (:class:`~proxy.core.events.BurstReceived`: the lines of one read) are parsed in one
call, and each run of such notifications goes on as one :class:`~proxy.core.commands.SendRun`
and one :class:`~proxy.core.observations.RelayedRun`; whether a rule can match a run is first
judged from the burst's bytes (:meth:`~proxy.core.engine.FaultEngine.unmatched_in`). Every other
message of a burst is handled as if it came alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, assert_never

import orjson

from proxy.core import acp
from proxy.core.actions import actions
from proxy.core.actions.base import (
    MIN_WAIT,
    After,
    Breakpoint,
    CloseLate,
    Copies,
    Cut,
    CutShort,
    Effect,
    Fault,
    Freeze,
    Hold,
    KillStream,
    Now,
    Pace,
    Reply,
    Rewrite,
    Split,
    Stop,
    Subject,
    TokenBucket,
)
from proxy.core.client_faults import ACP_FAULT, CLIENT_FAULT, client_fault
from proxy.core.commands import (
    Close,
    Command,
    DropStream,
    ForgetTimer,
    Send,
    SendCut,
    SendRun,
    Sever,
    SignalAgent,
    StartTimer,
)
from proxy.core.engine import ActiveFaults, FaultEngine
from proxy.core.events import (
    BurstReceived,
    Direction,
    Event,
    MessageReceived,
    OversizedReceived,
    PeerClosed,
    Side,
    TimerFired,
)
from proxy.core.faultfile import Rule
from proxy.core.held import HeldMessage, digest, edited
from proxy.core.idmap import DuplicateGroup, IdMap, Pending
from proxy.core.invalid import InvalidInput
from proxy.core.jsonrpc import (
    Batch,
    ErrorCode,
    Invalid,
    Kind,
    Message,
    classify,
    error_response,
    has_idempotency_key,
    id_key,
    parse,
    token_at,
)
from proxy.core.observations import (
    CancelDropped,
    DuplicateSwallowed,
    FaultInjected,
    FaultOverflowed,
    Held,
    HeldEnded,
    HeldOutcome,
    HeldThen,
    IdReused,
    InitializeCached,
    InitializeTimedOut,
    Orphaned,
    PeerGone,
    Relayed,
    RelayedRun,
    RulesCounted,
    StallEnded,
    Stopped,
    Stopping,
    TooManyPending,
    Undeliverable,
    Unroutable,
    relayed_notification,
)
from proxy.core.splice import Span, meta_edits, splice

__all__ = ["DEFAULT_MAX_PENDING", "MetaFor", "Relay"]

MetaFor = Callable[[Direction, Message], Sequence[tuple[str, str]]]
"""What to set in a request's ``params._meta`` as it is forwarded (name, string value), asked
of each request the relay forwards, before its :class:`Relayed` is observed: the shell's
OpenTelemetry tracing, told to propagate, gives each its ``traceparent`` (DESIGN 5.2's one
exception to the bytes left alone, which the user asks for)."""

_REQUEST_ID_PATH: Final = ("params", "requestId")
_SIDES: Final = {
    "client": (Side.CLIENT,),
    "agent": (Side.AGENT,),
    "both": (Side.CLIENT, Side.AGENT),
}
_ANSWERS: Final = (Kind.RESPONSE, Kind.ERROR)
DEFAULT_MAX_PENDING: Final = 10_000
"""Requests one peer may have pending per link (``--max-pending``). A Client keeps a handful
pending (a prompt, a few session calls), an Agent a few permission or file requests per turn:
ten thousand is far above any of them. Each pending request costs the proxy a few hundred bytes
(half a million took 284 MiB), so the bound keeps one link's map near 6 MiB."""


@dataclass(slots=True)
class _Stall:
    """A direction where nothing goes on until ``end`` (core time), ended by timer ``token``."""

    rule: str
    end: float
    token: int
    sever: tuple[Side, ...] = ()
    """The sides cut when it ends (a ``timeout``); none: what it held goes on."""
    close_code: int = 1001
    holds: dict[int, None] = field(default_factory=dict)
    """The timers of the messages it holds, in the order they came (a dict: looked up too)."""


@dataclass(frozen=True, slots=True)
class _Timed:
    """What a timer holds: commands to carry out, and the relay observation of the message among
    them, made when it arrived (``at``)."""

    commands: list[Command]
    relayed: Relayed | None = None
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class _Copies:
    """The copies a ``duplicate`` rule asked for of a message a ``hold`` rule holds: ``count``
    of them, ``gap`` seconds apart (``spaced_by``: the rules that space them), made from the
    message that leaves (an edit's, when edited), rewritten as ``rewrite`` says."""

    count: int
    gap: float
    spaced_by: tuple[str, ...]
    rewrite: Rewrite | None = None


@dataclass(frozen=True, slots=True)
class _Release:
    """What is left to do when a message whose hold ended (released, edited, timed out) leaves:
    ``message`` translated again then (a cancel names a request by the id it has then: one
    answered meanwhile is cancelled no more), and its ``copies`` made."""

    held: HeldMessage
    message: Message | None = None
    copies: _Copies | None = None


class Relay:
    """The state of one link: pending requests both ways, held messages, which peers are gone."""

    __slots__ = (
        "_buckets",
        "_cached_initialize",
        "_closing",
        "_deadlines",
        "_downstream",
        "_ended",
        "_engine",
        "_fast_path",
        "_held_copies",
        "_initialize_timeout",
        "_invalid",
        "_keep_upstream",
        "_maps",
        "_max_pending",
        "_meta_for",
        "_origin",
        "_paused",
        "_paused_tokens",
        "_refused_pending",
        "_releasing",
        "_reordered",
        "_reorders",
        "_slow_closes",
        "_stall_ends",
        "_stalls",
        "_timers",
        "_tokens",
        "active_faults",
        "initialize_answer",
    )

    def __init__(
        self,
        *,
        strict: bool = False,
        engine: FaultEngine | None = None,
        origin: float = 0.0,
        ids: Mapping[Direction, Iterator[int]] | None = None,
        tokens: Iterator[int] | None = None,
        downstream: str = "stdio",
        keep_upstream: bool = False,
        cached_initialize: bytes | None = None,
        initialize_timeout: float | None = None,
        max_pending: int | None = None,
        fast_path: bool = True,
        meta_for: MetaFor | None = None,
    ) -> None:
        """``origin``: the time the proxy started (rules' ``start_ms``/``stop_ms`` count from it).

        ``ids``: the counters that mint ids per direction; give the relay that replaces this one
        after a restart the same counters, so that ids are never reused. ``tokens``: the counter
        that numbers its timers; give the relays of one link the same, so that a timer of one
        can never be taken for another's. ``downstream``: the
        Client's transport (``stdio``, ``http``, ``ws``), which decides the HTTP-only faults.
        ``keep_upstream`` (conductor mode): when the Client leaves, the Agent's connection is
        kept for the next Client. ``cached_initialize``: the Agent's answer to the first Client's
        ``initialize``; this relay's Client gets it instead of reaching the Agent again.
        ``initialize_timeout``: seconds the Agent has to answer ``initialize`` (None: no bound).
        ``max_pending``: requests each direction may have pending; past it a request is refused
        (rule 9; None: no bound). ``fast_path``: a plain notification that no rule can match is
        relayed without the steps that cannot change it (:meth:`_plain`), and a request or an
        answer that no rule can match without a rule's decision; ``False`` sends every message
        through all of them (the tests compare both). ``meta_for``: members set in each
        forwarded request's ``params._meta`` (:data:`MetaFor`; None: the bytes stay).
        """
        self._downstream = downstream
        self._keep_upstream = keep_upstream
        self._cached_initialize = cached_initialize
        self.initialize_answer: bytes | None = cached_initialize
        """The Agent's answer to ``initialize`` (handed to the next Client in conductor mode)."""
        self._engine = engine
        self.active_faults = engine.active if engine is not None else ActiveFaults()
        """The faults in progress, counted by the shell as their timers start and end (the
        engine's: shared by every link)."""
        self._fast_path = fast_path
        self._meta_for = meta_for
        self._origin = origin
        counters = ids or {}
        self._maps = {direction: IdMap(counters.get(direction)) for direction in Direction}
        self._ended: set[Side] = set()
        """Peers whose stream to the proxy has ended (nothing more will come from them)."""
        self._closing: set[Side] = set()
        """Peers the proxy has closed its connection to (nothing more will be sent to them)."""
        self._timers: dict[int, _Timed] = {}
        self._reorders: dict[Direction, list[list[int]]] = {}
        """Per direction, the held messages a ``reorder`` waits to see overtaken: ``[timer
        token, messages still to pass it]``."""
        self._reordered: list[list[int]] = []
        """Those the message being handled made (counted from the next message on)."""
        self._stalls: dict[Direction, _Stall] = {}
        """Per direction, the stall (``stall``, ``timeout``) that holds everything there now."""
        self._slow_closes: dict[Side, float] = {}
        """Per peer, how late the close toward it comes (``slow_close``)."""
        self._buckets: dict[tuple[str, Direction], TokenBucket] = {}
        """The ``bandwidth`` rules' token buckets, by rule and direction."""
        self._paused: dict[int, HeldMessage] = {}
        """The messages ``hold`` rules hold on this link, by their proxy-wide id."""
        self._paused_tokens: dict[int, int] = {}
        """Timer token -> the id of the message a ``hold`` rule holds behind it."""
        self._held_copies: dict[int, _Copies] = {}
        """Timer token -> the copies a ``duplicate`` rule makes of the message a ``hold`` rule
        holds behind it: made when it leaves (dropped, it has none)."""
        self._releasing: dict[int, _Release] = {}
        """Timer token -> what is left to do when the message it holds, let go by its ``hold``
        rule's end but waiting still (in a stall), leaves: its ids translated then, its copies."""
        self._stall_ends: dict[int, Direction] = {}
        """Timer token -> the direction whose stall ends when it fires."""
        self._tokens = tokens if tokens is not None else itertools.count()
        self._initialize_timeout = initialize_timeout
        self._deadlines: dict[int, bytes] = {}
        """Timer token -> the forwarded id of an ``initialize`` that must be answered by then."""
        self._max_pending = max_pending
        self._refused_pending: set[Direction] = set()
        """Directions that have had a request refused for ``max_pending`` (logged once each)."""
        self._invalid = InvalidInput(self._maps, strict=strict)
        """Invalid input (rule 7): answered or forwarded, its readable requests kept apart."""

    def pending(self, direction: Direction) -> int:
        """How many requests travelling ``direction`` await their answer."""
        return len(self._maps[direction])

    def held(self, direction: Direction) -> int:
        """How many messages travelling ``direction`` a fault holds now (a delay, a stall, a
        throttle, a reorder, a hold: an answer held is no longer pending, and not yet
        delivered; a request held still is)."""
        destination = direction.destination
        return sum(
            1
            for timed in self._timers.values()
            for command in timed.commands
            if type(command) is Send and command.to is destination
        )

    def has_ended(self, side: Side) -> bool:
        """Whether the stream from ``side`` has ended."""
        return side in self._ended

    def handle(self, event: Event) -> list[Command]:
        """Feed one event; return what must happen, in order."""
        match event:
            case MessageReceived(side=side, data=data, at=at, parsed=parsed):
                return self._message(side.outbound, data, at, parsed)
            case OversizedReceived(side=side, size=size, limit=limit):
                return self._invalid.oversized(side.outbound, size, limit)
            case PeerClosed(side=side):
                return self._peer_closed(side)
            case TimerFired(token=token, at=at):
                return self._fired(token, at)

    # -- messages -------------------------------------------------------------------------------

    def _message(
        self,
        direction: Direction,
        data: bytes,
        at: float,
        parsed: Message | Batch | Invalid | None = None,
    ) -> list[Command]:
        """One message travelling ``direction``, and the held messages it overtakes."""
        out = self._received(direction, data, at, parsed)
        if self._reorders and direction in self._reorders:
            self._overtaken(direction, out, at)
        if self._reordered:  # held by this message: only later ones can pass them
            self._reorders.setdefault(direction, []).extend(self._reordered)
            self._reordered.clear()
        return out

    def handle_burst(self, event: BurstReceived) -> tuple[list[Command], int]:
        """Feed messages read together: the run of notifications at their head that go on as
        they came (:meth:`_passes`), as one :class:`SendRun` and one :class:`RelayedRun` per
        method, then the message after it, alone (:meth:`handle` would do the same with it).
        Return the commands and how many messages were taken (at least one): the shell carries
        the commands out before it feeds the rest, since one may change where the next goes
        (a restart, a sever). The bytes, their order and what is observed are those of a
        :class:`MessageReceived` each."""
        direction, messages, at = event.side.outbound, event.messages, event.at
        if not self._fast_path:
            return self._message(direction, messages[0], at), 1
        out: list[Command] = []
        verdicts: dict[str, bool] = {}
        joined: list[bytes] = []

        def burst() -> bytes:
            if not joined:
                joined.append(b"\n".join(messages))
            return joined[0]

        loads = orjson.loads
        start = 0
        run: str | None = None  # the method of the run being gathered, from ``start`` on
        every = False  # every notification of the run's method passes, whatever its body
        bodies: list[dict[str, Any]] = []
        for index, data in enumerate(messages):
            try:
                body = loads(data)
            except orjson.JSONDecodeError:
                parsed = None  # invalid, or JSON only the standard library reads: parsed alone
            else:
                if (
                    type(body) is dict
                    and "id" not in body
                    and type(method := body.get("method")) is str
                    and (
                        (method == run and every)
                        or self._passes(direction, method, body, verdicts, burst)
                    )
                ):
                    if method != run:
                        if run is not None:
                            self._run(direction, run, messages[start:index], bodies, out)
                            bodies = []
                        start, run = index, method
                        every = self._engine is None or verdicts.get(method, False)
                    bodies.append(body)
                    continue
                parsed = classify(data, body)
            if run is not None:
                self._run(direction, run, messages[start:index], bodies, out)
            out.extend(self._message(direction, data, at, parsed))
            return out, index + 1
        if run is not None:
            self._run(direction, run, messages[start:], bodies, out)
        return out, len(messages)

    def _passes(
        self,
        direction: Direction,
        method: str,
        body: dict[str, Any],
        verdicts: dict[str, bool],
        burst: Callable[[], bytes],
    ) -> bool:
        """Whether the notification ``body`` of a burst goes on as it came, unobserved by any
        rule (:meth:`_plain`); ``verdicts`` keeps, per method, whether the burst's bytes show
        that no rule can match it (:meth:`FaultEngine.unmatched_in`)."""
        if (
            direction.destination in self._closing
            or direction in self._reorders
            or direction in self._stalls
            or method == acp.CANCEL_REQUEST
            or method in acp.SUCCESSORS
        ):
            return False
        engine = self._engine
        if engine is None:
            return True
        verdict = verdicts.get(method)
        if verdict is None:
            found = engine.unmatched_in(
                direction, Kind.NOTIFICATION, self._downstream, method, burst()
            )
            if found is None:  # a shape the rules have not seen: decided in full
                return False
            verdict = verdicts[method] = found
        return verdict or engine.unmatched(
            direction, Kind.NOTIFICATION, self._downstream, method, body
        )

    def _run(
        self,
        direction: Direction,
        method: str,
        messages: Sequence[bytes],
        bodies: Sequence[dict[str, Any]],
        out: list[Command],
    ) -> None:
        """A run of notifications of ``method`` that go on as they came: observed, then sent."""
        size = sum(map(len, messages))
        out.append(
            RelayedRun(direction=direction, method=method, size=size, raws=messages, bodies=bodies)
        )
        out.append(SendRun(direction.destination, messages))

    def _received(
        self,
        direction: Direction,
        data: bytes,
        at: float,
        parsed: Message | Batch | Invalid | None = None,
    ) -> list[Command]:
        out: list[Command] = []
        if parsed is None:
            parsed = parse(data)
        destination = direction.destination
        if destination in self._closing:
            out.append(Undeliverable(direction=direction, kind=parsed.kind, size=len(data)))
            return out
        if isinstance(parsed, Invalid):
            self._invalid.message(direction, parsed, at, out, self._answered)
            return out
        if isinstance(parsed, Message):
            if (
                self._fast_path
                and parsed.kind is Kind.NOTIFICATION
                and direction not in self._stalls
                and self._plain(direction, parsed)
            ):
                out.append(relayed_notification(direction, parsed))
                out.append(Send(destination, data))
                return out
            forwards, after = self._process(direction, parsed, at, out)
            for data_out in forwards:
                out.append(Send(destination, data_out))
            if after:
                out.extend(after)
            return out
        kept: list[bytes] = []
        after_all: list[Command] = []
        for element in parsed.elements:
            if destination in self._closing:  # an element cut short, or a sever before it
                size = len(element.raw)
                out.append(Undeliverable(direction=direction, kind=element.kind, size=size))
                continue
            if isinstance(element, Invalid):
                forward = self._invalid.element(direction, element, at, out, self._answered)
                if forward is not None:
                    kept.append(forward)
            else:
                forwards, after = self._process(direction, element, at, out, whole=True)
                kept.extend(forwards)
                after_all.extend(after)
                if kept and destination in self._closing:  # those before the cut go first
                    ends = (i for i, c in enumerate(out) if _ends(c, destination))
                    batch = Send(destination, b"[" + b",".join(kept) + b"]")
                    out.insert(next(ends, len(out)), batch)
                    kept = []
        if kept:
            out.append(Send(destination, b"[" + b",".join(kept) + b"]"))
        out.extend(after_all)
        return out

    def _plain(self, direction: Direction, message: Message) -> bool:
        """Whether the notification ``message`` is relayed as it is, whatever the rest of the
        relay would do with it: no id in it to translate (not a cancel, nor an envelope that may
        hold one) and no rule that matches it."""
        method = message.method
        if method == acp.CANCEL_REQUEST or method in acp.SUCCESSORS:
            return False
        engine = self._engine
        return engine is None or engine.unmatched(
            direction, Kind.NOTIFICATION, self._downstream, method, message.body
        )

    def _process(
        self,
        direction: Direction,
        message: Message,
        at: float,
        out: list[Command],
        *,
        whole: bool = False,
    ) -> tuple[list[bytes], list[Command]]:
        """Apply the rules that fire, then relay: (bytes to forward now, commands to follow).
        ``whole``: the message is an element of a batch, written with it (never in pieces)."""
        if message.kind is Kind.REQUEST and self._room(direction) <= 0:
            self._refuse_pending(direction, message, out)
            return [], []
        engine = self._engine
        if engine is None:
            return self._translate(direction, message, at, out), []
        asked: Rule | None = None
        if engine.client_faults and direction is Direction.TO_AGENT:
            hinted = client_fault(message)
            if isinstance(hinted, str):
                self._refuse_hint(direction, message, hinted, out)
                return [], []
            if hinted is not None:
                asked, message = hinted
        method, session, keyed, params = self._matched_as(direction, message)
        if (
            asked is None
            and self._fast_path
            and direction not in self._stalls
            and engine.unmatched_as(
                direction,
                message.kind,
                self._downstream,
                method,
                session=session,
                keyed=keyed,
                params=params,
            )
        ):  # no rule can match: nothing to count, draw or build a subject for
            return self._translate(direction, message, at, out), []
        subject = Subject(direction, message.kind, method, session, keyed, params, self._downstream)
        if asked is not None and not (action := actions[asked.do.action]).applies(
            asked.do, subject
        ):
            why = f"{action.name} cannot act on this request"
            if action.needs_http:
                why += " (it acts only on Clients that connect over Streamable HTTP)"
            self._refuse_hint(direction, message, why, out)
            return [], []
        acting = asked is None or asked.continue_  # a Client's fault acts first, alone
        decision = engine.decide(subject, (at - self._origin) * 1000, acting=acting)
        if decision.counted:
            out.append(RulesCounted())
        fired = decision.fired if asked is None else (asked, *decision.fired)
        if not fired and direction not in self._stalls:
            return self._translate(direction, message, at, out), []
        stopped_by: tuple[str, Stopping] | None = None
        stream_dropped = False
        rewrite: Rewrite | None = None
        delay = gap = 0.0
        overtakers = 0
        cut_at: int | None = None
        split: Split | None = None
        freeze: tuple[str, Freeze] | None = None
        pause: tuple[str, Breakpoint] | None = None
        delayed_by: list[str] = []
        paced_by: list[str] = []
        spaced_by: list[str] = []
        copies = 0
        after: list[Command] = []
        request_id = self._request_id(direction, message)
        room = engine.active.room()  # faults in progress this message may still start
        for rule in fired:
            state = engine.states.get(rule.name)
            memory = {} if state is None else state.memory  # a Client's fault keeps nothing
            fault = Fault(message, subject, engine.rng, rule.name, memory)
            params = rule.do
            effects = actions[params.action].apply(params, fault)
            waits = [
                self._paced(rule.name, direction, effect, len(message.raw), at, take=False)
                for effect in effects
                if type(effect) is Pace
            ]
            if waits and len(waits) == len(effects) and not any(waits):  # bytes to spare
                for effect in effects:
                    assert isinstance(effect, Pace)
                    self._paced(rule.name, direction, effect, len(message.raw), at, take=True)
                engine.did_not_act(rule)
                continue
            lasting = _lasting(effects) + sum(1 for wait in waits if wait)
            held_full = engine.held.full() and any(type(e) is Breakpoint for e in effects)
            if held_full or lasting > room:  # the message goes on as if the rule had not matched
                engine.did_not_act(rule)
                first = held_full and not engine.held.refused
                engine.held.refused = engine.held.refused or held_full
                out.append(
                    FaultOverflowed(
                        rule=rule.name,
                        action=params.action,
                        direction=direction,
                        method=subject.method,
                        bound="max_held" if held_full else "max_active_faults",
                        first=first,
                    )
                )
                continue
            room -= lasting
            out.append(
                FaultInjected(
                    rule=rule.name,
                    action=params.action,
                    direction=direction,
                    kind=message.kind,
                    method=subject.method,
                    session=subject.session,
                    id=message.id_token,
                    request_id=request_id,
                    message=message,
                )
            )
            for effect in effects:
                match effect:
                    case Stop(how=how):
                        stopped_by = stopped_by or (rule.name, how)
                    case Reply(data=data):
                        out.append(Send(direction.source, data))
                    case Hold(seconds=seconds, passed=passed):
                        delay += seconds
                        delayed_by.append(rule.name)
                        if passed is not None:
                            overtakers = passed
                    case Breakpoint(timeout=timeout):
                        delay += timeout
                        delayed_by.append(rule.name)
                        pause = pause or (rule.name, effect)
                    case Pace():
                        size = len(message.raw)
                        if wait := self._paced(rule.name, direction, effect, size, at, take=True):
                            delay += wait
                            delayed_by.append(rule.name)
                            paced_by.append(rule.name)
                    case Copies(count=count, gap=spacing):
                        copies += count
                        gap = spacing
                        if spacing:
                            spaced_by.append(rule.name)
                    case Rewrite():
                        rewrite = effect  # the last rule's rewriting wins
                    case Cut(sides=sides, before=before, close_code=close_code):
                        severs = [Sever(s, not before, close_code) for s in _SIDES[sides]]
                        if before:
                            self._closing.update(_SIDES[sides])
                            out.extend(severs)
                        else:
                            after.extend(severs)
                    case CutShort(size=size):
                        cut_at = size
                    case Split():
                        split = split or effect
                    case Freeze():
                        freeze = freeze or (rule.name, effect)
                    case CloseLate(seconds=seconds):
                        self._slow_closes[direction.destination] = seconds
                    case KillStream():
                        stream_dropped = True
                    case Now(command=command):
                        out.append(command)
                    case After(command=command, delay=later):
                        after.append(self._hold(later, [command]) if later else command)
                    case _:
                        assert_never(effect)
        if stopped_by is not None:
            out.append(self._stopped(direction, message, subject, *stopped_by))
            self._closing.update(c.side for c in after if isinstance(c, Sever))
            return [], after
        seen: list[Command] = []
        forwards = self._translate(direction, message, at, seen)
        relayed = next((c for c in seen if isinstance(c, Relayed)), None)
        if stream_dropped:
            out.extend(seen)
            out.extend(DropStream(direction.destination, data) for data in forwards)
            return [], after
        if cut_at is not None and forwards:  # at once, whatever else fired: nothing follows
            out.extend(seen)
            destination = direction.destination
            out.extend(SendCut(destination, data, cut_at) for data in forwards)
            self._closing.add(destination)
            return [], []
        extra = []
        held_copies: _Copies | None = None
        if copies and pause is not None and relayed is not None and forwards:
            # Under the breakpoint: made when the message leaves, from what leaves (none if
            # dropped), spaced from then on.
            held_copies = _Copies(copies, gap, tuple(spaced_by), rewrite)
        elif copies:
            extra = self._copies(direction, message, relayed, forwards, count=copies, at=at)
        if rewrite is not None:
            forwards = [rewrite.transform(data) for data in forwards]
            extra = [(rewrite.transform(data), seen_copy) for data, seen_copy in extra]
            if rewrite.unreadable and message.kind is Kind.REQUEST and forwards:
                self._unanswerable(direction, message, len(forwards) + len(extra))
        destination = direction.destination
        now, own = forwards, len(forwards)
        pieces = () if split is None or whole else (split.sizes, split.gap)
        if freeze is not None and direction not in self._stalls:
            out.append(self._stall(direction, *freeze, at))  # its end fires before its holds
        stall = self._stalls.get(direction)
        if stall is not None:  # held until the stall ends (its end lets it go, in order)
            if pause is None:  # a breakpoint's timeout stays its own (see _end_stall)
                delay = max(delay, stall.end - at, 1e-6)
            if stall.rule not in delayed_by:
                delayed_by.append(stall.rule)
        if delay > 0:
            now = []
            out.extend(c for c in seen if c is not relayed)  # its relay waits for the timer
            sends: list[Command] = [Send(destination, data, *pieces) for data in forwards]
            timer = self._hold(delay, sends + after, relayed, at)
            for name in paced_by:  # the next message of its buckets goes behind it
                self._buckets[name, direction].holding = timer.token
            if stall is not None:
                stall.holds[timer.token] = None
            if overtakers:
                self._reordered.append([timer.token, overtakers])
            if relayed is not None and forwards:
                held_id = then = None
                if pause is not None:
                    then = pause[1].then
                    held_id = self._pause(
                        message, relayed, timer, rule=pause[0], then=then, copies=held_copies
                    )
                    # Kept as it came too (the API shows it, an edit is checked against it):
                    # those bytes are in flight as well.
                    timer = StartTimer(timer.delay, timer.token, timer.size + len(message.raw))
                out.append(
                    Held(
                        hold=timer.token,
                        rules=tuple(delayed_by),
                        delay=delay,
                        relayed=relayed,
                        held_id=held_id,
                        then=then,
                    )
                )
            after = [timer]
        else:
            out.extend(seen)
            self._closing.update(c.side for c in after if isinstance(c, Sever))
        for index, (copy, seen_copy) in enumerate(extra, start=1):
            when_due = delay + index * gap
            if when_due > 0:
                timer = self._hold(when_due, [Send(destination, copy)], seen_copy, at)
                if seen_copy is not None:
                    rules = tuple(delayed_by + (spaced_by if gap else []))
                    out.append(
                        Held(hold=timer.token, rules=rules, delay=when_due, relayed=seen_copy)
                    )
                after.append(timer)
            else:
                if seen_copy is not None:
                    out.append(seen_copy)
                now.append(copy)
        if pieces and delay <= 0 and now:  # in pieces: its copies (whole) and the rest after it
            sends = [Send(destination, data, *pieces) for data in now[:own]]
            sends += [Send(destination, data) for data in now[own:]]
            return [], [*sends, *after]
        return now, after

    def _paced(
        self, rule: str, direction: Direction, pace: Pace, size: int, at: float, *, take: bool
    ) -> float:
        """How long a message of ``size`` bytes waits in ``rule``'s bucket (``take``: its bytes
        are taken out). Never less than the last message the bucket holds: one whose wait is
        over but whose timer has not fired yet is still ahead of it."""
        bucket = self._bucket(rule, direction, pace, at)
        wait = bucket.take(size, at) if take else bucket.wait(size, at)
        if not wait and bucket.holding in self._timers:
            return MIN_WAIT
        return wait

    def _bucket(self, rule: str, direction: Direction, pace: Pace, at: float) -> TokenBucket:
        """The token bucket of ``rule`` in ``direction`` on this link (a new rate or size, from
        a rule changed since, starts a new one)."""
        bucket = self._buckets.get((rule, direction))
        if bucket is None or (bucket.rate, bucket.size) != (pace.bytes_per_second, pace.burst):
            bucket = TokenBucket.full(pace.bytes_per_second, pace.burst, at)
            self._buckets[rule, direction] = bucket
        return bucket

    def _room(self, direction: Direction) -> int:
        """How many more requests ``direction`` may have pending (``max_pending``)."""
        if self._max_pending is None:
            return 1 << 62
        return self._max_pending - len(self._maps[direction])

    def _refuse_pending(self, direction: Direction, message: Message, out: list[Command]) -> None:
        """Rule 9: the sender has too many requests pending; it gets an error, nothing goes on."""
        assert message.id_token is not None
        limit = self._max_pending
        assert limit is not None
        first = direction not in self._refused_pending
        self._refused_pending.add(direction)
        out.append(
            TooManyPending(
                direction=direction,
                method=message.method,
                session=message.session,
                original_id=message.id_token,
                limit=limit,
                first=first,
            )
        )
        if direction.source not in self._closing:
            text = (
                f"Too many pending requests: the proxy relays at most {limit} unanswered "
                "requests per peer and link (--max-pending); retry once some are answered"
            )
            data = {"limit": "max_pending", "max_pending": limit}
            error = error_response(message.id_token, ErrorCode.INTERNAL_ERROR, text, data)
            out.append(Send(direction.source, error))

    def _refuse_hint(
        self, direction: Direction, message: Message, why: str, out: list[Command]
    ) -> None:
        """A request asked for a fault it cannot have: it is answered -32602, saying why, and
        goes no further (forwarded, its hint would reach the Agent as if it were the Client's)."""
        assert message.id_token is not None
        where = f"{ACP_FAULT} header" if message.fault_header is not None else "_meta.acpFault"
        text = f"{where}: {why}"
        out.append(Send(direction.source, error_response(message.id_token, -32602, text)))
        subject = self._subject(direction, message)
        out.append(self._stopped(direction, message, subject, CLIENT_FAULT, "answered_by_proxy"))

    def _stopped(
        self, direction: Direction, message: Message, subject: Subject, rule: str, how: Stopping
    ) -> Stopped:
        """A fault stopped ``message``; an answer's request is forgotten (its answer is lost)."""
        original, forwarded = message.id_token, None
        if message.kind in _ANSWERS and message.id_token is not None:
            request = self._maps[direction.reverse].pop(message.id_token)
            if request is not None:
                original, forwarded = request.original_id, message.id_token
        return Stopped(
            direction=direction,
            kind=message.kind,
            method=subject.method,
            session=subject.session,
            size=len(message.raw),
            original_id=original,
            forwarded_id=forwarded,
            rule=rule,
            disposition=how,
            message=message,
        )

    def _unanswerable(self, direction: Direction, message: Message, count: int) -> None:
        """The last ``count`` requests forwarded for ``message`` left corrupted: no peer can
        parse an id out of them, so no answer will ever come; they are not kept pending (a long
        run of corrupted requests would otherwise grow the map without end)."""
        assert message.id_key is not None
        requests = self._maps[direction]
        for pending in requests.pending_with(message.id_key)[-count:]:
            requests.pop(pending.forwarded_id)

    def _request_id(self, direction: Direction, message: Message) -> bytes | None:
        """For an answer, its request's id as the requester wrote it (``None`` for others)."""
        if message.kind not in _ANSWERS or message.id_token is None:
            return None
        request = self._maps[direction.reverse].get(message.id_token)
        return None if request is None else request.original_id

    def _subject(self, direction: Direction, message: Message) -> Subject:
        """What rules match on (:meth:`_matched_as`)."""
        method, session, keyed, params = self._matched_as(direction, message)
        return Subject(direction, message.kind, method, session, keyed, params, self._downstream)

    def _matched_as(
        self, direction: Direction, message: Message
    ) -> tuple[str | None, str | None, bool, Any]:
        """The method, session, key and params rules match ``message`` on: an answer takes its
        request's method, session and key (and has no params)."""
        if message.kind in _ANSWERS:
            assert message.id_token is not None
            request = self._maps[direction.reverse].get(message.id_token)
            if request is None:
                return None, None, False, None
            return request.method, request.session, request.keyed, None
        params = message.params
        return message.method, message.session, has_idempotency_key(params), params

    def _copies(
        self,
        direction: Direction,
        message: Message,
        relayed: Relayed | None,
        forwards: list[bytes],
        *,
        count: int,
        at: float,
        primary: Pending | None = None,
    ) -> list[tuple[bytes, Relayed | None]]:
        """``count`` extra copies, each with its relay observation; a request's copies are new
        requests of one duplicate group with ``primary`` (default: the last request pending
        under the message's id)."""
        if message.kind is not Kind.REQUEST:
            seen = None if relayed is None else replace(relayed, copy=True, duration=None)
            return [
                (data, seen if index == 0 else None)
                for _ in range(count)
                for index, data in enumerate(forwards)
            ]
        assert message.id_token is not None
        assert message.id_key is not None
        assert message.method is not None
        requests = self._maps[direction]
        if primary is None:
            primary = requests.pending_with(message.id_key)[-1]
        group = primary.group = DuplicateGroup()
        copies: list[tuple[bytes, Relayed | None]] = []
        for _ in range(min(count, self._room(direction))):  # rule 9: copies are pending too
            copy = requests.add(
                message.id_token,
                message.id_key,
                message.method,
                primary.session,
                at,
                keyed=primary.keyed,
                group=group,
            )
            data = splice(message.raw, [(s, copy.forwarded_id) for s in message.id_spans])
            seen = Relayed(
                direction=direction,
                kind=Kind.REQUEST,
                method=message.method,
                session=primary.session,
                size=len(message.raw),
                original_id=message.id_token,
                forwarded_id=copy.forwarded_id,
                message=message,
                copy=True,
            )
            copies.append((data, seen))
        return copies

    def _hold(
        self,
        delay: float,
        commands: list[Command],
        relayed: Relayed | None = None,
        at: float = 0.0,
    ) -> StartTimer:
        """Keep ``commands`` until a timer of ``delay`` seconds fires; ``relayed``: the relay
        observation of the message they send, which arrived at ``at``."""
        token = next(self._tokens)
        self._timers[token] = _Timed(commands, relayed, at)
        size = sum(len(command.data) for command in commands if isinstance(command, Send))
        return StartTimer(delay, token, size)

    def _stall(self, direction: Direction, rule: str, freeze: Freeze, at: float) -> StartTimer:
        """Start the stall of ``direction`` a rule's :class:`Freeze` asks for; its end timer."""
        token = next(self._tokens)
        sides = () if freeze.sever is None else _SIDES[freeze.sever]
        self._stalls[direction] = _Stall(rule, at + freeze.seconds, token, sides, freeze.close_code)
        self._stall_ends[token] = direction
        return StartTimer(freeze.seconds, token)

    def _end_stall(
        self, direction: Direction, at: float, *, released: bool = False
    ) -> list[Command]:
        """The stall of ``direction`` ends (``released``: by the control API): what it held goes
        on, in order; or, for a timeout, the connection is cut first and what it held is lost
        (undeliverable). A message a ``hold`` rule holds that the control API has not acted on
        is let be: its hold ends only by the API, its own timeout or its link's end, and then
        it goes on at once (after what the stall let go: in that direction, its own order is
        lost, as past a ``delay``; into a connection the timeout cut it is undeliverable)."""
        stall = self._stalls.pop(direction, None)  # gone: _release lets its holds go now
        if stall is None:
            return []
        ended = StallEnded(
            rule=stall.rule,
            direction=direction,
            held=len(stall.holds),
            released=released,
            cut=stall.sever,
        )
        out: list[Command] = [ended]
        out.extend(Sever(side, False, stall.close_code) for side in stall.sever)
        self._closing.update(stall.sever)
        for token in stall.holds:
            if token in self._paused_tokens:
                continue  # a breakpoint nobody acted on: held still, by its rule alone
            out.extend(self._release_early(token, at, lose=bool(stall.sever)))
        return out

    def release_stalls(self, at: float) -> list[Command]:
        """End every ``stall`` now (the control API's release): what each held goes on, and
        its end's timer is forgotten. A ``timeout`` runs its course."""
        out: list[Command] = []
        for direction, stall in list(self._stalls.items()):
            if not stall.sever:
                del self._stall_ends[stall.token]
                out.append(ForgetTimer(stall.token))
                out.extend(self._end_stall(direction, at, released=True))
        return out

    # -- messages a hold rule holds (proxy.core.held) ----------------------------------------------
    #
    # A hold ends in one of three ways: the control API acts on it (release, drop, edit:
    # :meth:`_settle`, before its timer fired), its own timer fires (its ``then``:
    # :meth:`_timed_out`), or its relay goes (:meth:`discard_held`). Nothing else ends it: a
    # stall's end and a reorder's count let it be. Let go within a stall, the message still waits
    # for the stall's end (nothing leaves a stalled direction); what is left to do when it leaves
    # (a cancel translated again, its copies made) waits with it (:class:`_Release`).

    def held_messages(self) -> list[HeldMessage]:
        """The messages ``hold`` rules hold on this link, in the order they came."""
        return list(self._paused.values())

    def release_held(self, held_id: int, at: float) -> list[Command] | None:
        """Let the held message ``held_id`` go on now (None: this link holds no such message).
        In a stalled direction it goes on when the stall ends, in order."""
        held = self._paused.get(held_id)
        return None if held is None else self._settle(held, "release", at)

    def drop_held(self, held_id: int, at: float) -> list[Command] | None:
        """Drop the held message ``held_id`` (a request is then never answered: it is pending no
        more); None: this link holds no such message."""
        held = self._paused.get(held_id)
        return None if held is None else self._settle(held, "drop", at)

    def edit_held(self, held_id: int, data: bytes, at: float, limit: int) -> list[Command] | None:
        """Let the held message ``held_id`` go on now as ``data`` (its id rewritten as the
        original's would have been); :class:`~proxy.core.held.EditRefused` when ``data`` cannot
        replace it (:func:`~proxy.core.held.edited`; ``limit``: ``--max-message-bytes``); None:
        this link holds no such message."""
        held = self._paused.get(held_id)
        if held is None:
            return None
        return self._settle(held, "edit", at, edit=edited(held, data, limit))

    def discard_held(self) -> list[Command]:
        """The link ends, or a new relay replaces this one: every message ``hold`` rules hold is
        lost (observed as such), and the shell forgets its timer now (its bytes and its fault in
        progress are no longer counted; it must not fire into the relay that comes next)."""
        out: list[Command] = []
        for held in self._paused.values():
            self._timers.pop(held.token, None)
            self._held_copies.pop(held.token, None)
            out.append(self._hold_ended(held, "link_end"))
            out.append(ForgetTimer(held.token))
        if self._engine is not None:
            self._engine.held.count -= len(self._paused)
        self._paused.clear()
        self._paused_tokens.clear()
        return out

    def _pause(
        self,
        message: Message,
        relayed: Relayed,
        timer: StartTimer,
        *,
        rule: str,
        then: HeldThen,
        copies: _Copies | None,
    ) -> int:
        """Keep the message held behind ``timer`` as a ``hold`` rule's (its timeout: the
        timer's delay), with the ``copies`` it is to have when it leaves; its new id."""
        token, at = timer.token, self._timers[timer.token].at
        engine = self._engine
        assert engine is not None  # no rule holds anything without one
        held_id = engine.held_ids.take()
        engine.held.count += 1
        self._paused[held_id] = HeldMessage(
            id=held_id,
            token=token,
            rule=rule,
            relayed=relayed,
            data=message.raw,
            sent_key=message.id_key,
            at=at,
            timeout=timer.delay,
            then=then,
        )
        self._paused_tokens[token] = held_id
        if copies is not None:
            self._held_copies[token] = copies
        return held_id

    def _settle(
        self, held: HeldMessage, outcome: HeldOutcome, at: float, *, edit: Message | None = None
    ) -> list[Command]:
        """The control API ends the hold of ``held`` (``release``, ``drop``, ``edit``), before
        its timer fired: the message goes on now (as ``edit``, when given) and the shell forgets
        that timer, or it is dropped. In a stalled direction it goes on when the stall ends."""
        out = self._end_hold(held, outcome, edit)
        if self._stalled(held.token) is None:
            out.extend(self._release_early(held.token, at))
        return out

    def _timed_out(self, held: HeldMessage, at: float) -> list[Command]:
        """The timer of ``held`` fired: its ``then`` says whether it goes on now or is dropped.
        In a stalled direction it goes on when the stall ends."""
        outcome: HeldOutcome = "timeout_drop" if held.then == "drop" else "timeout_release"
        out = self._end_hold(held, outcome)
        if self._stalled(held.token) is None:
            out.extend(self._release(held.token, at))
        return out

    def _end_hold(
        self, held: HeldMessage, outcome: HeldOutcome, edit: Message | None = None
    ) -> list[Command]:
        """``held`` is held by its rule no more (observed): dropped (its timer then sends
        nothing; a request is pending no more), or to go on (as ``edit``, when given) once its
        timer is released, with what is left to do then (:class:`_Release`)."""
        token = held.token
        del self._paused[held.id]
        del self._paused_tokens[token]
        assert self._engine is not None
        self._engine.held.count -= 1
        copies = self._held_copies.pop(token, None)
        if copies is not None and edit is not None:
            copies = replace(copies, rewrite=None)  # the edit is what goes, corruption and all
        if edit is None:
            out: list[Command] = [self._hold_ended(held, outcome)]
        else:
            out = [self._hold_ended(held, outcome, edited_digest=digest(edit.raw))]
        if outcome in ("drop", "timeout_drop"):
            stall = self._stalled(token)
            if stall is not None:
                del stall.holds[token]
            timed = self._timers[token]
            kept = [command for command in timed.commands if type(command) is not Send]
            self._timers[token] = replace(timed, commands=kept)
            request = held.relayed
            if request.kind is Kind.REQUEST and request.forwarded_id is not None:
                self._maps[request.direction].pop(request.forwarded_id)  # never answered now
            out.append(self._dropped(held))
            return out
        leaving = held.relayed.message if edit is None else edit
        later: Message | None = None
        if leaving is not None and leaving.kind is Kind.NOTIFICATION and _cancels(leaving):
            later = leaving  # translated when it leaves (rule 3: an answered request's cancel)
        elif edit is not None:
            out.extend(self._replace_held(held, edit))
        if later is not None or copies is not None:
            self._releasing[token] = _Release(held, later, copies)
        return out

    def _stalled(self, token: int) -> _Stall | None:
        """The stall that holds the message of timer ``token``, if any."""
        return next((stall for stall in self._stalls.values() if token in stall.holds), None)

    def _replace_held(self, held: HeldMessage, message: Message) -> list[Command]:
        """What timer ``held.token`` sends becomes ``message``, its ids rewritten as the held
        message's were (a cancel's ``requestId`` translated again: it may be dropped now); what
        it observes then too, a request's session and key with the pending request's (what
        its answer is judged by)."""
        original, token = held.relayed, held.token
        direction = original.direction
        timed = self._timers[token]
        seen: list[Command] = []
        if message.kind is Kind.NOTIFICATION:
            forwards = self._notification(direction, message, seen)
            seen = [command for command in seen if not isinstance(command, Relayed)]
        else:
            request = original.kind is Kind.REQUEST
            new_id = original.forwarded_id if request else original.original_id
            assert new_id is not None
            edits = [(span, new_id) for span in message.id_spans]
            edits.extend(self._tied(direction, message))
            forwards = [splice(message.raw, edits)]
        sends = [command for command in timed.commands if type(command) is Send]
        first = sends[0]
        commands: list[Command] = [
            Send(first.to, data, first.pieces, first.gap) for data in forwards
        ]
        commands.extend(command for command in timed.commands if type(command) is not Send)
        session = original.session
        if message.kind is Kind.REQUEST or message.kind is Kind.NOTIFICATION:
            session = message.session  # an answer's is its request's
        if message.kind is Kind.REQUEST and original.forwarded_id is not None:
            pending = self._maps[direction].get(original.forwarded_id)
            if pending is not None:
                pending.session = session
                pending.keyed = has_idempotency_key(message.params)
        relayed = timed.relayed
        if relayed is not None:
            relayed = replace(
                relayed, kind=message.kind, size=len(message.raw), message=message, session=session
            )
        self._timers[token] = replace(timed, commands=commands, relayed=relayed)
        return seen

    def _made_copies(
        self, released: _Release, sent: _Timed, forwards: list[bytes], at: float
    ) -> list[Command]:
        """The copies a ``duplicate`` rule asked for of a held message that has just left as
        ``sent`` holds it (``forwards``: the bytes it left as): sent now, after whatever its
        timer carried out, or held ``gap`` apart from now. A request's copies are requests of its
        duplicate group, each pending (none when it is pending no more: its peer is gone)."""
        spec = released.copies
        relayed = sent.relayed
        assert spec is not None
        assert relayed is not None
        message = relayed.message
        if message is None:
            return []
        direction = relayed.direction
        primary: Pending | None = None
        if message.kind is Kind.REQUEST:
            assert relayed.forwarded_id is not None
            primary = self._maps[direction].get(relayed.forwarded_id)
            if primary is None:
                return []
        extra = self._copies(
            direction, message, relayed, forwards, count=spec.count, at=at, primary=primary
        )
        rewrite = spec.rewrite
        if rewrite is not None and message.kind is Kind.REQUEST:  # the others' are as it left
            extra = [(rewrite.transform(copy), seen) for copy, seen in extra]
            if rewrite.unreadable:
                self._unanswerable(direction, message, len(extra))
        destination = direction.destination
        out: list[Command] = []
        for index, (copy, seen) in enumerate(extra, start=1):
            wait = index * spec.gap
            if wait > 0:
                timer = self._hold(wait, [Send(destination, copy)], seen, at)
                if seen is not None:
                    out.append(
                        Held(hold=timer.token, rules=spec.spaced_by, delay=wait, relayed=seen)
                    )
                out.append(timer)
            elif destination in self._closing:  # cut by what its timer carried out
                out.append(_undeliverable(Send(destination, copy), seen, None))
            else:
                if seen is not None:
                    out.append(seen)
                out.append(Send(destination, copy))
        return out

    def _hold_ended(
        self, held: HeldMessage, outcome: HeldOutcome, *, edited_digest: str | None = None
    ) -> HeldEnded:
        """The observation that the hold of ``held`` ended as ``outcome`` says (an edit's names
        the message as it came and as edited by their digests)."""
        return HeldEnded(
            held_id=held.id,
            hold=held.token,
            outcome=outcome,
            rule=held.rule,
            relayed=held.relayed,
            digest=None if edited_digest is None else digest(held.data),
            edited_digest=edited_digest,
        )

    def _dropped(self, held: HeldMessage) -> Stopped:
        """The held message ``held`` was dropped: its rule stopped it."""
        relayed = held.relayed
        return Stopped(
            direction=relayed.direction,
            kind=relayed.kind,
            method=relayed.method,
            session=relayed.session,
            size=relayed.size,
            original_id=relayed.original_id,
            forwarded_id=relayed.forwarded_id,
            rule=held.rule,
            disposition="dropped",
            message=relayed.message,
        )

    def _overtaken(self, direction: Direction, out: list[Command], at: float) -> None:
        """Each message just sent in ``direction`` has overtaken the ones a ``reorder`` holds
        there: those overtaken often enough leave now, right behind it. One a ``hold`` rule
        holds too leaves when its hold ends (released then, it goes at once): the reorder
        forgets it."""
        destination = direction.destination
        passed = sum(1 for c in out if type(c) is Send and c.to is destination)
        waiting = self._reorders[direction]
        kept = []
        for entry in waiting:
            token, left = entry
            if token not in self._timers:
                continue  # released by its timer (max_ms) already
            if token in self._paused_tokens:
                continue  # a hold rule's: it leaves when its hold ends (the count is moot)
            if not passed or left > passed:
                entry[1] = left - passed
                kept.append(entry)
            else:
                out.extend(self._release_early(token, at))
        if kept:
            self._reorders[direction] = kept
        else:
            del self._reorders[direction]

    def _fired(self, token: int, at: float) -> list[Command]:
        """Timer ``token`` fired at ``at``: an ``initialize`` is overdue, a stall ends, a ``hold``
        rule's hold times out (its own timer, and nothing else, does that), or what the timer
        holds is carried out (:meth:`_release`)."""
        if token in self._deadlines:
            return self._initialize_overdue(self._deadlines.pop(token))
        if token in self._stall_ends:
            return self._end_stall(self._stall_ends.pop(token), at)
        held_id = self._paused_tokens.get(token)
        if held_id is not None:
            return self._timed_out(self._paused[held_id], at)
        return self._release(token, at)

    def _release_early(self, token: int, at: float, *, lose: bool = False) -> list[Command]:
        """:meth:`_release` of a timer before it fires: the shell is told to forget that timer
        (it holds nothing any more)."""
        return [*self._release(token, at, lose=lose), ForgetTimer(token)]

    def _release(self, token: int, at: float, *, lose: bool = False) -> list[Command]:
        """Carry out what timer ``token`` holds, at ``at`` (it fired, or goes early). A held
        message leaves now (relayed, its answer's duration counting the wait), or is
        undeliverable (its peer is closing, or ``lose``: a timeout's end, whichever side it
        cut); one a stall holds waits for the stall's end. What is left to do for a message
        whose ``hold`` rule let it go (:class:`_Release`) is done as it leaves. A held signal
        to an Agent the proxy is already closing (the Client left) is void: the Agent is being
        stopped, and the run must end the same way whether it exits or the timer fires first.

        A message a ``hold`` rule still holds never gets here: its hold ends first
        (:meth:`_settle`, :meth:`_timed_out`); a stall's end and a reorder skip it."""
        if self._stalls and any(token in stall.holds for stall in self._stalls.values()):
            return []  # its stall lets it go, with the others, in order (its timer may come first)
        timed = self._timers.get(token)
        if timed is None:
            return []
        out: list[Command] = []
        released = self._releasing.pop(token, None)
        if released is not None and released.message is not None and not lose:
            out.extend(self._replace_held(released.held, released.message))
            timed = self._timers[token]
        del self._timers[token]
        relayed = timed.relayed
        if relayed is not None:
            duration = relayed.duration
            if duration is not None:
                duration += at - timed.at
            relayed = replace(relayed, hold=token, duration=duration)
        sent = lost = False
        forwards: list[bytes] = []
        for command in timed.commands:
            if isinstance(command, Sever | Close):
                if isinstance(command, Close) and command.side in self._closing:
                    continue  # closed meanwhile (a slow close overtaken by a sever)
                self._closing.add(command.side)
            if isinstance(command, SignalAgent) and Side.AGENT in self._closing:
                continue
            if not isinstance(command, Send):
                out.append(command)
            elif lose or command.to in self._closing:
                if not lost:
                    lost = True
                    out.append(_undeliverable(command, relayed, token))
            else:
                if not sent and relayed is not None:
                    out.append(relayed)
                sent = True
                out.append(command)
                forwards.append(command.data)
        if released is not None and released.copies is not None and sent:
            out.extend(self._made_copies(released, timed, forwards, at))
        return out

    def _initialize_overdue(self, forwarded_id: bytes) -> list[Command]:
        """The Agent did not answer ``initialize`` in time: the Client gets an error instead."""
        pending = self._maps[Direction.TO_AGENT].pop(forwarded_id)
        if pending is None:
            return []  # answered in time, or the Agent is gone
        if pending.group is not None:
            pending.group.answered = True  # an injected copy's late answer is swallowed
        timeout = self._initialize_timeout
        assert timeout is not None
        out: list[Command] = [
            InitializeTimedOut(id=pending.original_id, forwarded_id=forwarded_id, timeout=timeout)
        ]
        if Side.CLIENT not in self._closing:
            text = f"the agent did not answer initialize within {timeout:g} s"
            error = error_response(pending.original_id, ErrorCode.INTERNAL_ERROR, text)
            out.append(Send(Side.CLIENT, error))
        return out

    def _translate(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> list[bytes]:
        """The bytes to forward for ``message`` (ids rewritten); empty to drop it."""
        if message.kind is Kind.REQUEST:
            if message.method == acp.INITIALIZE and self._cached_initialize is not None:
                self._answer_initialize(direction, message, out)
                return []
            return [self._request(direction, message, at, out)]
        if message.kind is Kind.NOTIFICATION:
            return self._notification(direction, message, out)
        return self._response(direction, message, at, out)

    def _answer_initialize(
        self, direction: Direction, message: Message, out: list[Command]
    ) -> None:
        """Conductor mode: a new Client's initialize is answered with the Agent's first answer."""
        assert self._cached_initialize is not None
        assert message.id_token is not None
        cached = parse(self._cached_initialize)
        assert isinstance(cached, Message)
        answer = splice(cached.raw, [(span, message.id_token) for span in cached.id_spans])
        out.append(Send(direction.source, answer))
        out.append(InitializeCached(message.id_token))

    def _request(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> bytes:
        assert message.method is not None
        assert message.id_token is not None
        assert message.id_key is not None
        requests = self._maps[direction]
        if requests.pending_with(message.id_key):
            out.append(IdReused(direction, message.id_token, message.method))
        keyed = has_idempotency_key(message.params)
        pending = requests.add(
            message.id_token, message.id_key, message.method, message.session, at, keyed=keyed
        )
        if (
            message.method == acp.INITIALIZE
            and direction is Direction.TO_AGENT
            and self._initialize_timeout is not None
        ):
            deadline = next(self._tokens)
            self._deadlines[deadline] = pending.forwarded_id
            out.append(StartTimer(self._initialize_timeout, deadline, fault=False))
        edits = [(span, pending.forwarded_id) for span in message.id_spans]
        edits.extend(self._tied(direction, message))
        if self._meta_for is not None:
            fields = self._meta_for(direction, message)
            if fields:
                edits.extend(meta_edits(message.raw, fields))
        out.append(
            Relayed(
                direction=direction,
                kind=Kind.REQUEST,
                method=message.method,
                session=pending.session,
                size=len(message.raw),
                original_id=message.id_token,
                forwarded_id=pending.forwarded_id,
                message=message,
            )
        )
        return splice(message.raw, edits)

    def _tied(self, direction: Direction, message: Message) -> list[tuple[Span, bytes]]:
        """An Agent's ``elicitation/create`` names the Client's request it is tied to by the id
        the Agent knows: that id's place, and the Client's id to put there."""
        if message.method != acp.ELICITATION_CREATE or direction is not Direction.TO_CLIENT:
            return []
        found = token_at(message.raw, _REQUEST_ID_PATH)
        if found is None:
            return []
        span, token = found
        tied = self._maps[Direction.TO_AGENT].get(token)
        return [] if tied is None else [(span, tied.original_id)]

    def _notification(
        self, direction: Direction, message: Message, out: list[Command]
    ) -> list[bytes]:
        forwards = [message.raw]
        if _cancels(message):
            forwards = self._cancel(direction, message, out)
            if not forwards:
                return forwards
        out.append(relayed_notification(direction, message))
        return forwards

    def _cancel(self, direction: Direction, message: Message, out: list[Command]) -> list[bytes]:
        """Translate a cancel of the sender's own request to the next hop's id, or drop it.

        When the proxy holds several requests under that id (injected copies, or a reused id),
        each of them is cancelled on the next hop.
        """
        found = token_at(message.raw, _REQUEST_ID_PATH)
        if found is not None:
            span, token = found
            params = message.params
            key = id_key(token, params.get("requestId") if isinstance(params, dict) else None)
            if key is not None:
                pending = self._maps[direction].pending_with(key)
                if pending:
                    return [splice(message.raw, [(span, p.forwarded_id)]) for p in pending]
        out.append(CancelDropped(direction, None if found is None else found[1]))
        return []

    def _response(
        self, direction: Direction, message: Message, at: float, out: list[Command]
    ) -> list[bytes]:
        assert message.id_token is not None
        if message.kind is Kind.ERROR and message.id_key == ("null", None):
            out.append(Unroutable(direction, len(message.raw)))
            return [message.raw]
        pending = self._answered(direction, message.id_token)
        if pending is None:
            out.append(Orphaned(direction, message.id_token, message.kind))
            return []
        if pending.method == acp.INITIALIZE and message.kind is Kind.RESPONSE:
            self.initialize_answer = self.initialize_answer or message.raw
        if pending.group is not None:
            if pending.group.answered:
                out.append(
                    DuplicateSwallowed(
                        direction=direction,
                        method=pending.method,
                        session=pending.session,
                        original_id=pending.original_id,
                        forwarded_id=message.id_token,
                        data=message.raw,
                    )
                )
                return []
            pending.group.answered = True
        out.append(
            Relayed(
                direction=direction,
                kind=message.kind,
                method=pending.method,
                session=pending.session,
                size=len(message.raw),
                original_id=pending.original_id,
                forwarded_id=message.id_token,
                duration=at - pending.at,
                message=message,
            )
        )
        return [splice(message.raw, [(span, pending.original_id) for span in message.id_spans])]

    def _answered(self, direction: Direction, forwarded_id: bytes) -> Pending | None:
        """The request an answer travelling ``direction`` names, now answered (forgotten)."""
        pending = self._maps[direction.reverse].pop(forwarded_id)
        if pending is None:
            pending = self._invalid.answered(direction, forwarded_id)
        return pending

    # -- connections ----------------------------------------------------------------------------

    def _peer_closed(self, side: Side) -> list[Command]:
        """The stream from ``side`` ended: pass the end on to the other peer (a half-close).

        Requests sent to ``side`` can never be answered now; nothing answers them falsely.
        What the other peer still sends toward ``side`` is delivered while that connection is
        open (a Client that closed stdin may still read the Agent's last answers).
        """
        if side in self._ended:
            return []
        self._ended.add(side)
        abandoned = self._maps[side.other.outbound].clear()
        self._invalid.forget(side.other.outbound)
        out: list[Command] = [PeerGone(side, len(abandoned))]
        if side is Side.CLIENT and self._keep_upstream:
            self._closing.add(Side.CLIENT)  # the Agent stays for the next Client
        elif side.other not in self._closing:
            late = self._slow_closes.get(side.other)
            if late is None:
                self._closing.add(side.other)
                out.append(Close(side.other))
            else:  # held: what goes there meanwhile still goes (see _release)
                out.append(self._hold(late, [Close(side.other)]))
        return out


def _lasting(effects: Sequence[Effect]) -> int:
    """How many faults in progress ``effects`` start (a message held, copies spaced, a command
    delayed: each a timer), as :class:`~proxy.core.engine.ActiveFaults` counts them."""
    count = 0
    for effect in effects:
        match effect:
            case Hold(seconds=seconds) if seconds > 0:
                count += 1
            case Breakpoint():
                count += 1
            case Copies(count=copies, gap=gap) if gap > 0:
                count += copies
            case After(delay=delay) if delay > 0:
                count += 1
            case Freeze():
                count += 2  # the stall, and the message it holds first
            case _:
                pass
    return count


def _cancels(message: Message) -> bool:
    """Whether the notification ``message`` is a cancel (``$/cancel_request``, or one inside a
    successor envelope): it names one of its sender's requests by id, which is translated to the
    next hop's when it is forwarded (rule 3)."""
    method = message.method
    if method == acp.CANCEL_REQUEST:
        return True
    if method in acp.SUCCESSORS:
        params = message.params
        return isinstance(params, dict) and params.get("method") == acp.CANCEL_REQUEST
    return False


def _ends(command: Command, side: Side) -> bool:
    """Whether ``command`` ends the connection toward ``side`` (nothing sent after it arrives)."""
    return (type(command) is SendCut and command.to is side) or (
        type(command) is Sever and command.side is side
    )


def _undeliverable(send: Send, relayed: Relayed | None, hold: int | None) -> Undeliverable:
    """A held message whose peer left before its timer fired; named when it was observed held."""
    direction = Direction.TO_AGENT if send.to is Side.AGENT else Direction.TO_CLIENT
    if relayed is None:
        return Undeliverable(direction=direction, kind=parse(send.data).kind, size=len(send.data))
    return Undeliverable(
        direction=direction,
        kind=relayed.kind,
        size=relayed.size,
        method=relayed.method,
        session=relayed.session,
        original_id=relayed.original_id,
        forwarded_id=relayed.forwarded_id,
        hold=hold,
    )
