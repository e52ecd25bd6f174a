"""``slow_close``: once the rule fired on a message, the close of the connection toward the peer
the message went to reaches it ``ms`` late; until then what goes there still goes."""

from __future__ import annotations

import random

from action_lab import fault

from proxy.core.actions.base import CloseLate
from proxy.core.actions.slow_close import ACTION, SlowClose
from proxy.core.commands import Close, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, PeerClosed, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.observations import Relayed
from proxy.core.relay import Relay

MARK = b'{"jsonrpc":"2.0","method":"_x/mark","params":{}}'
LATE = b'{"jsonrpc":"2.0","method":"_x/late","params":{}}'


def relay() -> Relay:
    rules = [
        Rule.model_validate(
            {
                "name": "linger",
                "when": {"direction": "to_client", "method": "_x/mark"},
                "do": {"action": "slow_close", "ms": 200},
            }
        ),
        Rule.model_validate(
            {
                "name": "behind",
                "when": {"direction": "to_client", "method": "_x/late"},
                "do": {"action": "delay", "ms": 100},
            }
        ),
    ]
    return Relay(engine=FaultEngine(rules, random.Random(1)))


def test_the_action_is_a_slow_close() -> None:
    params = SlowClose(action="slow_close", ms=250)
    assert ACTION.apply(params, fault()) == [CloseLate(0.25)]


def test_the_end_of_the_agent_reaches_the_client_late_and_what_was_held_still_goes() -> None:
    """The marked message goes on as it came. When the Agent's stream ends, the Client's
    connection is closed only when ``ms`` is up: a message delayed toward the Client before the
    end still reaches it meanwhile, then the close comes."""
    target = relay()
    assert [
        c.data for c in target.handle(MessageReceived(Side.AGENT, MARK, 0.0)) if isinstance(c, Send)
    ] == [MARK]
    delayed = target.handle(MessageReceived(Side.AGENT, LATE, 0.01))
    [late_timer] = [c for c in delayed if isinstance(c, StartTimer)]
    ended = target.handle(PeerClosed(Side.AGENT, 0.02))
    assert not [c for c in ended if isinstance(c, Close)]
    [close_timer] = [c for c in ended if isinstance(c, StartTimer)]
    assert close_timer.delay == 0.2
    sent = target.handle(TimerFired(late_timer.token, 0.11))
    assert [c.data for c in sent if isinstance(c, Send)] == [LATE]
    assert [c for c in sent if isinstance(c, Relayed)]
    assert target.handle(TimerFired(close_timer.token, 0.22)) == [Close(Side.CLIENT)]


def test_without_the_rule_firing_the_close_comes_at_once() -> None:
    target = relay()
    assert Close(Side.CLIENT) in target.handle(PeerClosed(Side.AGENT, 0.0))
