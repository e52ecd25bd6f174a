"""``slice``: the message written in pieces of about ``average_size`` bytes, ``gap_us`` apart;
the core draws the sizes and marks the message's send, the transports cut and pace it."""

from __future__ import annotations

import json
import random

from action_lab import PROMPT, fault

from proxy.core.actions.base import Split
from proxy.core.actions.slice import ACTION, FRAMING_BYTES, MAX_PIECES, Slice, notes
from proxy.core.commands import Command, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.relay import Relay


def params(**fields: int) -> Slice:
    return Slice.model_validate({"action": "slice", **fields})


def test_the_sizes_cover_the_message_and_its_framing() -> None:
    [split] = ACTION.apply(params(average_size=10, gap_us=250), fault())
    assert isinstance(split, Split)
    assert split.gap == 0.00025
    assert set(split.sizes) == {10}
    assert sum(split.sizes) >= len(PROMPT) + FRAMING_BYTES > sum(split.sizes[:-1])


def test_the_sizes_vary_within_bounds_and_the_seed_decides_them() -> None:
    slicing = params(average_size=8, size_variation=5)
    first = ACTION.apply(slicing, fault(seed=4))
    assert first == ACTION.apply(slicing, fault(seed=4))
    assert first != ACTION.apply(slicing, fault(seed=5))
    [split] = first
    assert isinstance(split, Split)
    assert all(3 <= size <= 13 for size in split.sizes)
    assert len(set(split.sizes)) > 1


def test_a_piece_is_never_empty_and_a_huge_message_stops_at_max_pieces() -> None:
    huge = json.dumps({"jsonrpc": "2.0", "method": "x", "params": {"p": "x" * 10_000}})
    [split] = ACTION.apply(params(average_size=1, size_variation=3), fault(huge.encode()))
    assert isinstance(split, Split)
    assert min(split.sizes) >= 1
    assert len(split.sizes) == MAX_PIECES


def test_a_variation_as_large_as_the_size_is_noted() -> None:
    assert notes(params(average_size=4, size_variation=4))
    assert notes(params(average_size=4, size_variation=3)) == []


def slicing(**do: object) -> Relay:
    rules = [
        Rule.model_validate(
            {
                "name": "pieces",
                "when": {"method": "session/update"},
                "do": {"action": "slice", "average_size": 16, "gap_us": 1000},
                "continue": True,
            }
        )
    ]
    if do:
        rules.append(
            Rule.model_validate({"name": "more", "when": {"method": "session/update"}, "do": do})
        )
    return Relay(engine=FaultEngine(rules, random.Random(1)))


UPDATE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","n":1}}'


def sends(commands: list[Command]) -> list[Send]:
    return [c for c in commands if isinstance(c, Send)]


def test_the_send_of_the_message_carries_its_pieces_and_what_follows_is_whole() -> None:
    relay = slicing()
    [send] = sends(relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.0)))
    assert (send.to, send.data, send.gap) == (Side.CLIENT, UPDATE, 0.001)
    assert set(send.pieces) == {16}
    other = b'{"jsonrpc":"2.0","method":"_x/other","params":{}}'
    assert sends(relay.handle(MessageReceived(Side.AGENT, other, 0.0))) == [
        Send(Side.CLIENT, other)
    ]


def test_copies_go_whole_after_the_message_in_pieces() -> None:
    relay = slicing(action="duplicate", copies=2)
    out = sends(relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.0)))
    assert [bool(s.pieces) for s in out] == [True, False, False]
    assert {s.data for s in out} == {UPDATE}


def test_a_held_message_is_written_in_pieces_when_its_timer_fires() -> None:
    relay = slicing(action="delay", ms=10)
    held = relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.0))
    assert sends(held) == []
    [timer] = [c for c in held if isinstance(c, StartTimer)]
    [send] = sends(relay.handle(TimerFired(timer.token, 0.01)))
    assert send.pieces
    assert send.data == UPDATE


def test_a_truncated_message_is_cut_not_sliced() -> None:
    relay = slicing(action="truncate", bytes=10)
    assert sends(relay.handle(MessageReceived(Side.AGENT, UPDATE, 0.0))) == []


def test_an_element_of_a_batch_goes_whole_with_its_batch() -> None:
    relay = slicing()
    batch = b"[" + UPDATE + b"," + UPDATE + b"]"
    [send] = sends(relay.handle(MessageReceived(Side.AGENT, batch, 0.0)))
    assert (send.data, send.pieces) == (batch, ())
