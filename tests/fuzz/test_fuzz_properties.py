"""The invariants of the proxy's input handling (fuzz/invariants.py) over inputs hypothesis draws.

The atheris targets in ``fuzz/`` check the same invariants, guided by coverage; here they run on
structured inputs (JSON values of every type, messages built from odd tokens, streams cut
anywhere, rule-shaped structures, scripts of both peers) and on every seed of the corpus.
"""

from __future__ import annotations

import json
import re
from typing import Any

import invariants
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.events import Side
from proxy.core.jsonrpc import Batch, Message, parse

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

surrogates = st.characters(categories=["Cs"])
texts = st.text(st.one_of(st.characters(), surrogates), max_size=20)
"""Strings with a fair share of lone surrogates (which JSON can escape and UTF-8 cannot carry)."""

numbers = st.one_of(
    st.integers(),
    st.integers(min_value=10**18, max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.0, 1e300]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
message_keys = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"])
message_like = st.dictionaries(
    st.one_of(message_keys, texts), st.one_of(json_values, st.sampled_from(["m", "initialize"]))
)
"""JSON objects that often have the members of a message, with values of any type."""


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(value: Any, ascii_only: bool) -> bytes:
    """``value`` as JSON: escaped to ASCII, or as UTF-8 (where lone surrogates stay escapes)."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    return LONE_SURROGATE.sub(lambda match: f"\\u{ord(match[0]):04x}", text).encode()


valid_ids = st.one_of(
    st.integers(),
    st.integers(min_value=10**30, max_value=10**400),
    texts,
    st.none(),
).map(lambda value: encode(value, ascii_only=True))


@given(st.binary(max_size=300))
def test_any_bytes_are_classified(data: bytes) -> None:
    """Any bytes: never an exception, and the same reading as the standard library."""
    invariants.check_parse(data)


@given(st.one_of(message_like, st.lists(message_like, max_size=3), json_values), st.booleans())
def test_any_json_value_is_classified_by_key_presence(value: Any, ascii_only: bool) -> None:
    """Objects with or without each member, ids and methods of every type, batches: classified
    as JSON-RPC says; the id kept as its exact bytes. With raw surrogate bytes: not UTF-8."""
    invariants.check_parse(encode(value, ascii_only))
    text = json.dumps(value, ensure_ascii=False)
    invariants.check_parse(text.encode("utf-8", "surrogatepass"))


odd_messages = st.builds(
    invariants.message_bytes,
    st.sampled_from(invariants.ID_TOKENS),
    st.sampled_from(invariants.METHODS),
    params=st.one_of(st.none(), json_values.map(lambda v: encode(v, ascii_only=False))),
    duplicate_id=st.one_of(st.none(), st.sampled_from(invariants.ID_TOKENS)),
    spaced=st.booleans(),
)
"""Messages built from odd tokens: huge, fractional, escaped and duplicate ids, odd methods."""


@given(odd_messages, valid_ids)
def test_messages_of_odd_tokens_are_classified_and_spliced(raw: bytes, new_id: bytes) -> None:
    """A message with a usable id takes any new id and nothing else changes."""
    parsed = invariants.check_parse(raw)
    if isinstance(parsed, Message) and parsed.id_spans:
        invariants.check_splice(parsed, new_id)


@given(message_like, st.booleans(), valid_ids)
def test_any_message_keeps_every_byte_but_its_id(
    value: dict[str, Any], ascii_only: bool, new_id: bytes
) -> None:
    """Splicing the ids the proxy mints or puts back changes the id and nothing else."""
    value = {"jsonrpc": "2.0", **value, "method": "m", "id": 1}
    parsed = parse(encode(value, ascii_only))
    assert isinstance(parsed, Message)
    invariants.check_splice(parsed, new_id)


NASTY = invariants.nasty_messages()
MESSAGE_SEEDS = invariants.corpus("messages")


@pytest.mark.parametrize("data", NASTY, ids=[*MESSAGE_SEEDS, "brackets", "deep", "escapes"])
def test_every_nasty_message_is_classified_and_spliced(data: bytes) -> None:
    """The seed corpus and its giants (100,000 brackets, 600 kB of escapes)."""
    parsed = invariants.check_parse(data)
    elements = parsed.elements if isinstance(parsed, Batch) else (parsed,)
    for element in elements:
        if isinstance(element, Message) and element.id_spans:
            invariants.check_splice(element, b'"\\ud800"')
            invariants.check_splice(element, b"1" + b"0" * 400)


lines = st.lists(
    st.one_of(st.sampled_from(list(MESSAGE_SEEDS.values())), st.binary(max_size=40)),
    max_size=6,
).map(b"\n".join)
line_ends = st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b" ", b""]), max_size=6)


@given(
    st.one_of(st.binary(max_size=400), lines),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    st.integers(min_value=1, max_value=200),
)
def test_line_framing_does_not_depend_on_chunking(data: bytes, cuts: list[int], limit: int) -> None:
    """stdio framing: any cut of the stream gives the lines of a plain split, long ones
    reported as oversized and never buffered whole."""
    invariants.check_line_framer(data, cuts, limit)


sse_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [b"data: {}", b"data:1", b"data", b":", b": ping", b"id: 4", b"", b"retry"]
        ),
        st.binary(max_size=80).map(lambda value: b"data: " + value),
        st.binary(max_size=80),
    ),
    max_size=10,
)


@given(
    st.tuples(st.sampled_from([b"", b"\xef\xbb\xbf"]), sse_lines, line_ends).map(
        lambda parts: (
            parts[0]
            + b"".join(
                line + (parts[2][i % len(parts[2])] if parts[2] else b"\n")
                for i, line in enumerate(parts[1])
            )
        )
    ),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    st.integers(min_value=1, max_value=100),
)
def test_sse_decoding_does_not_depend_on_chunking(data: bytes, cuts: list[int], limit: int) -> None:
    """SSE: any cut of the stream gives the events of the reference reading, over-long lines
    and events dropped as they stream."""
    invariants.check_sse(data, cuts, limit)


SSE_SEEDS = invariants.corpus("sse")


@pytest.mark.parametrize("data", SSE_SEEDS.values(), ids=SSE_SEEDS.keys())
def test_every_seed_stream_decodes_the_same_however_it_is_cut(data: bytes) -> None:
    """The seed streams (a BOM after the first line, comments longer than any event...) cut into
    pieces of every size, with limits below and above their events."""
    for limit in (4, 10, 64, 1000):
        for size in (1, 2, 3, 7, 64):
            invariants.check_sse(data, range(0, len(data), size), limit)


fragments = st.sampled_from(
    [
        "version: 1\n",
        "rules:\n",
        "  - name: a\n",
        "    do: {action: drop}\n",
        "    do: {action: delay, ms: .inf}\n",
        "    do: {action: error, data: !!binary aGk=}\n",
        "    when: {method: '[x', params: {a: [1, {b: null}]}}\n",
        "    schedule: {nth: [], probability: .nan, every: 0}\n",
        "seed: 99999999999999999999999999\n",
        "- [[[[",
        "&a [*a]\n",
        '"\\ud800": 1\n',
        "\t",
        "\ufeff",
    ]
)


@settings(deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(fragments, max_size=8).map("".join)))
def test_any_fault_file_text_loads_or_is_a_located_error(text: str) -> None:
    """Any text: rules that work, or FaultFileError; nothing else."""
    invariants.check_fault_text(text)


rule_values = st.one_of(
    json_values,
    st.sampled_from(["drop", "delay", "error", "sever", "kill_agent", "KILL", "*", "[", 1e308]),
)
rule_like = st.fixed_dictionaries(
    {"name": st.one_of(texts, st.just("r"))},
    optional={
        "when": st.dictionaries(
            st.sampled_from(["method", "session", "kind", "params", "direction"]), rule_values
        ),
        "schedule": st.dictionaries(
            st.sampled_from(["nth", "after", "every", "probability", "stop_ms"]), rule_values
        ),
        "do": st.dictionaries(
            st.sampled_from(["action", "ms", "code", "data", "signal", "status", "mode"]),
            rule_values,
        ),
        "continue": rule_values,
    },
)


@settings(deadline=None)
@given(st.one_of(st.lists(rule_like, max_size=3), json_values))
def test_any_rule_structure_loads_or_is_a_located_error(data: Any) -> None:
    """The control API's rules (any JSON): rules that work, or FaultFileError; nothing else."""
    invariants.check_rules_data(data)


FAULT_FILE_SEEDS = invariants.corpus("faultfiles")


@pytest.mark.parametrize("data", FAULT_FILE_SEEDS.values(), ids=FAULT_FILE_SEEDS.keys())
def test_every_nasty_fault_file_loads_or_is_a_located_error(data: bytes) -> None:
    """The seed fault files: deep nesting, 5000 digits, .inf, sets and binaries, surrogates."""
    invariants.check_fault_text(data.decode("utf-8", "replace"))


sides = st.sampled_from(list(Side))
steps = st.one_of(
    st.builds(invariants.Feed, sides, st.sampled_from(list(MESSAGE_SEEDS.values()))),
    st.builds(invariants.Feed, sides, st.binary(max_size=60)),
    st.builds(invariants.Feed, sides, odd_messages),
    st.builds(
        invariants.Answer,
        sides,
        st.integers(0, 20),
        json_values.map(lambda v: encode(v, ascii_only=False)),
        st.booleans(),
    ),
    st.builds(invariants.Cancel, sides, st.integers(0, 20)),
    st.builds(invariants.TooLarge, sides, st.integers(1025, 10**9)),
    st.builds(invariants.Fire, st.integers(0, 20)),
)
scripts = st.builds(
    invariants.Script,
    st.lists(steps, max_size=25).map(tuple),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["stdio", "http", "ws"]),
)


@SLOW
@given(scripts)
def test_any_script_of_both_peers_leaves_the_link_working(script: invariants.Script) -> None:
    """Garbage, odd ids, answers, cancels and faults from both sides: the relay and every
    observer of a run take them, relayed messages differ only in their id, and a request and
    its answer still cross the link both ways."""
    lab = invariants.check_relay(script)
    assert lab.probes == 2 or lab.gone  # probed, unless a fault rule severed a side


@SLOW
@given(scripts, sides)
def test_a_peer_hanging_up_mid_script_is_never_an_exception(
    script: invariants.Script, side: Side
) -> None:
    """Hang-ups anywhere: pending requests are abandoned, never answered falsely or crashed on."""
    middle = len(script.steps) // 2
    steps = (*script.steps[:middle], invariants.Hangup(side), *script.steps[middle:])
    invariants.check_relay(
        invariants.Script(steps, script.strict, script.faults, script.downstream)
    )


notifications = st.builds(
    invariants.message_bytes,
    st.none(),
    st.sampled_from(invariants.METHODS),
    params=st.one_of(
        st.none(),
        json_values.map(lambda v: encode(v, ascii_only=False)),
        st.builds(
            lambda session, inner, request: (
                b'{"sessionId":'
                + session
                + b',"method":'
                + inner
                + b',"requestId":'
                + request
                + b"}"
            ),
            st.sampled_from([b'"s1"', b'"s2"', b"7", b"null"]),
            st.sampled_from(invariants.METHODS),
            st.sampled_from(invariants.ID_TOKENS),
        ),
    ),
    spaced=st.booleans(),
)
"""Notifications of every method (cancels and successor envelopes among them), with sessions."""
fast_path_scripts = st.builds(
    invariants.Script,
    st.lists(st.one_of(steps, st.builds(invariants.Feed, sides, notifications)), max_size=30).map(
        tuple
    ),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["stdio", "http", "ws"]),
)


@SLOW
@given(fast_path_scripts)
def test_the_fast_path_changes_nothing(script: invariants.Script) -> None:
    """Valid, invalid and batched messages, huge ids, cancels, answers and faults, run through
    the relay with its fast path and without it: the same bytes to the same sides in the same
    order, the same observations (each with its message), counts and ledger."""
    invariants.check_fast_path(script)


@SLOW
@given(fast_path_scripts)
def test_messages_read_together_are_relayed_as_each_alone(script: invariants.Script) -> None:
    """The messages each side sends in a row, fed as one burst (the lines of one read) through
    the fast path: the same bytes to the same sides in the same order, the same observations,
    counts and ledger as each message fed alone through the full path."""
    invariants.check_bursts(script)


RELAY_SEEDS = invariants.corpus("relay")


@pytest.mark.parametrize("data", RELAY_SEEDS.values(), ids=RELAY_SEEDS.keys())
def test_every_seed_script_leaves_the_link_working(data: bytes) -> None:
    """The relay target's seeds, each a conversation with bad input in it."""
    invariants.check_relay(invariants.read_script(data))
