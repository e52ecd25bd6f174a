"""Every fault action as the relay core carries it out: commands in, commands out, no sockets."""

from __future__ import annotations

import json
import random
from typing import Any, TypeVar

import pytest

from proxy.core.actions.corrupt import corrupt
from proxy.core.commands import (
    Close,
    Command,
    Restart,
    Send,
    Sever,
    SignalAgent,
    StartTimer,
)
from proxy.core.engine import FaultEngine
from proxy.core.events import Direction, MessageReceived, PeerClosed, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.jsonrpc import Kind
from proxy.core.observations import (
    DuplicateSwallowed,
    FaultInjected,
    FaultOverflowed,
    Held,
    Observation,
    Relayed,
    RulesCounted,
    Stopped,
    Stopping,
    Undeliverable,
)
from proxy.core.relay import Relay

CLIENT, AGENT = Side.CLIENT, Side.AGENT
T = TypeVar("T")

PROMPT = b'{"jsonrpc":"2.0","id":"p1","method":"session/prompt","params":{"sessionId":"S","idempotencyKey":"K1","prompt":[]}}'
UNKEYED = (
    b'{"jsonrpc":"2.0","id":"p2","method":"session/prompt","params":{"sessionId":"S","prompt":[]}}'
)
UPDATE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","update":{}}}'


def answer(id_token: bytes, message_id: str = "M1") -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":'
        + id_token
        + b',"result":{"messageId":"'
        + message_id.encode()
        + b'"}}'
    )


def relay_with(*rules: dict[str, Any], seed: int = 1, max_pending: int | None = None) -> Relay:
    parsed = [
        Rule.model_validate({"name": f"r{index}", **rule}) for index, rule in enumerate(rules)
    ]
    return Relay(engine=FaultEngine(parsed, random.Random(seed)), max_pending=max_pending)


def feed(relay: Relay, side: Side, raw: bytes, at: float = 0.0) -> list[Command]:
    return relay.handle(MessageReceived(side, raw, at))


def sends(commands: list[Command]) -> list[tuple[Side, bytes]]:
    return [(c.to, c.data) for c in commands if isinstance(c, Send)]


def of(commands: list[Command], kind: type[T]) -> list[T]:
    return [c for c in commands if isinstance(c, kind)]


def effects(commands: list[Command]) -> list[Command]:
    """Commands other than observations, in order."""
    return [c for c in commands if not isinstance(c, Observation)]


class TestDrop:
    def test_dropped_request_never_reaches_the_agent(self) -> None:
        """A dropped request is not forwarded and leaves nothing pending."""
        relay = relay_with({"when": {"method": "session/prompt"}, "do": {"action": "drop"}})
        commands = feed(relay, CLIENT, PROMPT)
        assert sends(commands) == []
        assert [(f.rule, f.action, f.kind) for f in of(commands, FaultInjected)] == [
            ("r0", "drop", Kind.REQUEST)
        ]
        assert relay.pending(Direction.TO_AGENT) == 0

    def test_dropped_response_is_lost_and_its_request_forgotten(self) -> None:
        """The agent answered; the client never hears; a late copy of the answer is an orphan."""
        relay = relay_with(
            {
                "when": {
                    "kind": "response",
                    "method": "session/prompt",
                    "idempotency_key": "present",
                },
                "do": {"action": "drop"},
            }
        )
        feed(relay, CLIENT, PROMPT)
        commands = feed(relay, AGENT, answer(b"0"))
        assert sends(commands) == []
        [fault] = of(commands, FaultInjected)
        assert (fault.method, fault.session, fault.kind) == ("session/prompt", "S", Kind.RESPONSE)
        assert relay.pending(Direction.TO_AGENT) == 0
        assert sends(feed(relay, AGENT, answer(b"0"))) == []

    def test_keyed_matching_uses_the_request(self) -> None:
        """The response to an unkeyed prompt is not matched by idempotency_key: present."""
        relay = relay_with(
            {"when": {"kind": "response", "idempotency_key": "present"}, "do": {"action": "drop"}}
        )
        feed(relay, CLIENT, UNKEYED)
        assert len(sends(feed(relay, AGENT, answer(b"0")))) == 1

    def test_only_the_nth_is_dropped(self) -> None:
        """nth: [2] drops the second keyed answer only."""
        relay = relay_with(
            {"when": {"kind": "response"}, "schedule": {"nth": [2]}, "do": {"action": "drop"}}
        )
        delivered = []
        for index in range(3):
            feed(relay, CLIENT, PROMPT.replace(b'"p1"', b'"p%d"' % index))
            delivered.append(bool(sends(feed(relay, AGENT, answer(b"%d" % index)))))
        assert delivered == [True, False, True]


class TestError:
    def test_request_is_answered_under_the_senders_id(self) -> None:
        """The client gets the configured error under its own id; the agent sees nothing."""
        relay = relay_with(
            {
                "when": {"method": "session/prompt"},
                "do": {"action": "error", "code": -32002, "message": "gone", "data": {"x": 1}},
            }
        )
        commands = feed(relay, CLIENT, PROMPT)
        [(to, data)] = sends(commands)
        assert to is CLIENT
        assert json.loads(data) == {
            "jsonrpc": "2.0",
            "id": "p1",
            "error": {
                "code": -32002,
                "message": "gone",
                "data": {"x": 1, "acpFault": {"rule": "r0", "action": "error"}},
            },
        }
        assert relay.pending(Direction.TO_AGENT) == 0

    def test_error_defaults(self) -> None:
        """Without fields, the error is -32603 with a message naming the proxy."""
        relay = relay_with({"do": {"action": "error"}})
        [(_, data)] = sends(feed(relay, CLIENT, PROMPT))
        error = json.loads(data)["error"]
        assert error["code"] == -32603
        assert "acp-fault-proxy" in error["message"]


class TestDelay:
    def test_delayed_message_is_held_and_overtaken(self) -> None:
        """A delayed message waits for its timer; a later message passes it."""
        relay = relay_with(
            {
                "when": {"method": "session/update"},
                "schedule": {"nth": [1]},
                "do": {"action": "delay", "ms": 250},
            }
        )
        held = feed(relay, AGENT, UPDATE)
        assert sends(held) == []
        [timer] = of(held, StartTimer)
        assert timer.delay == pytest.approx(0.25)
        second = UPDATE.replace(b"{}}}", b'{"n":2}}}')
        assert sends(feed(relay, AGENT, second)) == [(CLIENT, second)]
        assert sends(relay.handle(TimerFired(timer.token, 0.25))) == [(CLIENT, UPDATE)]

    def test_jitter_is_drawn_from_the_seed(self) -> None:
        """Jitter adds a uniform draw from the seeded stream: same seed, same delays."""

        def delays(seed: int) -> list[float]:
            relay = relay_with({"do": {"action": "delay", "ms": 10, "jitter_ms": 5}}, seed=seed)
            return [of(feed(relay, AGENT, UPDATE), StartTimer)[0].delay for _ in range(5)]

        first = delays(3)
        assert first == delays(3)
        assert first != delays(4)
        assert all(0.010 <= delay <= 0.015 for delay in first)

    def test_delayed_request_is_registered_at_once(self) -> None:
        """A delayed request already has its id; its answer maps back normally."""
        relay = relay_with({"when": {"kind": "request"}, "do": {"action": "delay", "ms": 5}})
        [timer] = of(feed(relay, CLIENT, PROMPT), StartTimer)
        [(to, data)] = sends(relay.handle(TimerFired(timer.token, 1.0)))
        assert (to, json.loads(data)["id"]) == (AGENT, 0)
        assert sends(feed(relay, AGENT, answer(b"0"))) == [(CLIENT, answer(b'"p1"'))]

    def test_held_message_for_a_closed_peer_is_undeliverable(self) -> None:
        """If the destination closed meanwhile, the released message is dropped and recorded."""
        relay = relay_with({"do": {"action": "delay", "ms": 5}})
        [timer] = of(feed(relay, AGENT, UPDATE), StartTimer)
        relay.handle(PeerClosed(AGENT, 0.1))  # closes the client side too
        released = relay.handle(TimerFired(timer.token, 0.2))
        assert sends(released) == []
        assert of(released, Undeliverable)[0].kind is Kind.NOTIFICATION


class TestHeldMessages:
    """A held message is observed twice: held when it arrives, relayed when it really leaves."""

    def test_a_delayed_notification_is_relayed_after_the_one_that_overtook_it(self) -> None:
        """Held (rule, delay, link to the delivery) at arrival; the overtaking message's Relayed
        and Send; then, when the timer fires, the held one's Relayed and Send: the order of the
        observations is the order on the wire."""
        relay = relay_with(
            {
                "when": {"method": "session/update"},
                "schedule": {"nth": [1]},
                "do": {"action": "delay", "ms": 250},
            }
        )
        second = UPDATE.replace(b"{}}}", b'{"n":2}}}')
        first = feed(relay, AGENT, UPDATE, at=10.0)
        [timer] = of(first, StartTimer)
        [held] = of(first, Held)
        assert of(first, Relayed) == []
        assert (held.hold, held.rules) == (timer.token, ("r0",))
        assert held.delay == pytest.approx(0.25)
        assert (held.relayed.direction, held.relayed.kind, held.relayed.method) == (
            Direction.TO_CLIENT,
            Kind.NOTIFICATION,
            "session/update",
        )
        overtaking = feed(relay, AGENT, second, at=10.1)
        released = relay.handle(TimerFired(timer.token, 10.25))
        wire = [
            (type(c).__name__, c.data if isinstance(c, Send) else getattr(c, "hold", None))
            for c in [*first, *overtaking, *released]
            if isinstance(c, Held | Relayed | Send)
        ]
        assert wire == [
            ("Held", timer.token),
            ("Relayed", None),
            ("Send", second),
            ("Relayed", timer.token),
            ("Send", UPDATE),
        ]

    def test_a_held_answers_duration_ends_when_it_is_delivered(self) -> None:
        """The duration of a delayed answer runs from its request's arrival to its delivery."""
        relay = relay_with({"when": {"kind": "response"}, "do": {"action": "delay", "ms": 500}})
        feed(relay, CLIENT, PROMPT, at=1.0)
        arrived = feed(relay, AGENT, answer(b"0"), at=3.0)
        [held] = of(arrived, Held)
        assert held.relayed.duration == pytest.approx(2.0)
        [timer] = of(arrived, StartTimer)
        [relayed] = of(relay.handle(TimerFired(timer.token, 3.5)), Relayed)
        assert (relayed.original_id, relayed.forwarded_id) == (b'"p1"', b"0")
        assert relayed.duration == pytest.approx(2.5)

    def test_spaced_copies_are_held_each_and_relayed_when_sent(self) -> None:
        """duplicate with gap_ms: the original is relayed now, each copy is held, then relayed
        as a copy when its timer fires (notifications as requests: every copy is observed)."""
        relay = relay_with({"do": {"action": "duplicate", "copies": 2, "gap_ms": 20}})
        commands = feed(relay, AGENT, UPDATE)
        [original] = of(commands, Relayed)
        assert not original.copy
        holds = of(commands, Held)
        assert [(h.rules, h.relayed.copy) for h in holds] == [(("r0",), True)] * 2
        for timer, held in zip(of(commands, StartTimer), holds, strict=True):
            released = relay.handle(TimerFired(timer.token, 1.0))
            [relayed] = of(released, Relayed)
            assert (relayed.copy, relayed.hold) == (True, held.hold)
            assert sends(released) == [(CLIENT, UPDATE)]

    def test_a_held_message_for_a_closed_peer_says_which_message_was_lost(self) -> None:
        """Released after its peer left: no Relayed, an Undeliverable naming the message and
        its hold."""
        relay = relay_with({"when": {"kind": "request"}, "do": {"action": "delay", "ms": 5}})
        [timer] = of(feed(relay, CLIENT, PROMPT), StartTimer)
        relay.handle(PeerClosed(CLIENT, 0.1))
        released = relay.handle(TimerFired(timer.token, 0.2))
        assert of(released, Relayed) == []
        [lost] = of(released, Undeliverable)
        assert (lost.method, lost.original_id, lost.forwarded_id, lost.hold) == (
            "session/prompt",
            b'"p1"',
            b"0",
            timer.token,
        )


class TestStopped:
    """A message a fault stopped is observed as not relayed, with how and by which rule."""

    @pytest.mark.parametrize(
        ("do", "disposition"),
        [
            ({"action": "drop"}, "dropped"),
            ({"action": "error"}, "answered_by_proxy"),
            ({"action": "sever", "side": "agent", "moment": "before"}, "severed"),
        ],
    )
    def test_a_stopped_request(self, do: dict[str, Any], disposition: Stopping) -> None:
        relay = relay_with({"when": {"method": "session/prompt"}, "do": do})
        [stopped] = of(feed(relay, CLIENT, PROMPT), Stopped)
        assert stopped == Stopped(
            direction=Direction.TO_AGENT,
            kind=Kind.REQUEST,
            method="session/prompt",
            session="S",
            size=len(PROMPT),
            original_id=b'"p1"',
            forwarded_id=None,
            rule="r0",
            disposition=disposition,
        )

    def test_a_dropped_answer_names_its_request(self) -> None:
        relay = relay_with({"when": {"kind": "response"}, "do": {"action": "drop"}})
        feed(relay, CLIENT, PROMPT)
        [stopped] = of(feed(relay, AGENT, answer(b"0")), Stopped)
        assert (stopped.method, stopped.original_id, stopped.forwarded_id) == (
            "session/prompt",
            b'"p1"',
            b"0",
        )
        assert stopped.disposition == "dropped"

    def test_a_fault_on_an_answer_names_the_id_its_requester_wrote(self) -> None:
        """The Agent answers the id the proxy gave (0); the Client knows its own ("p1"): the
        fault says both, a fault on a request only the one it has."""
        relay = relay_with({"do": {"action": "delay", "ms": 1}})
        [asked] = of(feed(relay, CLIENT, PROMPT), FaultInjected)
        [answered] = of(feed(relay, AGENT, answer(b"0")), FaultInjected)
        assert (asked.id, asked.request_id) == (b'"p1"', None)
        assert (answered.id, answered.request_id) == (b"0", b'"p1"')

    def test_sever_after_and_delay_stop_nothing(self) -> None:
        relay = relay_with(
            {"do": {"action": "delay", "ms": 1}, "continue": True},
            {"do": {"action": "sever", "side": "agent", "moment": "after"}},
        )
        assert of(feed(relay, CLIENT, PROMPT), Stopped) == []


class TestDuplicate:
    def test_request_copies_get_their_own_ids_and_one_answer_returns(self) -> None:
        """The agent sees the retry under a new id; the client gets the first answer only."""
        relay = relay_with(
            {
                "when": {"kind": "request", "method": "session/prompt"},
                "do": {"action": "duplicate", "copies": 2},
            }
        )
        commands = feed(relay, CLIENT, PROMPT)
        forwarded = sends(commands)
        assert [json.loads(data)["id"] for _, data in forwarded] == [0, 1, 2]
        assert {
            data.replace(b'"id":0', b"").replace(b'"id":1', b"").replace(b'"id":2', b"")
            for _, data in forwarded
        } == {PROMPT.replace(b'"id":"p1"', b"")}
        assert sends(feed(relay, AGENT, answer(b"1", "M1"))) == [(CLIENT, answer(b'"p1"', "M1"))]
        later = feed(relay, AGENT, answer(b"0", "M2"))
        assert sends(later) == []
        [swallowed] = of(later, DuplicateSwallowed)
        assert (swallowed.original_id, swallowed.forwarded_id, swallowed.data) == (
            b'"p1"',
            b"0",
            answer(b"0", "M2"),
        )
        assert sends(feed(relay, AGENT, answer(b"2"))) == []
        assert relay.pending(Direction.TO_AGENT) == 0

    def test_cancel_of_a_duplicated_request_reaches_every_copy(self) -> None:
        """$/cancel_request of the client's id is translated to each pending copy."""
        relay = relay_with({"when": {"kind": "request"}, "do": {"action": "duplicate"}})
        feed(relay, CLIENT, PROMPT)
        cancel = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"p1"}}'
        sent = sends(feed(relay, CLIENT, cancel))
        assert [json.loads(data)["params"]["requestId"] for _, data in sent] == [0, 1]

    def test_copies_with_a_gap_are_timed(self) -> None:
        """gap_ms spaces the copies with timers; the original goes at once."""
        relay = relay_with({"do": {"action": "duplicate", "copies": 2, "gap_ms": 20}})
        commands = feed(relay, AGENT, UPDATE)
        assert sends(commands) == [(CLIENT, UPDATE)]
        timers = of(commands, StartTimer)
        assert [timer.delay for timer in timers] == pytest.approx([0.02, 0.04])
        for timer in timers:
            assert sends(relay.handle(TimerFired(timer.token, 1.0))) == [(CLIENT, UPDATE)]

    def test_request_copies_never_take_the_pending_requests_past_their_bound(self) -> None:
        """Copies are pending requests too: with room for three, a request and two of its five
        copies are forwarded; the next request is refused; the answer still comes back once."""
        relay = relay_with(
            {"when": {"kind": "request"}, "do": {"action": "duplicate", "copies": 5}},
            max_pending=3,
        )
        commands = feed(relay, CLIENT, PROMPT)
        assert [json.loads(data)["id"] for _, data in sends(commands)] == [0, 1, 2]
        assert relay.pending(Direction.TO_AGENT) == 3
        [(to, refusal)] = sends(feed(relay, CLIENT, UNKEYED))
        assert (to, json.loads(refusal)["error"]["code"]) == (CLIENT, -32603)
        assert sends(feed(relay, AGENT, answer(b"2"))) == [(CLIENT, answer(b'"p1"'))]
        assert sends(feed(relay, AGENT, answer(b"0"))) == []

    def test_notification_copies_are_identical(self) -> None:
        """A duplicated notification is sent byte for byte again."""
        relay = relay_with({"do": {"action": "duplicate", "copies": 1}})
        assert sends(feed(relay, AGENT, UPDATE)) == [(CLIENT, UPDATE), (CLIENT, UPDATE)]

    def test_duplicated_response_reaches_the_client_twice(self) -> None:
        """A duplicated answer is delivered twice, under the client's id both times."""
        relay = relay_with({"when": {"kind": "response"}, "do": {"action": "duplicate"}})
        feed(relay, CLIENT, PROMPT)
        assert sends(feed(relay, AGENT, answer(b"0"))) == [(CLIENT, answer(b'"p1"'))] * 2


class TestSever:
    @pytest.mark.parametrize(
        ("side", "expected"),
        [("client", [CLIENT]), ("agent", [AGENT]), ("both", [CLIENT, AGENT])],
    )
    def test_before_forwarding(self, side: str, expected: list[Side]) -> None:
        """sever before: the message is lost and the connections are cut without flushing."""
        relay = relay_with(
            {"do": {"action": "sever", "side": side, "moment": "before", "close_code": 4000}}
        )
        commands = feed(relay, CLIENT, PROMPT)
        assert effects(commands) == [Sever(s, False, 4000) for s in expected]

    def test_after_forwarding(self) -> None:
        """sever after: the message is sent, then the connection is cut after a flush."""
        relay = relay_with({"do": {"action": "sever", "side": "client", "moment": "after"}})
        commands = feed(relay, CLIENT, PROMPT)
        assert [type(c) for c in effects(commands)] == [Send, Sever]
        assert effects(commands)[1] == Sever(CLIENT, True, 1001)

    def test_nothing_more_is_sent_to_a_severed_peer(self) -> None:
        """Once severed, messages for that peer are undeliverable."""
        relay = relay_with(
            {
                "when": {"method": "session/prompt"},
                "do": {"action": "sever", "side": "client", "moment": "after"},
            }
        )
        feed(relay, CLIENT, PROMPT)
        commands = feed(relay, AGENT, UPDATE)
        assert sends(commands) == []
        assert of(commands, Undeliverable)


class TestKillAndRestart:
    def test_kill_agent_after_forwarding(self) -> None:
        """kill_agent signals the agent right after the message is forwarded."""
        relay = relay_with({"do": {"action": "kill_agent", "signal": "TERM", "respawn": True}})
        assert [type(c) for c in effects(feed(relay, CLIENT, PROMPT))] == [Send, SignalAgent]
        assert effects(feed(relay, CLIENT, UPDATE))[1] == SignalAgent(15, True)

    def test_kill_agent_after_a_delay(self) -> None:
        """after_ms turns the kill into a timer."""
        relay = relay_with({"do": {"action": "kill_agent", "after_ms": 100}})
        commands = effects(feed(relay, CLIENT, PROMPT))
        assert isinstance(commands[1], StartTimer)
        assert commands[1].delay == pytest.approx(0.1)
        assert relay.handle(TimerFired(commands[1].token, 1.0)) == [SignalAgent(9, False)]

    def test_a_delayed_kill_is_void_once_the_agent_is_being_closed(self) -> None:
        """The Client left before the kill was due: the proxy is already closing the Agent's
        stdin (it exits, or is stopped after its grace), and signals nothing more: the run ends
        the same way whichever comes first, the Agent's exit or the timer."""
        relay = relay_with({"do": {"action": "kill_agent", "after_ms": 100, "respawn": True}})
        [_, timer] = effects(feed(relay, CLIENT, PROMPT))
        assert isinstance(timer, StartTimer)
        assert effects(relay.handle(PeerClosed(CLIENT, 0.5))) == [Close(AGENT)]
        assert relay.handle(TimerFired(timer.token, 1.0)) == []

    def test_restart_proxy_after_forwarding(self) -> None:
        """restart_proxy forwards the request, then restarts with the downtime in seconds."""
        relay = relay_with({"do": {"action": "restart_proxy", "downtime_ms": 250}})
        assert effects(feed(relay, CLIENT, PROMPT))[1:] == [Restart(0.25)]

    def test_drop_and_restart_combine_with_continue(self) -> None:
        """continue: a dropped request can still trigger a restart."""
        relay = relay_with(
            {"do": {"action": "drop"}, "continue": True},
            {"do": {"action": "restart_proxy"}},
        )
        assert effects(feed(relay, CLIENT, PROMPT)) == [Restart(0.0)]

    def test_delayed_message_keeps_its_after_effects_behind_it(self) -> None:
        """delay + sever after: the cut happens after the delayed message is sent."""
        relay = relay_with(
            {"do": {"action": "delay", "ms": 10}, "continue": True},
            {"do": {"action": "sever", "side": "agent", "moment": "after"}},
        )
        [timer] = effects(feed(relay, CLIENT, PROMPT))
        assert isinstance(timer, StartTimer)
        released = relay.handle(TimerFired(timer.token, 1.0))
        assert [type(c) for c in effects(released)] == [Send, Sever]


class TestCorrupt:
    @pytest.mark.parametrize("mode", ["truncate", "garbage", "invalid_utf8"])
    def test_corrupted_bytes_are_malformed_and_single_line(self, mode: str) -> None:
        """Each mode sends something a JSON parser refuses, never with a newline."""
        relay = relay_with({"do": {"action": "corrupt", "mode": mode}})
        [(to, data)] = sends(feed(relay, AGENT, UPDATE))
        assert to is CLIENT
        assert b"\n" not in data
        with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
            json.loads(data)
        if mode == "invalid_utf8":
            with pytest.raises(UnicodeDecodeError):
                data.decode("utf-8")

    @pytest.mark.parametrize("mode", ["truncate", "garbage", "invalid_utf8"])
    @pytest.mark.parametrize("copies", [0, 2])
    def test_a_corrupted_request_is_not_left_pending(self, mode: str, copies: int) -> None:
        """No peer can read an id out of it, so no answer will come: it is forgotten at once,
        copies included; the request before it stays pending and is answered as usual."""
        corrupting: list[dict[str, Any]] = [
            {"when": {"method": "session/prompt"}, "do": {"action": "corrupt", "mode": mode}}
        ]
        if copies:
            corrupting.insert(
                0,
                {
                    "when": {"method": "session/prompt"},
                    "do": {"action": "duplicate", "copies": copies},
                    "continue": True,
                },
            )
        relay = relay_with(*corrupting)
        feed(relay, CLIENT, b'{"jsonrpc":"2.0","id":"i","method":"initialize","params":{}}')
        assert relay.pending(Direction.TO_AGENT) == 1
        assert len(sends(feed(relay, CLIENT, PROMPT))) == 1 + copies
        assert relay.pending(Direction.TO_AGENT) == 1
        [(to, data)] = sends(feed(relay, AGENT, answer(b"0")))
        assert (to, json.loads(data)["id"]) == (CLIENT, "i")
        assert relay.pending(Direction.TO_AGENT) == 0

    def test_garbage_is_seeded(self) -> None:
        """The same seed gives the same garbage."""
        first = sends(feed(relay_with({"do": {"action": "corrupt"}}, seed=9), AGENT, UPDATE))
        again = sends(feed(relay_with({"do": {"action": "corrupt"}}, seed=9), AGENT, UPDATE))
        assert first == again

    def test_corrupt_helper(self) -> None:
        """truncate keeps the first half; invalid_utf8 keeps the rest of the bytes."""
        assert corrupt(b"0123456789", "truncate", iter(())) == b"01234"
        assert corrupt(b'{"a":1}', "invalid_utf8", iter(())) == b'{"\xc3\x28a":1}'


class TestObservations:
    def test_counters_moving_is_recorded_once_per_message(self) -> None:
        """RulesCounted marks messages that moved a counter (for --state)."""
        relay = relay_with(
            {
                "when": {"method": "session/prompt"},
                "schedule": {"nth": [5]},
                "do": {"action": "drop"},
            }
        )
        assert len(of(feed(relay, CLIENT, PROMPT), RulesCounted)) == 1
        assert of(feed(relay, AGENT, UPDATE), RulesCounted) == []

    def test_unaffected_messages_are_relayed_as_usual(self) -> None:
        """Rules that do not match leave a message untouched."""
        relay = relay_with({"when": {"method": "nothing/matches"}, "do": {"action": "drop"}})
        commands = feed(relay, CLIENT, PROMPT)
        assert sends(commands) == [(AGENT, PROMPT.replace(b'"p1"', b"0"))]
        assert of(commands, Relayed)


class TestBatches:
    def test_rules_see_each_element(self) -> None:
        """A dropped element leaves the batch; a delayed one follows on its own."""
        relay = relay_with(
            {"when": {"method": "a"}, "do": {"action": "drop"}},
            {"when": {"method": "b"}, "do": {"action": "delay", "ms": 1}},
        )
        commands = feed(
            relay, CLIENT, b'[{"id":1,"method":"a"},{"id":2,"method":"b"},{"id":3,"method":"c"}]'
        )
        assert sends(commands) == [(AGENT, b'[{"id":1,"method":"c"}]')]
        [timer] = of(commands, StartTimer)
        assert sends(relay.handle(TimerFired(timer.token, 1.0))) == [
            (AGENT, b'{"id":0,"method":"b"}')
        ]


def test_a_fault_that_would_exceed_max_active_faults_does_not_act() -> None:
    """With as many faults in progress as ``max_active_faults`` allows (the shell counts each
    fault timer from its start to its end), a rule whose fault would start one more does not
    act: the message goes on at once, the refusal is observed, and the rule's ``times`` budget
    is not spent on it; a fault that starts nothing (a drop) still acts. Deadlines are no
    faults."""
    rules = [
        Rule.model_validate(
            {
                "name": "slow",
                "when": {"method": "_x/slow"},
                "schedule": {"times": 2},
                "do": {"action": "delay", "ms": 50},
            }
        ),
        Rule.model_validate(
            {"name": "lose", "when": {"method": "_x/lose"}, "do": {"action": "drop"}}
        ),
    ]
    engine = FaultEngine(rules, random.Random(1), max_active_faults=1)
    relay = Relay(engine=engine, initialize_timeout=5.0)

    def handle(raw: bytes) -> list[Command]:
        commands = feed(relay, CLIENT, raw)
        relay.active_faults.count += sum(t.fault for t in of(commands, StartTimer))  # the shell
        return commands

    slow = b'{"jsonrpc":"2.0","method":"_x/slow","params":{"n":%d}}'
    [deadline] = of(
        handle(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'), StartTimer
    )
    assert not deadline.fault
    assert relay.active_faults.count == 0
    first = handle(slow % 1)
    [timer] = of(first, StartTimer)
    assert of(first, Held)
    assert not sends(first)
    assert relay.active_faults.count == 1
    second = handle(slow % 2)
    assert sends(second) == [(AGENT, slow % 2)]
    [refused] = of(second, FaultOverflowed)
    assert (refused.rule, refused.action, refused.method) == ("slow", "delay", "_x/slow")
    assert not of(second, FaultInjected)
    assert engine.states["slow"].fired == 1
    assert of(handle(b'{"jsonrpc":"2.0","method":"_x/lose"}'), Stopped)  # starts nothing
    relay.handle(TimerFired(timer.token, 0.05))
    relay.active_faults.count -= 1  # the shell: the timer ended
    third = handle(slow % 3)
    assert of(third, Held)
    assert not sends(third)
    assert engine.states["slow"].fired == 2
