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


def cutting(**when: object) -> Relay:
    rule = Rule.model_validate(
        {"name": "cut", "when": when, "do": {"action": "truncate", "bytes": 20}}
    )
    return Relay(engine=FaultEngine([rule], random.Random(1)))


def test_a_cut_with_nothing_to_send_closes_nothing() -> None:
    """An answer to no request (an orphan) forwards nothing: there is nothing to cut, and the
    connection toward the Client stays open for what follows."""
    relay = cutting(kind="response")
    orphan = b'{"jsonrpc":"2.0","id":99,"result":{}}'
    assert [
        c
        for c in relay.handle(MessageReceived(Side.AGENT, orphan, 0.0))
        if isinstance(c, SendCut | Send)
    ] == []
    later = relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.1))
    assert [c.to for c in later if isinstance(c, Send)] == [Side.CLIENT]


def test_a_cut_in_a_batch_sends_the_elements_before_it_and_none_after() -> None:
    """Elements 1 and 2 go first (as a batch), element 3 is cut short, element 4 never goes."""
    relay = cutting(method="x/cut")
    batch = (
        b'[{"jsonrpc":"2.0","method":"x/a"},{"jsonrpc":"2.0","method":"x/b"},'
        b'{"jsonrpc":"2.0","method":"x/cut","params":{"long":"enough to be cut"}},'
        b'{"jsonrpc":"2.0","method":"x/d"}]'
    )
    out = relay.handle(MessageReceived(Side.AGENT, batch, 0.0))
    sent = [c for c in out if isinstance(c, Send | SendCut)]
    assert [type(c) for c in sent] == [Send, SendCut]
    first = sent[0]
    assert isinstance(first, Send)
    assert first.data == b'[{"jsonrpc":"2.0","method":"x/a"},{"jsonrpc":"2.0","method":"x/b"}]'
    [never] = [c for c in out if isinstance(c, Undeliverable)]
    assert never.size == len(b'{"jsonrpc":"2.0","method":"x/d"}')
