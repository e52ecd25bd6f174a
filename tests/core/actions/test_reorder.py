"""``reorder``: a message held until ``after`` later ones in its direction have passed it (or
``max_ms``), then sent right behind the last of them."""

from __future__ import annotations

import json
import random

from action_lab import fault

from proxy.core.actions.base import Hold
from proxy.core.actions.reorder import ACTION, Reorder
from proxy.core.commands import Command, ForgetTimer, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import Direction, MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.observations import Held, Relayed
from proxy.core.relay import Relay


def update(number: int) -> bytes:
    params = {"sessionId": "S", "update": {"sessionUpdate": "agent_message_chunk", "n": number}}
    return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}).encode()


def reordering(**fields: object) -> Relay:
    rule = Rule.model_validate(
        {
            "name": "shuffle",
            "when": {"method": "session/update"},
            "schedule": {"nth": [1]},
            "do": {"action": "reorder", **fields},
        }
    )
    return Relay(engine=FaultEngine([rule], random.Random(1)))


def numbers(commands: list[Command]) -> list[int]:
    """The chunks sent to the Client, in order, by their number."""
    return [
        json.loads(c.data)["params"]["update"]["n"]
        for c in commands
        if isinstance(c, Send) and c.to is Side.CLIENT
    ]


def test_the_action_is_a_hold_that_later_messages_can_end() -> None:
    params = Reorder(action="reorder", after=3, max_ms=200)
    assert ACTION.apply(params, fault()) == [Hold(0.2, passed=3)]


def test_a_chunk_arrives_after_the_ones_that_followed_it() -> None:
    """``after: 2``: chunk 1 is held; chunks 2 and 3 pass it; it leaves right behind chunk 3,
    observed held then relayed like a delayed message."""
    relay = reordering(after=2)
    sent: list[Command] = []
    first = relay.handle(MessageReceived(Side.AGENT, update(1), 0.0))
    assert [type(c) for c in first if isinstance(c, Held | StartTimer | Send)] == [
        Held,
        StartTimer,
    ]
    for number in (2, 3, 4):
        sent += relay.handle(MessageReceived(Side.AGENT, update(number), 0.1))
    assert numbers(sent) == [2, 3, 1, 4]
    [late] = [c for c in sent if isinstance(c, Relayed) and c.hold is not None]
    assert late.message is not None
    [timer] = [c for c in first if isinstance(c, StartTimer)]
    # Released early: the shell is told to forget its timer (what it held is gone).
    assert [c.token for c in sent if isinstance(c, ForgetTimer)] == [timer.token]
    assert relay.handle(TimerFired(timer.token, 1.0)) == []  # released already


def test_when_fewer_come_it_leaves_after_max_ms() -> None:
    relay = reordering(after=5, max_ms=50)
    [timer] = [
        c
        for c in relay.handle(MessageReceived(Side.AGENT, update(1), 0.0))
        if isinstance(c, StartTimer)
    ]
    assert timer.delay == 0.05
    passing = relay.handle(MessageReceived(Side.AGENT, update(2), 0.01))
    assert numbers(passing) == [2]
    assert numbers(relay.handle(TimerFired(timer.token, 0.05))) == [1]
    assert numbers(relay.handle(MessageReceived(Side.AGENT, update(3), 0.06))) == [3]


def test_only_messages_in_its_direction_pass_it() -> None:
    """A message toward the Agent does not count: the chunk waits for chunks."""
    relay = reordering(after=1)
    relay.handle(MessageReceived(Side.AGENT, update(1), 0.0))
    ask = b'{"jsonrpc":"2.0","id":1,"method":"_x/ask","params":{}}'
    assert numbers(relay.handle(MessageReceived(Side.CLIENT, ask, 0.0))) == []
    assert numbers(relay.handle(MessageReceived(Side.AGENT, update(2), 0.0))) == [2, 1]


def test_held_messages_nothing_passes_leave_no_entry_once_their_timer_fired() -> None:
    """Every chunk held (nothing in that direction passes): each leaves at ``max_ms``, and the
    relay keeps no entry for those released (it once kept one per message for the link's life)."""
    rule = Rule.model_validate(
        {
            "name": "all",
            "when": {"method": "session/update"},
            "do": {"action": "reorder", "max_ms": 10},
        }
    )
    relay = Relay(engine=FaultEngine([rule], random.Random(1)))
    for number in range(50):
        out = relay.handle(MessageReceived(Side.AGENT, update(number), float(number)))
        for timer in [c for c in out if isinstance(c, StartTimer)]:
            assert numbers(relay.handle(TimerFired(timer.token, number + 0.5))) == [number]
    assert len(relay._reorders.get(Direction.TO_CLIENT, [])) <= 1
