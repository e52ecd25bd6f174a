"""What a parsing worker sends back for a large message: its parse without its bytes, bounded.

The relay must decide about a compacted message exactly as about the message itself (same ids,
same forwarding, same findings), while the copy of its body stays bounded whatever it holds.
"""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import replace
from typing import Any

import pytest
from json_values import values_in

from proxy.core.commands import Send
from proxy.core.compact import (
    MAX_DEPTH,
    MAX_STRING,
    MAX_VALUES,
    Elided,
    parse_compacted,
    restore,
)
from proxy.core.engine import FaultEngine, matches_params
from proxy.core.events import MessageReceived, Side
from proxy.core.faultfile import Rule
from proxy.core.jsonrpc import Batch, Invalid, InvalidReason, Message, parse
from proxy.core.ledger import Ledger, prompt_hash
from proxy.core.observations import Observation
from proxy.core.relay import Relay


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def prompt(text: str, request_id: int = 1, key: str | None = "K1") -> bytes:
    params: dict[str, Any] = {"sessionId": "S", "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return encode(
        {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
    )


def worker(raw: bytes) -> Message | Batch | Invalid:
    """``raw`` parsed as a worker parses it, across a pickle as across the process boundary."""
    return restore(pickle.loads(pickle.dumps(parse_compacted(raw))), raw)


@pytest.mark.parametrize(
    "raw",
    [
        prompt("hello"),
        encode({"jsonrpc": "2.0", "id": "a", "result": {"stopReason": "end_turn"}}),
        encode({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "S"}}),
        b'{"jsonrpc":"2.0","id":1,"method":"m","id":2}',
        b'[{"jsonrpc":"2.0","id":1,"method":"a"}, 7, {"jsonrpc":"2.0","method":"b"}]',
        b'{"jsonrpc":"2.0","id":1,"method":',
        b'{"jsonrpc":"2.0","id":1.5,"result":0}',
        b"\xef\xbb\xbf" + prompt("bom"),
        b"[" * 2000 + b"]" * 2000,
    ],
)
def test_a_small_message_parses_the_same_in_a_worker(raw: bytes) -> None:
    """Within the bounds, the worker's parse is the parse (a digest aside)."""
    direct = parse(raw)
    compacted = worker(raw)
    if isinstance(direct, Message):
        assert isinstance(compacted, Message)
        assert compacted.content_digest == (
            prompt_hash(direct.params["prompt"]) if direct.method == "session/prompt" else None
        )
        compacted = replace(compacted, content_digest=None)
    assert compacted == direct
    if isinstance(direct, Batch):
        assert isinstance(compacted, Batch)
        assert [element.raw for element in compacted.elements] == [
            element.raw for element in direct.elements
        ]


def test_a_body_past_its_bounds_is_kept_in_part() -> None:
    """Long strings and keys, deep nesting and values past the count become Elided."""
    deep: Any = "bottom"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    params = {
        "sessionId": "S",
        "long": "x" * (MAX_STRING + 1),
        "fits": "y" * MAX_STRING,
        "wide": [[] for _ in range(MAX_VALUES + 1)],
        "deep": deep,
        "keyed": {"k" * (MAX_STRING + 1): 1},
    }
    raw = encode({"jsonrpc": "2.0", "id": 3, "method": "m", "params": params})
    message = worker(raw)
    assert isinstance(message, Message)
    assert message.raw == raw
    assert message.session == "S"
    assert message.id_token == b"3"
    kept = message.params
    assert kept["long"] == Elided("string", MAX_STRING + 1)
    assert kept["fits"] == params["fits"]
    assert kept["wide"] == Elided("array", MAX_VALUES + 1)
    assert kept["keyed"] == Elided("object", 1)
    level = kept["deep"]
    depth = 2  # the body, then params
    while isinstance(level, list):
        level, depth = level[0], depth + 1
    assert level == Elided("array", 1)
    assert depth == MAX_DEPTH


def test_no_compacted_body_holds_more_than_its_bound_of_values() -> None:
    """However the values are spread (many arrays each under the bound), the copy is bounded."""
    params = {"sessionId": "S", "rows": [[1, 2, 3] for _ in range(MAX_VALUES)]}
    message = worker(encode({"jsonrpc": "2.0", "method": "m", "params": params}))
    assert isinstance(message, Message)
    assert values_in(message.body) <= MAX_VALUES + 1


def test_an_elided_value_matches_no_pattern() -> None:
    """A params pattern that names a value the worker left out does not match it."""
    assert not matches_params("x" * 10, Elided("string", 10))
    assert not matches_params({"a": 1}, Elided("object", 1))
    assert not matches_params([1], Elided("array", 1))
    assert not matches_params(None, Elided("array", 0))


def _relay_and_ledger() -> tuple[Relay, Ledger, list[Observation]]:
    rule = Rule.model_validate(
        {
            "name": "first-prompt",
            "when": {"method": "session/prompt", "params": {"sessionId": "S"}},
            "schedule": {"nth": [1]},
            "do": {"action": "drop"},
        }
    )
    emitted: list[Observation] = []
    ledger = Ledger(lambda: 0.0, emit=lambda observation, link: emitted.append(observation))
    relay = Relay(engine=FaultEngine([rule], random.Random(1)))
    return relay, ledger, emitted


def _run(raws: list[tuple[Side, bytes]], *, in_worker: bool) -> tuple[list[bytes], Ledger]:
    relay, ledger, _ = _relay_and_ledger()
    sent: list[bytes] = []
    for side, raw in raws:
        parsed = worker(raw) if in_worker else None
        for command in relay.handle(MessageReceived(side, raw, 0.0, parsed)):
            if isinstance(command, Observation):
                ledger.observe(command, 1)
            elif isinstance(command, Send):
                sent.append(command.data)
    return sent, ledger


def test_the_relay_and_the_ledger_see_a_large_prompt_as_they_see_it_whole() -> None:
    """A prompt too long to copy (dropped by a rule matching its params), its retry, and the
    Agent's two inserts of it: relayed alike, and the duplicate insert found alike (the digest
    covers the whole prompt)."""
    text = "p" * (MAX_STRING * 3)
    inserted = {
        "sessionUpdate": "user_message",
        "content": [{"type": "text", "text": text}],
    }

    def insert(message_id: str) -> bytes:
        update = {**inserted, "messageId": message_id}
        params = {"sessionId": "S", "update": update}
        return encode({"jsonrpc": "2.0", "method": "session/update", "params": params})

    raws = [
        (Side.CLIENT, prompt(text, 1)),
        (Side.CLIENT, prompt(text, 2)),
        (Side.AGENT, insert("M1")),
        (Side.AGENT, insert("M2")),
    ]
    whole, whole_ledger = _run(raws, in_worker=False)
    compacted, compacted_ledger = _run(raws, in_worker=True)
    assert compacted == whole
    assert len(whole) == 3  # the first prompt dropped
    assert [f["check"] for f in compacted_ledger.findings] == ["duplicate_insert"]
    assert compacted_ledger.findings == whole_ledger.findings
    assert compacted_ledger.summary() == whole_ledger.summary()


def test_a_worker_that_could_not_parse_it_is_answered_as_too_complex() -> None:
    """The shell's answer for a message whose worker died: never forwarded, its sender told."""
    raw = prompt("x")
    lost = Invalid(raw, InvalidReason.TOO_COMPLEX, "too complex to relay: the worker was lost")
    relay = Relay()
    commands = relay.handle(MessageReceived(Side.CLIENT, raw, 0.0, lost))
    sent = [c for c in commands if isinstance(c, Send)]
    assert [c.to for c in sent] == [Side.CLIENT]
    assert b"too complex" in sent[0].data
