"""The fault engine without sockets: every matcher, every schedule field, with fixed seeds."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import statistics
from typing import Any

import pytest

from proxy.core.actions.base import Subject
from proxy.core.commands import StartTimer
from proxy.core.engine import FaultEngine, matches_params
from proxy.core.events import Direction, MessageReceived, Side
from proxy.core.faultfile import Note, Rule, dump_rules
from proxy.core.jsonrpc import Kind, Message, parse
from proxy.core.relay import Relay

PROMPT = Subject(
    Direction.TO_AGENT,
    Kind.REQUEST,
    "session/prompt",
    "S1",
    keyed=True,
    params={
        "sessionId": "S1",
        "idempotencyKey": "K",
        "prompt": [{"type": "text", "text": "deploy now"}],
    },
)
ANSWER = Subject(Direction.TO_CLIENT, Kind.RESPONSE, "session/prompt", "S1", keyed=True)
UPDATE = Subject(
    Direction.TO_CLIENT, Kind.NOTIFICATION, "session/update", "S1", keyed=False, params={}
)


def rule(name: str = "r", **fields: Any) -> Rule:
    return Rule.model_validate({"name": name, "do": {"action": "drop"}, **fields})


def fires(engine: FaultEngine, subject: Subject, elapsed_ms: float = 0.0) -> list[str]:
    return [fired.name for fired in engine.decide(subject, elapsed_ms).fired]


def pattern(engine: FaultEngine, subject: Subject, count: int) -> list[bool]:
    return [bool(fires(engine, subject)) for _ in range(count)]


class TestWhen:
    @pytest.mark.parametrize(
        ("when", "subject", "expected"),
        [
            ({}, PROMPT, True),
            ({"direction": "to_agent"}, PROMPT, True),
            ({"direction": "to_client"}, PROMPT, False),
            ({"direction": "any"}, ANSWER, True),
            ({"kind": "request"}, PROMPT, True),
            ({"kind": "response"}, PROMPT, False),
            ({"kind": "response"}, ANSWER, True),
            ({"kind": "notification"}, UPDATE, True),
            ({"method": "session/prompt"}, PROMPT, True),
            ({"method": "session/*"}, UPDATE, True),
            ({"method": "session/prom?t"}, PROMPT, True),
            ({"method": "session/[pq]rompt"}, PROMPT, True),
            ({"method": "session/update"}, PROMPT, False),
            ({"method": "session/prompt"}, ANSWER, True),  # a response carries its request's method
            ({"method": "Session/Prompt"}, PROMPT, False),  # case-sensitive
            ({"session": "S*"}, PROMPT, True),
            ({"session": "S2"}, PROMPT, False),
            ({"idempotency_key": "present"}, PROMPT, True),
            ({"idempotency_key": "absent"}, PROMPT, False),
            ({"idempotency_key": "absent"}, UPDATE, True),
            ({"params": {"sessionId": "S1"}}, PROMPT, True),
            ({"params": {"prompt": [{"text": "deploy now"}]}}, PROMPT, True),
            ({"params": {"prompt": [{"text": "deploy"}]}}, PROMPT, False),
            ({"params": {"missing": None}}, PROMPT, False),
            ({"params": {}}, ANSWER, False),  # a response has no params to match
        ],
    )
    def test_matchers(self, when: dict[str, Any], subject: Subject, expected: bool) -> None:
        """Each `when` field narrows the messages a rule matches."""
        engine = FaultEngine([rule(when=when)])
        assert bool(fires(engine, subject)) is expected

    def test_session_glob_needs_a_session(self) -> None:
        """A session glob other than * does not match a message without a session."""
        engine = FaultEngine([rule(when={"session": "?*"})])
        assert (
            fires(engine, Subject(Direction.TO_AGENT, Kind.REQUEST, "initialize", None, False))
            == []
        )

    def test_error_action_only_answers_requests(self) -> None:
        """An `error` rule never matches a notification or a response."""
        engine = FaultEngine([Rule.model_validate({"name": "e", "do": {"action": "error"}})])
        assert fires(engine, UPDATE) == []
        assert fires(engine, ANSWER) == []
        assert fires(engine, PROMPT) == ["e"]

    def test_http_only_actions_fire_only_on_an_http_listener(self) -> None:
        """http_status fires on a POST from an HTTP client; close_stream on a message to one."""
        status = FaultEngine(
            [Rule.model_validate({"name": "h", "do": {"action": "http_status", "status": 502}})]
        )
        stream = FaultEngine([Rule.model_validate({"name": "c", "do": {"action": "close_stream"}})])
        http_prompt = dataclasses.replace(PROMPT, downstream="http")
        http_update = dataclasses.replace(UPDATE, downstream="http")
        assert fires(status, PROMPT) == []
        assert fires(status, dataclasses.replace(PROMPT, downstream="ws")) == []
        assert fires(status, http_prompt) == ["h"]
        assert fires(status, http_update) == []  # nothing was POSTed
        assert fires(stream, UPDATE) == []
        assert fires(stream, http_update) == ["c"]
        assert fires(stream, http_prompt) == []  # a POST does not travel on a stream


def test_params_subset_matching() -> None:
    """Dicts match by subset, lists by each wanted item, booleans never equal numbers."""
    assert matches_params({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}})
    assert not matches_params({"a": {"b": 1}}, {"a": {"b": 2}})
    assert matches_params({"l": [2, 1]}, {"l": [1, 2, 3]})
    assert not matches_params({"l": [4]}, {"l": [1, 2, 3]})
    assert not matches_params({"l": [1]}, {"l": "1"})
    assert not matches_params({"t": True}, {"t": 1})
    assert matches_params({"t": None}, {"t": None})


class TestSchedule:
    def test_default_fires_on_every_match(self) -> None:
        """Without a schedule every match fires."""
        assert pattern(FaultEngine([rule()]), PROMPT, 3) == [True, True, True]

    def test_nth(self) -> None:
        """nth fires on the listed matches only."""
        engine = FaultEngine([rule(schedule={"nth": [1, 3]})])
        assert pattern(engine, PROMPT, 4) == [True, False, True, False]

    def test_after(self) -> None:
        """after skips the first N matches."""
        engine = FaultEngine([rule(schedule={"after": 2})])
        assert pattern(engine, PROMPT, 4) == [False, False, True, True]

    def test_times(self) -> None:
        """times caps how often the rule fires."""
        engine = FaultEngine([rule(schedule={"times": 2})])
        assert pattern(engine, PROMPT, 4) == [True, True, False, False]

    def test_every(self) -> None:
        """every fires on every Nth match."""
        engine = FaultEngine([rule(schedule={"every": 3})])
        assert pattern(engine, PROMPT, 7) == [False, False, True, False, False, True, False]

    def test_every_counts_after_after(self) -> None:
        """every counts the matches left after `after`."""
        engine = FaultEngine([rule(schedule={"after": 1, "every": 2, "times": 2})])
        assert pattern(engine, PROMPT, 8) == [False, False, True, False, True, False, False, False]

    def test_window(self) -> None:
        """start_ms and stop_ms bound when a rule is active, since the proxy started."""
        engine = FaultEngine([rule(schedule={"start_ms": 100, "stop_ms": 200})])
        assert fires(engine, PROMPT, 99.9) == []
        assert fires(engine, PROMPT, 100.0) == ["r"]
        assert fires(engine, PROMPT, 199.0) == ["r"]
        assert fires(engine, PROMPT, 200.0) == []

    def test_counters_count_matches_only(self) -> None:
        """Messages the rule does not match do not move its counters."""
        engine = FaultEngine([rule(when={"method": "session/prompt"}, schedule={"nth": [2]})])
        assert fires(engine, PROMPT) == []
        assert fires(engine, UPDATE) == []
        assert fires(engine, PROMPT) == ["r"]
        assert (engine.states["r"].matched, engine.states["r"].fired) == (2, 1)

    def test_probability_is_seeded(self) -> None:
        """The same seed gives the same choices; another seed others; the rate is about right."""
        rules = [rule(schedule={"probability": 0.3})]
        first = pattern(FaultEngine(rules, random.Random(42)), PROMPT, 200)
        again = pattern(FaultEngine(rules, random.Random(42)), PROMPT, 200)
        other = pattern(FaultEngine(rules, random.Random(43)), PROMPT, 200)
        assert first == again
        assert first != other
        assert 40 <= sum(first) <= 80

    def test_probability_zero_and_one(self) -> None:
        """Probability 0 never fires; 1 always does and draws nothing."""
        rng = random.Random(1)
        state = rng.getstate()
        assert (
            pattern(FaultEngine([rule(schedule={"probability": 1})], rng), PROMPT, 5) == [True] * 5
        )
        assert rng.getstate() == state
        assert pattern(FaultEngine([rule(schedule={"probability": 0})]), PROMPT, 5) == [False] * 5

    def test_bursts_follow_the_gilbert_elliott_model(self) -> None:
        """netem's gemodel with a fixed seed, over 20,000 matches: with ``1-h`` 1 and ``1-k`` 0
        a rule fires in runs of ``1/r`` matches on average, ``1/p`` apart, ``p/(p+r)`` of the
        time; the same seed gives the same bursts."""
        rules = [rule(schedule={"bursts": {"p": 0.02, "r": 0.25}})]
        fired = pattern(FaultEngine(rules, random.Random(7)), PROMPT, 20_000)
        assert fired == pattern(FaultEngine(rules, random.Random(7)), PROMPT, 20_000)
        bursts, gaps = runs(fired, True), runs(fired, False)
        assert sum(fired) / len(fired) == pytest.approx(0.02 / 0.27, rel=0.1)
        assert statistics.fmean(bursts) == pytest.approx(1 / 0.25, rel=0.1)
        assert statistics.fmean(gaps) == pytest.approx(1 / 0.02, rel=0.1)
        independent = pattern(FaultEngine([rule(schedule={"probability": 0.074})]), PROMPT, 20_000)
        assert statistics.fmean(runs(independent, True)) < 1.2  # loss that is not bursty

    def test_bursts_draw_in_each_state_with_its_own_chance(self) -> None:
        """``1-k`` fires in the good state too, ``1-h`` below 1 spares some of the bad one's: with
        ``p`` 0 the rule stays good and fires at ``1-k``; with ``r`` 0, once bad, at ``1-h``."""
        good = rule(schedule={"bursts": {"p": 0, "r": 1, "1-k": 0.3}})
        assert sum(pattern(FaultEngine([good], random.Random(3)), PROMPT, 5000)) == pytest.approx(
            1500, rel=0.1
        )
        bad = rule(schedule={"bursts": {"p": 1, "r": 0, "1-h": 0.6}})
        fired = pattern(FaultEngine([bad], random.Random(3)), PROMPT, 5000)
        assert not fired[0]  # the first match is in the good state (1-k is 0)
        assert sum(fired[1:]) == pytest.approx(0.6 * 4999, rel=0.1)

    def test_bursts_round_trip_through_a_fault_file(self) -> None:
        """netem's names are the fields' (``1-h``, ``1-k``) and dump back as such."""
        parsed = rule(schedule={"bursts": {"p": 0.1, "r": 0.5, "1-h": 0.9, "1-k": 0.01}})
        dumped = dump_rules([parsed])[0]
        assert dumped["schedule"]["bursts"] == {"p": 0.1, "r": 0.5, "1-h": 0.9, "1-k": 0.01}
        assert Rule.model_validate(dumped) == parsed


def runs(fired: list[bool], value: bool) -> list[int]:
    """The lengths of the runs of ``value`` in ``fired``."""
    return [len(list(group)) for key, group in itertools.groupby(fired) if key is value]


class TestOrder:
    def test_first_matching_rule_acts(self) -> None:
        """Rules are evaluated in file order; the first that fires is the only one that acts,
        and the rules after it still count the message as a match of theirs."""
        engine = FaultEngine([rule("a"), rule("b")])
        assert fires(engine, PROMPT) == ["a"]
        assert (engine.states["b"].matched, engine.states["b"].fired) == (1, 0)

    def test_two_rules_on_one_match_count_it_each(self) -> None:
        """Issue 12.6: rules nth: [1] and nth: [2] with the same when act on the first and the
        second matching message (each counts the matches of its own when), not the third."""
        engine = FaultEngine(
            [rule("first", schedule={"nth": [1]}), rule("second", schedule={"nth": [2]})]
        )
        assert [fires(engine, PROMPT) for _ in range(4)] == [["first"], ["second"], [], []]
        counters = {name: (s.matched, s.fired) for name, s in engine.states.items()}
        assert counters == {"first": (4, 1), "second": (4, 1)}

    def test_a_match_taken_by_an_earlier_rule_still_counts(self) -> None:
        """A later rule's nth names its own matches: the one an earlier rule acted on is gone
        for it (a catch-all placed first hides it, but does not shift its count)."""
        engine = FaultEngine(
            [rule("all", schedule={"times": 2}), rule("third", schedule={"nth": [3]})]
        )
        assert [fires(engine, PROMPT) for _ in range(4)] == [["all"], ["all"], ["third"], []]

    def test_no_draw_for_a_rule_that_cannot_act(self) -> None:
        """A probability is drawn only for a rule that could still act: the same seed gives the
        same faults whatever earlier rules take, and the stream stays where it was."""
        rng = random.Random(3)
        state = rng.getstate()
        engine = FaultEngine([rule("always"), rule("coin", schedule={"probability": 0.5})], rng)
        assert pattern(engine, PROMPT, 10) == [True] * 10
        assert rng.getstate() == state
        assert engine.states["coin"].matched == 10

    def test_continue_lets_later_rules_act(self) -> None:
        """continue: true evaluates the next rules too."""
        engine = FaultEngine([rule("a", **{"continue": True}), rule("b")])
        assert fires(engine, PROMPT) == ["a", "b"]

    def test_a_rule_that_does_not_fire_lets_the_next_one_try(self) -> None:
        """A matching rule whose schedule is not due does not stop the evaluation."""
        engine = FaultEngine([rule("a", schedule={"nth": [2]}), rule("b")])
        assert fires(engine, PROMPT) == ["b"]
        assert fires(engine, PROMPT) == ["a"]

    def test_decision_reports_counted(self) -> None:
        """counted tells whether any rule matched (and its state is due for saving)."""
        engine = FaultEngine([rule(when={"method": "session/prompt"}, schedule={"nth": [2]})])
        assert engine.decide(UPDATE, 0).counted is False
        assert engine.decide(PROMPT, 0).counted is True


class TestReplaceAndState:
    def test_replace_keeps_counters_of_rules_kept_by_name(self) -> None:
        """A reload keeps a kept rule's counters and starts new rules at zero."""
        engine = FaultEngine([rule("a", schedule={"nth": [2]})])
        fires(engine, PROMPT)
        engine.replace([rule("a", schedule={"nth": [2]}), rule("b")])
        assert fires(engine, PROMPT) == ["a"]
        assert (engine.states["a"].matched, engine.states["b"].matched) == (2, 1)
        engine.replace([rule("b")])
        assert set(engine.states) == {"b"}

    def test_replace_applies_to_messages_already_seen(self) -> None:
        """What a message shape matched before a reload does not outlive the reload."""
        engine = FaultEngine([rule("old", when={"method": "session/prompt"})])
        assert fires(engine, PROMPT) == ["old"]
        assert fires(engine, UPDATE) == []
        engine.replace([rule("new", when={"method": "session/update"})])
        assert fires(engine, PROMPT) == []
        assert fires(engine, UPDATE) == ["new"]

    def test_endless_new_methods_keep_the_engine_bounded(self) -> None:
        """A peer inventing methods cannot grow what the engine remembers without bound."""
        engine = FaultEngine([rule("x", when={"method": "x/*"})])
        for n in range(10_000):
            method = f"x/{n}" if n % 2 else f"y/{n}"
            subject = dataclasses.replace(PROMPT, method=method)
            assert fires(engine, subject) == (["x"] if n % 2 else [])
        assert len(engine._candidates) <= 4096

    def test_reset_forgets_counters(self) -> None:
        """reset starts every rule from zero."""
        engine = FaultEngine([rule(schedule={"nth": [1]})])
        fires(engine, PROMPT)
        engine.reset()
        assert fires(engine, PROMPT) == ["r"]

    def test_snapshot_and_restore_continue_the_experiment(self) -> None:
        """Counters and the random stream survive a snapshot, as across proxy restarts."""
        rules = [
            rule("once", schedule={"nth": [1]}, **{"continue": True}),
            rule("coin", schedule={"probability": 0.5}),
        ]
        engine = FaultEngine(rules, random.Random(5))
        fires(engine, PROMPT)
        snapshot = engine.snapshot()
        expected = pattern(engine, PROMPT, 20)
        restored = FaultEngine(rules, random.Random(999))
        restored.restore(snapshot)
        assert pattern(restored, PROMPT, 20) == expected
        assert restored.states["once"].fired == 1

    def test_a_snapshot_keeps_the_burst_state_and_what_an_action_keeps(self) -> None:
        """A rule in a burst of losses stays in it across a restart, a correlated delay keeps
        its last draw; a snapshot of an older version (counters only) still loads."""
        rules = [rule("bursty", schedule={"bursts": {"p": 0.9, "r": 0.1}})]
        engine = FaultEngine(rules, random.Random(5))
        pattern(engine, PROMPT, 10)
        engine.states["bursty"].memory["draw"] = 0.25
        snapshot = json.loads(json.dumps(engine.snapshot()))  # as --state writes it
        expected = pattern(engine, PROMPT, 40)
        restored = FaultEngine(rules, random.Random(999))
        restored.restore(snapshot)
        assert restored.states["bursty"].memory == {"draw": 0.25}
        assert pattern(restored, PROMPT, 40) == expected
        old = FaultEngine(rules)
        old.restore({"rules": {"bursty": [3, 2]}})
        assert (old.states["bursty"].matched, old.states["bursty"].bad) == (3, False)


HTTP_ONLY = (
    {"name": "fail-post", "do": {"action": "http_status", "status": 503}},
    {"name": "cut-stream", "do": {"action": "close_stream"}},
)


class TestNotes:
    @staticmethod
    def engine(listener: str) -> tuple[FaultEngine, list[Note]]:
        heard: list[Note] = []
        return FaultEngine(listener=listener, on_note=heard.append), heard

    @pytest.mark.parametrize("listener", ["stdio", "ws"])
    def test_http_only_rules_are_told_where_clients_are_not_on_http(self, listener: str) -> None:
        """Loaded where Clients connect over stdio or WebSocket, each http_status or close_stream
        rule is told once: it can never fire there."""
        engine, heard = self.engine(listener)
        engine.replace([rule("drop"), *map(Rule.model_validate, HTTP_ONLY)])
        assert [(note.rule, note.needs_http) for note in heard] == [
            ("fail-post", True),
            ("cut-stream", True),
        ]

    def test_nothing_is_told_on_an_http_listener(self) -> None:
        """On a Streamable HTTP listener the same rules can fire: no note."""
        engine, heard = self.engine("http")
        engine.replace(map(Rule.model_validate, HTTP_ONLY))
        assert heard == []

    def test_once_per_rule_loaded(self) -> None:
        """A rule is told of when it is loaded or changed, not again when other rules change
        around it (a reload, a rule added or removed over the control API)."""
        engine, heard = self.engine("stdio")
        fail_post, cut_stream = map(Rule.model_validate, HTTP_ONLY)
        engine.replace([fail_post])
        engine.replace([fail_post, cut_stream])
        engine.replace([cut_stream])
        changed = Rule.model_validate(
            {**HTTP_ONLY[0], "do": {"action": "http_status", "status": 502}}
        )
        engine.replace([changed, cut_stream])
        assert [note.rule for note in heard] == ["fail-post", "cut-stream", "fail-post"]

    def test_an_old_name_is_told_on_any_listener(self) -> None:
        """sever's old `when` is told wherever Clients connect."""
        old = Rule.model_validate({"name": "cut", "do": {"action": "sever", "when": "after"}})
        engine, heard = self.engine("http")
        engine.replace([old])
        assert [(note.rule, note.field) for note in heard] == [("cut", "do.when")]


def test_a_notification_no_rule_matches_takes_the_fast_path_one_that_matches_does_not() -> None:
    """A rule on a session: an update of another session matches no rule (the fast path takes
    it, after the first of its shape taught the engine), one of that session is held by the
    rule and counted; the relay's output is the full path's, message for message."""
    rules = [
        rule(
            "s1-only",
            when={"method": "session/update", "session": "s1"},
            do={"action": "delay", "ms": 5},
        )
    ]

    def update(session: str) -> bytes:
        return (
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
            + session.encode()
            + b'","update":{}}}'
        )

    fast, full = FaultEngine(rules), FaultEngine(rules)
    relays = Relay(engine=fast), Relay(engine=full, fast_path=False)
    for session in ("s2", "s2", "s1", "s2", "s1"):
        [quick, slow] = [
            r.handle(MessageReceived(Side.AGENT, update(session), 0.0)) for r in relays
        ]
        assert quick == slow
        assert any(isinstance(c, StartTimer) for c in quick) is (session == "s1")
    assert fast.states["s1-only"].matched == full.states["s1-only"].matched == 2
    s2 = parse(update("s2"))
    assert isinstance(s2, Message)
    shape = (Direction.TO_CLIENT, Kind.NOTIFICATION, "stdio", "session/update")
    assert fast.unmatched(*shape, s2.body)
    s1 = parse(update("s1"))
    assert isinstance(s1, Message)
    assert not fast.unmatched(*shape, s1.body)


def test_a_request_or_answer_no_rule_matches_skips_the_decision_one_that_matches_does_not() -> None:
    """Rules on session s1's prompts (every second one, keyed) and on the answers to them: a
    prompt of s2 and its answer match no rule, and once the engine knows their shapes they go
    on without a decision (nothing to count, nothing drawn); those of s1 are counted, and
    held when due. The relay's output is the full path's, message for message, and so are the
    rules' counters."""
    rules = [
        rule(
            "keyed-s1",
            when={
                "kind": "request",
                "method": "session/prompt",
                "session": "s1",
                "idempotency_key": "present",
            },
            schedule={"every": 2},
            do={"action": "delay", "ms": 5},
        ),
        rule(
            "s1-answers",
            when={"kind": "response", "session": "s1"},
            do={"action": "delay", "ms": 5},
        ),
    ]

    def prompt(request_id: int, session: str) -> bytes:
        params = {"sessionId": session, "idempotencyKey": f"k{request_id}", "prompt": []}
        return json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
        ).encode()

    fast, full = FaultEngine(rules), FaultEngine(rules)
    relays = Relay(engine=fast), Relay(engine=full, fast_path=False)
    for request_id, session in enumerate(("s2", "s1", "s2", "s1", "s1", "s2")):
        sent = [
            r.handle(MessageReceived(Side.CLIENT, prompt(request_id, session), 0.0)) for r in relays
        ]
        assert sent[0] == sent[1]
        answer = b'{"jsonrpc":"2.0","id":%d,"result":{}}' % request_id  # the proxy's ids: 0, 1...
        answered = [r.handle(MessageReceived(Side.AGENT, answer, 0.0)) for r in relays]
        assert answered[0] == answered[1]
        held = any(isinstance(c, StartTimer) for c in answered[0])
        assert held is (session == "s1")
    assert {n: s.matched for n, s in fast.states.items()} == {"keyed-s1": 3, "s1-answers": 3}
    assert {n: s.matched for n, s in full.states.items()} == {"keyed-s1": 3, "s1-answers": 3}
    assert fast.states["keyed-s1"].fired == full.states["keyed-s1"].fired == 1
    request = (Direction.TO_AGENT, Kind.REQUEST, "stdio", "session/prompt")
    answer_shape = (Direction.TO_CLIENT, Kind.RESPONSE, "stdio", "session/prompt")
    assert fast.unmatched_as(*request, session="s2", keyed=True, params={"sessionId": "s2"})
    assert not fast.unmatched_as(*request, session="s1", keyed=True, params={"sessionId": "s1"})
    assert fast.unmatched_as(*answer_shape, session="s2", keyed=True, params=None)
    assert not fast.unmatched_as(*answer_shape, session="s1", keyed=True, params=None)


def _update_bytes(session: str, kind: str = "agent_message_chunk") -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
        + session.encode()
        + b'","update":{"sessionUpdate":"'
        + kind.encode()
        + b'"}}}'
    )


BURST_SHAPE = (Direction.TO_CLIENT, Kind.NOTIFICATION, "stdio", "session/update")


def _seen(rules: list[Rule]) -> FaultEngine:
    """An engine that has decided one ``session/update`` (its shape's rules are known)."""
    engine = FaultEngine(rules)
    assert engine.unmatched_in(*BURST_SHAPE, _update_bytes("s1")) is None  # not seen yet
    engine.decide(UPDATE, 0.0)
    return engine


def test_messages_read_together_are_passed_by_their_bytes_when_each_rule_lacks_one() -> None:
    """A burst's bytes decide for every message of a shape at once: no rule can match when each
    that could needs bytes the burst lacks (its params' strings and keys, ``"idempotencyKey"``);
    an escape a string may hide behind, or a rule with nothing to look for, leaves the decision
    to each message."""
    engine = _seen(
        [
            rule("tools", when={"params": {"update": {"sessionUpdate": "tool_call"}}}),
            rule("keyed", when={"method": "session/update", "idempotency_key": "present"}),
        ]
    )
    burst = _update_bytes("s1") + b"\n" + _update_bytes("s2")
    assert engine.unmatched_in(*BURST_SHAPE, burst) is True
    assert engine.unmatched_in(*BURST_SHAPE, burst + _update_bytes("s3", "tool_call")) is False
    assert engine.unmatched_in(*BURST_SHAPE, burst + b'"idempotencyKey"') is False
    hidden = _update_bytes("s3", "tool_c\\u0061ll")  # "tool_call", one letter escaped
    assert engine.unmatched_in(*BURST_SHAPE, burst + hidden) is False
    assert engine.unmatched_in(*BURST_SHAPE, burst + b'"a\\nb"') is True  # hides no letter
    blind = _seen([rule("one", when={"params": {"n": 1}}), rule("none", when={"params": {}})])
    assert blind.unmatched_in(*BURST_SHAPE, burst) is False  # 1 has more than one spelling


@pytest.mark.parametrize(
    ("glob", "matching", "lacking"),
    [
        ("s1", "s1", "s10"),
        ("other-*", "other-7", "another-7"),
        ("*-42", "run-42", "run-420"),
        ("z*y?q", "z--y-q", "z--y-"),
        ("run[0-9]x", "run7x", "ru"),
        ("*", "s1", None),  # nothing to look for
        ('say "hi"*', 'say "hi" 1', None),  # runs JSON escapes: not looked for
    ],
)
def test_a_session_glob_needs_its_literal_runs(
    glob: str, matching: str, lacking: str | None
) -> None:
    """A session rule passes a burst whose bytes lack one of its glob's literal runs (anchored
    by the string's quote where the glob is; nothing after a ``[...]`` class), and never one
    that holds a session it matches."""
    engine = _seen([rule("r", when={"session": glob})])
    raw = _update_bytes(matching.replace('"', '\\"'))
    assert engine.unmatched_in(*BURST_SHAPE, raw) is False
    if lacking is not None:
        assert engine.unmatched_in(*BURST_SHAPE, _update_bytes(lacking)) is True


def test_a_disabled_rule_matches_nothing_and_keeps_its_counters() -> None:
    """``enabled: false`` keeps a rule (listed, its counters where they were) but it neither
    counts nor fires, and a later rule acts in its place; enabled again, it goes on counting."""
    engine = FaultEngine([rule("first"), rule("second")])
    assert fires(engine, PROMPT) == ["first"]
    engine.replace([rule("first", enabled=False), rule("second")])
    assert fires(engine, PROMPT) == ["second"]
    assert engine.states["first"].matched == 1
    assert (
        engine.unmatched(Direction.TO_AGENT, Kind.REQUEST, "stdio", "session/prompt", {}) is False
    )
    engine.replace([rule("first", enabled=False)])
    assert fires(engine, PROMPT) == []
    assert engine.unmatched(Direction.TO_AGENT, Kind.REQUEST, "stdio", "session/prompt", {}) is True
    engine.replace([rule("first")])
    assert fires(engine, PROMPT) == ["first"]
    assert (engine.states["first"].matched, engine.states["first"].fired) == (2, 2)
    assert dump_rules([rule("first", enabled=False)]) == [
        {"name": "first", "do": {"action": "drop"}, "enabled": False}
    ]
