"""``timeout``: from the message on, nothing goes on in its direction; after ``ms`` the
connection to ``side`` is cut and what was held is lost (Toxiproxy's ``timeout``)."""

from __future__ import annotations

import random

import pytest
from action_lab import fault
from pydantic import ValidationError

from proxy.core.actions.base import Freeze
from proxy.core.actions.timeout import ACTION, Timeout
from proxy.core.commands import Send, Sever, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.observations import StallEnded, Undeliverable
from proxy.core.relay import Relay

PROMPT = b'{"jsonrpc":"2.0","id":"p","method":"session/prompt","params":{"sessionId":"S"}}'
LATER = b'{"jsonrpc":"2.0","method":"_x/later","params":{}}'


def test_the_action_is_a_freeze_that_cuts() -> None:
    params = Timeout(action="timeout", ms=500, side="agent", close_code=4000)
    assert ACTION.apply(params, fault()) == [Freeze(0.5, sever="agent", close_code=4000)]
    with pytest.raises(ValidationError):
        Timeout(action="timeout", ms=5, close_code=1005)  # reserved, never sent


def test_what_was_held_is_lost_when_the_connection_is_cut() -> None:
    """The prompt and what follows it toward the Agent are held; after ``ms`` both sides are
    cut (nothing flushed) and the held messages are undeliverable: the Agent never saw them."""
    rule = Rule.model_validate(
        {
            "name": "hang-up",
            "when": {"method": "session/prompt"},
            "do": {"action": "timeout", "ms": 200},
        }
    )
    relay = Relay(engine=FaultEngine([rule], random.Random(1)))
    started = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    assert not [c for c in started if isinstance(c, Send)]
    end = next(c for c in started if isinstance(c, StartTimer))
    assert end.delay == 0.2
    assert not [
        c for c in relay.handle(MessageReceived(Side.CLIENT, LATER, 0.1)) if isinstance(c, Send)
    ]
    ended = relay.handle(TimerFired(end.token, 0.2))
    assert [c for c in ended if isinstance(c, Sever)] == [
        Sever(Side.CLIENT, False, 1001),
        Sever(Side.AGENT, False, 1001),
    ]
    assert not [c for c in ended if isinstance(c, Send)]
    [stall] = [c for c in ended if isinstance(c, StallEnded)]
    assert (stall.rule, stall.held, stall.cut) == ("hang-up", 2, (Side.CLIENT, Side.AGENT))
    lost = [c for c in ended if isinstance(c, Undeliverable)]
    assert [(u.method, u.hold is not None) for u in lost] == [
        ("session/prompt", True),
        ("_x/later", True),
    ]


def test_what_was_held_is_lost_even_when_the_side_cut_is_the_other() -> None:
    """``side: agent`` on the Agent's answer toward the Client: the answer is held, and when the
    Agent's connection is cut it is lost too (undeliverable), though the Client's stays open."""
    rule = Rule.model_validate(
        {
            "name": "hang-up",
            "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
            "do": {"action": "timeout", "ms": 200, "side": "agent"},
        }
    )
    relay = Relay(engine=FaultEngine([rule], random.Random(1)))
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    answer = b'{"jsonrpc":"2.0","id":0,"result":{"stopReason":"end_turn"}}'
    started = relay.handle(MessageReceived(Side.AGENT, answer, 0.1))
    assert not [c for c in started if isinstance(c, Send)]
    end = next(c for c in started if isinstance(c, StartTimer))
    ended = relay.handle(TimerFired(end.token, 0.3))
    assert [c for c in ended if isinstance(c, Sever)] == [Sever(Side.AGENT, False, 1001)]
    assert not [c for c in ended if isinstance(c, Send)]
    assert [u.method for u in ended if isinstance(u, Undeliverable)] == ["session/prompt"]
