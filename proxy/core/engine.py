"""The fault engine: which rules fire for a message. Pure: randomness and time are passed in.

:meth:`FaultEngine.decide` gets a :class:`Subject` (what the relay knows about one message) and
the time since the proxy started, and returns the rules that fire, in file order: the first rule
whose ``when`` and ``schedule`` both pass acts, and later rules act too only while each rule that
acted says ``continue: true``. Counters (for ``nth``, ``after``, ``every``, ``times``) are per
rule, across links and restarts: ``matched`` counts every message the rule's own ``when``
matches, whether or not an earlier rule acted on it (so two rules ``nth: [1]`` and ``nth: [2]``
on the same messages act on the first and the second), and ``fired`` the times the rule acted.
The random stream is one ``random.Random`` seeded from the fault file or ``--seed``; a
``probability`` is drawn only for a rule that could still act and whose schedule is otherwise
due, so the same seed and the same traffic give the same faults. A rule with ``enabled: false``
matches nothing (its counters stay where they were) until it is enabled again. Carrying the
actions out is the relay's job (:mod:`proxy.core.relay`).
"""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.core.actions import actions
from proxy.core.actions.base import Subject
from proxy.core.events import Direction
from proxy.core.faultfile import Bursts, Note, Rule, Schedule, When, rule_notes
from proxy.core.held import HeldBound, HeldIds
from proxy.core.jsonrpc import Kind, has_idempotency_key, session_of
from proxy.core.search import BACKSLASH, contains
from proxy.core.values import value

__all__ = ["ActiveFaults", "Decision", "FaultEngine", "RuleState", "matches_params"]


@value
class Decision:
    """The outcome of matching one message: the rules that fire, and whether any counter moved."""

    fired: tuple[Rule, ...]
    counted: bool


NOTHING: Final = Decision((), counted=False)


class ActiveFaults:
    """The faults in progress across every link of a proxy (each a timer running: a message
    held, a copy spaced, a command delayed), and the cap on them (``--max-active-faults``,
    Envoy's ``max_active_faults``; ``None``: none). The shell counts the timers as they start
    and end; the relay asks :meth:`room` before a rule's fault would start more."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.count = 0

    def room(self) -> int:
        """How many more may start now."""
        if self.limit is None:
            return 1 << 62
        return max(self.limit - self.count, 0)


@dataclass(slots=True)
class RuleState:
    """A rule's counters: messages its ``when`` matched (whether or not an earlier rule acted on
    them), and times it fired (acted); the state of its bursts (``schedule.bursts``), and what
    its action keeps from one firing to the next (``memory``: a correlated delay's last draw)."""

    matched: int = 0
    fired: int = 0
    bad: bool = False
    memory: dict[str, Any] = field(default_factory=dict)


def params_matcher(pattern: Any) -> Callable[[Any], bool]:
    """A test of ``params`` against ``pattern``, built once per rule: a subset match (an
    object's keys must exist and match; each item of a pattern list must match an item of the
    list); scalars equal, a boolean only to itself."""
    if isinstance(pattern, dict):
        members = tuple((key, params_matcher(sub)) for key, sub in pattern.items())

        def match_object(value: Any) -> bool:
            if not isinstance(value, dict):
                return False
            for key, match in members:  # noqa: SIM110 (a loop: no generator per message)
                if key not in value or not match(value[key]):
                    return False
            return True

        return match_object
    if isinstance(pattern, list):
        items = tuple(params_matcher(sub) for sub in pattern)

        def match_list(value: Any) -> bool:
            return isinstance(value, list) and all(
                any(match(item) for item in value) for match in items
            )

        return match_list
    if isinstance(pattern, bool):
        return lambda value: value is pattern
    return lambda value: not isinstance(value, bool) and bool(pattern == value)


def matches_params(pattern: Any, value: Any) -> bool:
    """Whether ``value`` matches ``pattern`` (:func:`params_matcher`)."""
    return params_matcher(pattern)(value)


@value
class _Compiled:
    rule: Rule
    method: re.Pattern[str] | None
    session: re.Pattern[str] | None
    nth: frozenset[int] = field(default_factory=frozenset)
    params: Callable[[Any], bool] | None = None
    keyed: bool | None = None
    """``when.idempotency_key``: ``True`` present, ``False`` absent, ``None`` any."""
    needles: tuple[bytes, ...] = ()
    """Bytes every message the rule's session, key and params match holds, as JSON writes them
    without escapes (:func:`_needles`); none: no such bytes are known."""


def _glob(pattern: str) -> re.Pattern[str] | None:
    return None if pattern == "*" else re.compile(fnmatch.translate(pattern))


_WILDCARDS: Final = re.compile(r"[*?]")
ESCAPES: Final = (b"\\u", b"\\/")
"""How JSON may write a character of a string other than as itself (``\\u00e9``, ``\\/``);
where neither occurs, a string of plain characters can only be written one way."""


def _plain(text: str) -> bytes | None:
    """``text`` as JSON writes it inside a string, when that is ``text`` itself."""
    encoded = orjson.dumps(text)[1:-1]
    return encoded if encoded == text.encode() else None


def _needles(rule: Rule) -> tuple[bytes, ...]:
    """Bytes that every message matching ``rule``'s session, key and params holds (written
    without escapes): the literal runs of its session glob (with the string's quote where the
    glob is anchored), ``"idempotencyKey"`` when a key must be present, and each string, key
    and literal of its params pattern. A batch of messages that lacks one cannot match."""
    found: list[bytes] = []
    when = rule.when
    if when.session != "*":
        head, bracket, _ = when.session.partition("[")  # from a [...] class on: nothing known
        parts = _WILDCARDS.split(head)
        for index, part in enumerate(parts):
            plain = _plain(part)
            if plain is None:
                continue
            if index == 0:
                plain = b'"' + plain
            if index == len(parts) - 1 and not bracket:
                plain += b'"'
            if plain.strip(b'"'):
                found.append(plain)
    if _KEYED[when.idempotency_key]:
        found.append(b'"idempotencyKey"')
    if when.params is not None:
        _pattern_needles(when.params, found)
    return tuple(sorted(dict.fromkeys(found), key=len, reverse=True))  # longest: searched fastest


def _pattern_needles(pattern: Any, found: list[bytes]) -> None:
    """The bytes a value matching ``pattern`` (:func:`params_matcher`) holds: its strings quoted,
    its keys, ``true``, ``false`` and ``null``; numbers have more than one spelling."""
    if isinstance(pattern, dict):
        for key, sub in pattern.items():
            plain = _plain(key)
            if plain is not None:
                found.append(b'"' + plain + b'"')
            _pattern_needles(sub, found)
    elif isinstance(pattern, list):
        for sub in pattern:
            _pattern_needles(sub, found)
    elif isinstance(pattern, str):
        plain = _plain(pattern)
        if plain is not None:
            found.append(b'"' + plain + b'"')
    elif isinstance(pattern, bool) or pattern is None:
        found.append(orjson.dumps(pattern))


_CANDIDATES_KEPT: Final = 4096
"""Distinct (direction, kind, downstream, method) combinations whose candidates are kept; a
peer that invents methods endlessly only makes the engine forget and start over."""


def _shape_matches(compiled: _Compiled, subject: Subject) -> bool:
    """The part of ``when`` that depends only on the message's direction, kind, downstream
    transport and method (the same for every message of that shape)."""
    rule = compiled.rule
    if not rule.enabled:
        return False  # kept, but matching nothing until enabled again
    when: When = rule.when
    if when.direction not in ("any", subject.direction):
        return False
    if when.kind not in ("any", subject.kind):
        return False
    if not actions[rule.do.action].applies(rule.do, subject):
        return False  # an action that cannot act on such a message (an error on an answer)
    return compiled.method is None or (
        subject.method is not None and compiled.method.match(subject.method) is not None
    )


def _details_match(compiled: _Compiled, subject: Subject) -> bool:
    """The rest of ``when``: session, idempotency key and params, checked per message."""
    return _details_fit(compiled, subject.session, subject.keyed, subject.params)


def _details_fit(compiled: _Compiled, session: str | None, keyed: bool, params: Any) -> bool:
    """:func:`_details_match` of a message's session, whether it is keyed, and its params."""
    pattern = compiled.session
    if pattern is not None and (session is None or pattern.match(session) is None):
        return False
    wanted = compiled.keyed
    if wanted is not None and wanted is not keyed:
        return False
    matcher = compiled.params
    return matcher is None or matcher(params)


_KEYED: Final[dict[str, bool | None]] = {"present": True, "absent": False, "any": None}
"""``when.idempotency_key`` as :attr:`_Compiled.keyed`."""


class FaultEngine:
    """Rules, their counters and the random stream of one experiment.

    ``listener`` is how Clients connect (``stdio``, ``http`` or ``ws``); ``on_note`` hears, once
    whenever a rule is loaded (or changed), each of its :class:`~proxy.core.faultfile.Note`: an old
    field name, or an action that needs Clients on Streamable HTTP, unless they connect so.
    """

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        rng: random.Random | None = None,
        *,
        listener: str = "stdio",
        on_note: Callable[[Note], None] | None = None,
        client_faults: bool = False,
        max_active_faults: int | None = None,
        max_held: int | None = None,
    ) -> None:
        self.rng = rng or random.Random(0)
        self.listener = listener
        self.client_faults = client_faults
        """Whether a Client's request may ask for its own fault (``_meta.acpFault``:
        ``--allow-client-faults``)."""
        self.active = ActiveFaults(max_active_faults)
        """The faults in progress across the links, and their cap."""
        self.held_ids = HeldIds()
        """The ids of the messages ``hold`` rules hold, proxy-wide (kept, as the engine is,
        across restarts of the data plane)."""
        self.held = HeldBound(max_held)
        """How many messages ``hold`` rules hold now, across the links, and the cap on them
        (``--max-held``)."""
        self._on_note = on_note
        self.states: dict[str, RuleState] = {}
        self._rules: tuple[_Compiled, ...] = ()
        self._candidates: dict[tuple[Direction, Kind, str, str | None], tuple[_Compiled, ...]] = {}
        """Per message shape, the rules whose direction, kind, action and method let them match
        it, in file order; only their session, key and params are left to check per message."""
        self.replace(rules)

    @property
    def rules(self) -> list[Rule]:
        """The rules in evaluation order."""
        return [compiled.rule for compiled in self._rules]

    def replace(self, rules: Iterable[Rule]) -> None:
        """Swap the rule set at once; counters of rules kept by name survive. The notes of the
        rules that are new (or changed) go to ``on_note``."""
        rules = list(rules)
        if self._on_note is not None:
            before = {c.rule.name: c.rule for c in self._rules}
            fresh = [rule for rule in rules if before.get(rule.name) != rule]
            for note in rule_notes(fresh):
                if not (note.needs_http and self.listener == "http"):
                    self._on_note(note)
        compiled = tuple(
            _Compiled(
                rule,
                _glob(rule.when.method),
                _glob(rule.when.session),
                frozenset(rule.schedule.nth or ()),
                None if rule.when.params is None else params_matcher(rule.when.params),
                _KEYED[rule.when.idempotency_key],
                _needles(rule),
            )
            for rule in rules
        )
        self.states = {c.rule.name: self.states.get(c.rule.name, RuleState()) for c in compiled}
        self._rules = compiled
        self._candidates = {}

    def reset(self) -> None:
        """Forget every counter (the rules stay)."""
        self.states = {c.rule.name: RuleState() for c in self._rules}

    def unmatched(
        self,
        direction: Direction,
        kind: Kind,
        downstream: str,
        method: str | None,
        body: dict[str, Any],
    ) -> bool:
        """Whether no rule matches a message of this shape whose JSON is ``body``: none can match
        its shape, or none of those that can matches its session, key and params. Unknown until
        :meth:`decide` has seen a message of the shape: ``False``. A message no rule matches
        moves no counter and draws nothing, so the relay may pass it on without :meth:`decide`."""
        params = body.get("params")
        return self.unmatched_as(
            direction,
            kind,
            downstream,
            method,
            session=session_of(body),
            keyed=has_idempotency_key(params),
            params=params,
        )

    def unmatched_as(
        self,
        direction: Direction,
        kind: Kind,
        downstream: str,
        method: str | None,
        *,
        session: str | None,
        keyed: bool,
        params: Any,
    ) -> bool:
        """:meth:`unmatched`, from what rules match on (the fields of a
        :class:`~proxy.core.actions.base.Subject`, without building one): an answer is matched
        as its request, by the request's method, session and key."""
        candidates = self._candidates.get((direction, kind, downstream, method))
        if candidates is None:
            return False
        if not candidates:
            return True
        for compiled in candidates:  # noqa: SIM110 (a loop: no generator per message)
            if _details_fit(compiled, session, keyed, params):
                return False
        return True

    def unmatched_in(
        self, direction: Direction, kind: Kind, downstream: str, method: str, data: bytes
    ) -> bool | None:
        """Whether no rule matches any message of this shape in ``data`` (messages read
        together), judged from their bytes alone: ``True`` when every rule that can match the
        shape needs bytes (:attr:`_Compiled.needles`) that ``data`` lacks; ``False`` when some
        rule may match (ask :meth:`unmatched` message by message); ``None`` while the shape is
        unknown (until :meth:`decide` has seen a message of it)."""
        candidates = self._candidates.get((direction, kind, downstream, method))
        if candidates is None:
            return None
        if not candidates:
            return True
        if BACKSLASH in data and (contains(data, ESCAPES[0]) or contains(data, ESCAPES[1])):
            return False
        for compiled in candidates:
            needles = compiled.needles
            if not needles or all(contains(data, needle) for needle in needles):
                return False
        return True

    def did_not_act(self, rule: Rule) -> None:
        """``rule`` fired but did nothing: its fault was refused (:class:`ActiveFaults` had no
        room), or it had nothing to do (a ``bandwidth`` with bytes to spare). It does not count
        as fired (a ``times`` budget is not spent on a fault that never was)."""
        state = self.states.get(rule.name)
        if state is not None and state.fired:
            state.fired -= 1

    def decide(self, subject: Subject, elapsed_ms: float, *, acting: bool = True) -> Decision:
        """The rules that fire for ``subject``, in order; counts every rule that matched.

        Once a rule acts without ``continue: true``, the rules after it still count the message
        as a match of theirs but neither act nor draw from the random stream; ``acting`` false:
        that is so from the first rule (a fault the Client asked for acted already)."""
        shape = (subject.direction, subject.kind, subject.downstream, subject.method)
        candidates = self._candidates.get(shape)
        if candidates is None:
            candidates = tuple(c for c in self._rules if _shape_matches(c, subject))
            if len(self._candidates) >= _CANDIDATES_KEPT:
                self._candidates.clear()
            self._candidates[shape] = candidates
        fired: list[Rule] = []
        counted = False
        open_to_more = acting  # no rule has acted yet, or each that acted said continue: true
        for compiled in candidates:
            rule = compiled.rule
            if not _details_match(compiled, subject):
                continue
            counted = True
            state = self.states[rule.name]
            state.matched += 1
            if not open_to_more or not self._due(compiled, rule.schedule, state, elapsed_ms):
                continue
            state.fired += 1
            fired.append(rule)
            open_to_more = rule.continue_
        return Decision(tuple(fired), counted) if counted else NOTHING

    def _due(
        self, compiled: _Compiled, schedule: Schedule, state: RuleState, elapsed_ms: float
    ) -> bool:
        n, fired = state.matched, state.fired
        if schedule.start_ms is not None and elapsed_ms < schedule.start_ms:
            return False
        if schedule.stop_ms is not None and elapsed_ms >= schedule.stop_ms:
            return False
        if compiled.nth and n not in compiled.nth:
            return False
        if n <= schedule.after:
            return False
        if schedule.every is not None and (n - schedule.after) % schedule.every:
            return False
        if schedule.times is not None and fired >= schedule.times:
            return False
        if schedule.bursts is not None and not self._in_burst(schedule.bursts, state):
            return False
        return schedule.probability >= 1.0 or self.rng.random() < schedule.probability

    def _in_burst(self, bursts: Bursts, state: RuleState) -> bool:
        """One step of the Gilbert-Elliott model, as netem takes it: the state moves on, and the
        match fires with the chance of the state it was in."""
        rng = self.rng
        if state.bad:
            state.bad = rng.random() >= bursts.r
            return rng.random() < bursts.one_minus_h
        state.bad = rng.random() < bursts.p
        return rng.random() < bursts.one_minus_k

    # -- persistence (--state) -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Counters, the state of each rule's bursts and what its action keeps (a correlated
        delay's last draw), and the random stream's state, as JSON-ready data."""
        version, internal, gauss = self.rng.getstate()
        return {
            "rules": {
                name: [s.matched, s.fired, s.bad, s.memory] for name, s in self.states.items()
            },
            "rng": [version, list(internal), gauss],
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Take the rules' states (of rules that still exist) and the random stream from a
        snapshot (one of an older version, with counters only, too)."""
        for name, saved in snapshot.get("rules", {}).items():
            if name in self.states:
                matched, fired, *rest = saved
                bad = bool(rest[0]) if rest else False
                memory = dict(rest[1]) if len(rest) > 1 and isinstance(rest[1], dict) else {}
                self.states[name] = RuleState(int(matched), int(fired), bad, memory)
        rng = snapshot.get("rng")
        if rng is not None:
            version, internal, gauss = rng
            self.rng.setstate((version, tuple(internal), gauss))
