"""``truncate``: the first ``bytes`` of a message forwarded, then the connection toward its peer
severed; nothing reaches that peer afterwards."""

from __future__ import annotations

import random

from action_lab import fault

from proxy.core.actions.base import CutShort
from proxy.core.actions.truncate import ACTION, Truncate
from proxy.core.commands import Command, Send, SendCut
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, Side
from proxy.core.faultfile import Rule
from proxy.core.observations import Relayed, Undeliverable
from proxy.core.relay import Relay

UPDATE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","update":{}}}'


def test_the_action_cuts_at_its_bytes() -> None:
    assert ACTION.apply(Truncate(action="truncate", bytes=10), fault()) == [CutShort(10)]


def test_the_peer_gets_the_start_then_nothing() -> None:
    """The cut message is observed relayed (it left, cut short); the connection toward the
    Client is then closed to every later message."""
    rule = Rule.model_validate(
        {
            "name": "cut",
            "when": {"method": "session/update"},
            "do": {"action": "truncate", "bytes": 20},
        }
    )
    relay = Relay(engine=FaultEngine([rule], random.Random(1)))
    out: list[Command] = relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.0))
    assert [c for c in out if isinstance(c, SendCut)] == [SendCut(Side.CLIENT, UPDATE, 20)]
    assert [c for c in out if isinstance(c, Send)] == []
    assert [c for c in out if isinstance(c, Relayed)]
    later = relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.1))
    assert [c for c in later if isinstance(c, Send)] == []
    assert [c for c in later if isinstance(c, Undeliverable)]
