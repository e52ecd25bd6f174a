"""A message's parse cost is told from its bytes: a long text is proven light by its strings,
and nothing that holds many values is ever taken for light (its escaped quotes included)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st
from json_values import values_in

from proxy.core.parse_cost import QUOTES_SCANNED, few_values, value_count


def prompt(text: str) -> bytes:
    params = {"sessionId": "S", "prompt": [{"type": "text", "text": text}]}
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": params})


def test_a_long_text_is_proven_light_by_its_strings() -> None:
    assert few_values(prompt("x" * 200_000), 4096)
    assert few_values(prompt('say "hi" \\ ' * 3), 4096)  # escaped quotes and backslashes
    image = {"type": "image", "mimeType": "image/png", "data": "QUJD" * 50_000}
    assert few_values(orjson.dumps({"params": {"prompt": [image]}}), 4096)


def test_many_values_are_never_proven_light() -> None:
    empties = b'{"params":[' + b",".join([b"[]"] * 30_000) + b"]}"
    assert not few_values(empties, 4096)
    numbers = b'{"text":"' + b"x" * 100_000 + b'","n":[' + b"1," * 5000 + b"1]}"
    assert not few_values(numbers, 4096)  # a long text first hides nothing after it


def test_an_escaped_quote_does_not_end_a_string() -> None:
    """Read as the end of the string, the escaped quote would put the containers after it
    inside a string; JSON reads them as containers."""
    hidden = b'{"a":"\\"", "b":[' + b",".join([b"[]"] * 3000) + b'], "c":"\\\\"}'
    assert values_in(json.loads(hidden)) > 3000
    assert not few_values(hidden, 4096)
    # An even run of backslashes ends the string: what follows is outside it.
    assert not few_values(b'{"a":"\\\\", "b":[' + b"0," * 3000 + b'0], "c":""}', 4096)


def test_it_gives_up_after_its_quotes_and_the_count_decides() -> None:
    many_strings = orjson.dumps({"items": [{"name": f"n{n}"} for n in range(100)]})
    assert not few_values(many_strings, 1_000_000)  # light, but not proven within 64 quotes
    assert few_values(many_strings, 1_000_000, quotes=1000)
    escapes = orjson.dumps({"t": 'a"' * 100})
    assert not few_values(escapes, 4096)  # each escaped quote is one quote looked at
    assert value_count(many_strings) == 2 + 100 + 99  # { [, a { per item, a , between


def test_what_is_not_json_is_never_taken_for_heavier_than_its_bytes() -> None:
    assert few_values(b'{"never closed: ' + b"[]," * 10_000, 4096)  # refused at the string
    assert not few_values(b"[]," * 10_000, 4096)
    assert few_values(b"", 1)
    assert not few_values(b"12", 2)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(alphabet=st.sampled_from('ab"\\\n,[{}]: \u00e9')),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(alphabet=st.sampled_from('k"\\,[')), children, max_size=6)
    ),
    max_leaves=60,
)


@given(json_values, st.integers(min_value=1, max_value=80), st.sampled_from([2, 8, 64]))
def test_a_message_proven_light_holds_fewer_values_than_the_bound(
    value: Any, bound: int, quotes: int
) -> None:
    for data in (orjson.dumps(value), json.dumps(value, indent=1).encode()):
        if few_values(data, bound, quotes):
            assert values_in(value) < bound + quotes // 2


def test_the_count_counts_the_bytes_that_open_or_separate_values() -> None:
    assert value_count(b'{"a":[1,2,{"b":"x,y"}]}') == 6
    assert value_count(b"") == 0
    assert QUOTES_SCANNED == 64
