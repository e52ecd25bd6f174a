"""``bandwidth``: the matched messages of a link, in one direction, at most ``bytes_per_second``
(a token bucket of ``burst_bytes``, per rule, direction and link); the others flow past."""

from __future__ import annotations

import json
import random

import pytest
from action_lab import fault

from proxy.core.actions.bandwidth import ACTION, Bandwidth
from proxy.core.actions.base import MIN_WAIT, Pace, TokenBucket
from proxy.core.commands import Command, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.observations import FaultInjected, FaultOverflowed, Held
from proxy.core.relay import Relay


def chunk(number: int, method: str = "session/update", pad: int = 0) -> bytes:
    params = {"sessionId": "S", "n": number, "pad": "x" * pad}
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


def throttled(rate: int, burst: int = 0, max_active_faults: int | None = None) -> Relay:
    rule = Rule.model_validate(
        {
            "name": "slow-link",
            "when": {"method": "session/update"},
            "do": {"action": "bandwidth", "bytes_per_second": rate, "burst_bytes": burst},
        }
    )
    engine = FaultEngine([rule], random.Random(1), max_active_faults=max_active_faults)
    return Relay(engine=engine)


def timers(commands: list[Command]) -> list[StartTimer]:
    return [c for c in commands if isinstance(c, StartTimer)]


def numbers(commands: list[Command]) -> list[int]:
    return [
        json.loads(c.data)["params"]["n"]
        for c in commands
        if isinstance(c, Send) and c.to is Side.CLIENT
    ]


def test_the_action_is_a_place_in_the_links_bucket() -> None:
    params = Bandwidth(action="bandwidth", bytes_per_second=1000, burst_bytes=50)
    assert ACTION.apply(params, fault()) == [Pace(1000.0, 50)]


def test_a_bucket_lets_its_size_go_at_once_then_charges_each_its_bytes() -> None:
    bucket = TokenBucket.full(1000.0, 500, at=0.0)
    assert bucket.take(300, 0.0) == 0.0  # 200 left
    assert bucket.wait(300, 0.0) == pytest.approx(0.1)  # peeking takes nothing
    assert bucket.take(300, 0.0) == pytest.approx(0.1)  # 100 in debt
    assert bucket.take(100, 0.0) == pytest.approx(0.2)  # behind it, by its own size
    # A second idle refills it, no more than full.
    assert bucket.take(500, 10.0) == 0.0
    assert bucket.take(1, 10.0) == pytest.approx(0.001)


def test_without_a_burst_each_message_takes_the_time_the_link_carries_it_in() -> None:
    """1,000 B/s, no burst: three messages read together wait their own sizes' worth after
    one another, so they arrive in order at the link's rate."""
    relay = throttled(1000)
    messages = [chunk(n) for n in (1, 2, 3)]
    waits = []
    total = 0
    for message in messages:
        total += len(message)
        [timer] = timers(relay.handle(MessageReceived(Side.AGENT, message, 5.0)))
        waits.append(timer.delay)
        assert timer.delay == pytest.approx(total / 1000)
    assert waits == sorted(waits)


def test_a_link_that_went_idle_does_not_save_more_than_its_burst() -> None:
    relay = throttled(1000, burst=200)
    first = chunk(1)  # about 90 bytes: within the burst
    passed = relay.handle(MessageReceived(Side.AGENT, first, 0.0))
    assert numbers(passed) == [1]
    # Not slowed: no fault was injected (none logged, none counted as fired).
    assert not [c for c in passed if isinstance(c, FaultInjected | Held)]
    assert relay._engine is not None
    assert relay._engine.states["slow-link"].fired == 0
    # An hour later the bucket holds 200 bytes, not 3.6 MB: a 1,000-byte message waits 0.8 s.
    big = chunk(2, pad=1000 - len(chunk(2)))
    [timer] = timers(relay.handle(MessageReceived(Side.AGENT, big, 3600.0)))
    assert timer.delay == pytest.approx(0.8)
    assert relay._engine.states["slow-link"].fired == 1


def test_unmatched_messages_flow_past_and_the_held_ones_follow_in_order() -> None:
    relay = throttled(100)
    held = relay.handle(MessageReceived(Side.AGENT, chunk(1), 0.0))
    assert [type(c) for c in held if isinstance(c, Held | Send)] == [Held]
    other = relay.handle(MessageReceived(Side.AGENT, chunk(9, method="_x/other"), 0.0))
    assert numbers(other) == [9]
    later = relay.handle(MessageReceived(Side.AGENT, chunk(2), 0.0))
    first_timer, second_timer = timers(held)[0], timers(later)[0]
    assert first_timer.delay < second_timer.delay
    sent = relay.handle(TimerFired(first_timer.token, first_timer.delay))
    sent += relay.handle(TimerFired(second_timer.token, second_timer.delay))
    assert numbers(sent) == [1, 2]


def test_each_direction_and_each_link_has_a_bucket_of_its_own() -> None:
    rule = Rule.model_validate(
        {"name": "slow", "do": {"action": "bandwidth", "bytes_per_second": 10, "burst_bytes": 400}}
    )
    engine = FaultEngine([rule], random.Random(1))
    one, two = Relay(engine=engine), Relay(engine=engine)
    update = chunk(1)
    request = b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"S"}}'
    for relay in (one, two):  # each link's bucket is full at first, in both directions
        assert numbers(relay.handle(MessageReceived(Side.AGENT, update, 0.0))) == [1]
        to_agent = relay.handle(MessageReceived(Side.CLIENT, request, 0.0))
        assert timers(to_agent) == []
        assert [c.to for c in to_agent if isinstance(c, Send)] == [Side.AGENT]


def test_a_wait_is_a_fault_in_progress_and_a_full_cap_lets_the_message_through() -> None:
    relay = throttled(100, max_active_faults=1)
    assert timers(relay.handle(MessageReceived(Side.AGENT, chunk(1), 0.0)))
    relay.active_faults.count = 1  # the shell counts the timer it started
    refused = relay.handle(MessageReceived(Side.AGENT, chunk(2), 0.0))
    assert numbers(refused) == [2]
    assert [c.rule for c in refused if isinstance(c, FaultOverflowed)] == ["slow-link"]


def test_a_message_with_bytes_to_spare_still_goes_behind_one_not_yet_gone() -> None:
    """Once the link had time to carry the last held message its bucket has bytes again, but
    if that message's timer has not fired yet (the shell is late), the next one is held a
    moment too, so as not to overtake it."""
    relay = throttled(1000, burst=500)
    big = chunk(1, pad=1000)
    [first] = timers(relay.handle(MessageReceived(Side.AGENT, big, 0.0)))
    late = first.delay + 1.0  # its wait is long over: the bucket is full again
    [second] = timers(relay.handle(MessageReceived(Side.AGENT, chunk(2), late)))
    assert second.delay == MIN_WAIT
    sent = relay.handle(TimerFired(first.token, late)) + relay.handle(
        TimerFired(second.token, late)
    )
    assert numbers(sent) == [1, 2]
    # Once it has gone, the next one with bytes to spare passes at once.
    assert numbers(relay.handle(MessageReceived(Side.AGENT, chunk(3), late))) == [3]
