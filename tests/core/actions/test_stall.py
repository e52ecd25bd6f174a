"""``stall``: from the message on, nothing goes on in its direction for ``ms`` (or until the
control API releases it), the other direction flows; then what was held goes on, in order."""

from __future__ import annotations

import json
import random

from action_lab import fault

from proxy.core.actions.base import Freeze
from proxy.core.actions.stall import ACTION, Stall
from proxy.core.commands import Command, ForgetTimer, Send, SendRun, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import BurstReceived, MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.observations import FaultInjected, Held, Relayed, RelayedRun, StallEnded
from proxy.core.relay import Relay


def update(number: int) -> bytes:
    params = {"sessionId": "S", "update": {"sessionUpdate": "agent_message_chunk", "n": number}}
    return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}).encode()


STOP = b'{"jsonrpc":"2.0","method":"_x/stop","params":{}}'
ASK = b'{"jsonrpc":"2.0","id":"q","method":"_x/ask","params":{}}'


def stalling(action: str = "stall", **fields: object) -> Relay:
    rule = Rule.model_validate(
        {
            "name": "quiet",
            "when": {"direction": "to_client", "method": "_x/stop"},
            "do": {"action": action, "ms": 100, **fields},
        }
    )
    return Relay(engine=FaultEngine([rule], random.Random(1)))


def to_client(commands: list[Command]) -> list[bytes]:
    """What the Client is sent, in order."""
    out: list[bytes] = []
    for command in commands:
        if isinstance(command, Send) and command.to is Side.CLIENT:
            out.append(command.data)
        elif isinstance(command, SendRun) and command.to is Side.CLIENT:
            out.extend(command.data)
    return out


def test_the_action_is_a_freeze_that_lets_go() -> None:
    assert ACTION.apply(Stall(action="stall", ms=250), fault()) == [Freeze(0.25)]


def test_nothing_goes_on_in_the_direction_until_the_stall_ends_then_all_in_order() -> None:
    """The message that started it and everything after it in its direction (a notification no
    rule matches, a burst of them) are held, observed held; the Client's request reaches the
    Agent meanwhile; when the stall ends, they go on in the order they came, each relayed then;
    the next message passes at once."""
    relay = stalling()
    assert to_client(relay.handle(MessageReceived(Side.AGENT, update(1), 0.0))) == [update(1)]
    started = relay.handle(MessageReceived(Side.AGENT, STOP, 0.01))
    assert to_client(started) == []
    assert [c.rule for c in started if isinstance(c, FaultInjected)] == ["quiet"]
    end, hold = [c for c in started if isinstance(c, StartTimer)]
    assert end.fault
    assert end.delay == 0.1
    held = relay.handle(MessageReceived(Side.AGENT, update(2), 0.02))
    assert to_client(held) == []
    assert [c.rules for c in held if isinstance(c, Held)] == [("quiet",)]
    left, burst = [update(3), update(4)], []
    while left:  # each alone, as the link feeds what the relay did not take
        commands, taken = relay.handle_burst(BurstReceived(Side.AGENT, left, 0.03))
        burst += commands
        left = left[taken:]
    assert to_client(burst) == []
    assert not [c for c in burst if isinstance(c, RelayedRun)]
    asked = relay.handle(MessageReceived(Side.CLIENT, ASK, 0.04))
    assert [c.to for c in asked if isinstance(c, Send)] == [Side.AGENT]  # the other way flows
    [later] = [c for c in held if isinstance(c, StartTimer)]
    # The shell's clock may fire a later message's hold before the stall's end: it waits.
    assert relay.handle(TimerFired(later.token, 0.1)) == []
    released = relay.handle(TimerFired(end.token, 0.11))
    assert to_client(released) == [STOP, update(2), update(3), update(4)]
    [ended] = [c for c in released if isinstance(c, StallEnded)]
    assert (ended.rule, ended.held, ended.released, ended.cut) == ("quiet", 4, False, ())
    assert len([c for c in released if isinstance(c, Relayed)]) == 4
    assert relay.handle(TimerFired(hold.token, 0.11)) == []  # released with the stall already
    assert to_client(relay.handle(MessageReceived(Side.AGENT, update(5), 0.12))) == [update(5)]


def test_the_control_api_releases_a_stall_early() -> None:
    """``release_stalls``: what the stall held goes on now, and the timers it leaves behind are
    named, so the shell forgets them; a stall released is over."""
    relay = stalling()
    started = relay.handle(MessageReceived(Side.AGENT, STOP, 0.0))
    timers = {c.token for c in started if isinstance(c, StartTimer)}
    relay.handle(MessageReceived(Side.AGENT, update(1), 0.01))
    released = relay.release_stalls(0.02)
    assert to_client(released) == [STOP, update(1)]
    assert [(c.held, c.released) for c in released if isinstance(c, StallEnded)] == [(2, True)]
    assert timers <= {c.token for c in released if isinstance(c, ForgetTimer)}
    assert to_client(relay.handle(MessageReceived(Side.AGENT, update(2), 0.03))) == [update(2)]
    assert relay.release_stalls(0.04) == []
