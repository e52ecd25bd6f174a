"""Locating members in raw JSON bytes and splicing values in without touching other bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.splice import (
    MAX_STEPS,
    ScanLimit,
    array_elements,
    find_member,
    member_spans,
    meta_edits,
    splice,
)


def text(raw: bytes, span: tuple[int, int] | None) -> bytes:
    assert span is not None
    return raw[span[0] : span[1]]


class TestMemberSpans:
    def test_finds_a_top_level_member(self) -> None:
        """The span covers exactly the value's bytes."""
        raw = b'{"jsonrpc":"2.0","id":42,"method":"x"}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"42"]

    def test_ignores_nested_members_of_the_same_name(self) -> None:
        """An ``id`` inside params is not the message id."""
        raw = b'{"params":{"id":1,"x":[{"id":2}]},"id":"top"}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b'"top"']

    def test_reports_every_duplicate(self) -> None:
        """Duplicate keys are all found, in order."""
        raw = b'{"id":1, "method":"m", "id" : 2}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"1", b"2"]

    def test_matches_escaped_keys_after_unescaping(self) -> None:
        """``"\\u0069d"`` is the key ``id``."""
        raw = b'{"\\u0069d":7}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"7"]

    def test_skips_strings_holding_structural_characters(self) -> None:
        """Brackets, braces and escaped quotes inside strings do not confuse the scanner."""
        raw = b'{"a":"}{][\\"id\\":","b":{"c":"]"},"id":"x\\"y"}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b'"x\\"y"']

    def test_handles_whitespace_everywhere(self) -> None:
        """Insignificant whitespace around tokens is allowed and excluded from spans."""
        raw = b' \r\n{ "a" : [ 1 , 2 ] ,\t"id"\n:\n-5 } '
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"-5"]

    def test_not_an_object(self) -> None:
        """A non-object has no members."""
        assert member_spans(b"[1,2]", "id") == []
        assert member_spans(b"{}", "id") == []

    @pytest.mark.parametrize(
        "value",
        [b"true", b"null", b"1.5e300", b"123456789012345678901234567890", b'"\\ud800"', b"{}"],
    )
    def test_any_value_kind(self, value: bytes) -> None:
        """Literals, huge numbers, lone surrogate escapes and containers are spanned whole."""
        raw = b'{"id":' + value + b',"z":0}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [value]


class TestFindMember:
    def test_follows_a_path(self) -> None:
        """A nested member is found through its parents."""
        raw = b'{"method":"$/cancel_request","params":{"requestId":"abc"}}'
        assert text(raw, find_member(raw, ("params", "requestId"))) == b'"abc"'

    def test_missing(self) -> None:
        """A missing member, or a path through a non-object, gives None."""
        raw = b'{"params":[{"requestId":1}]}'
        assert find_member(raw, ("params", "requestId")) is None
        assert find_member(raw, ("nope",)) is None


class TestArrayElements:
    def test_spans_each_element(self) -> None:
        """Each element's span is exact, nested arrays included."""
        raw = b'[ {"id":1} ,[2,[3]], "s" ,4]'
        assert [text(raw, s) for s in array_elements(raw)] == [
            b'{"id":1}',
            b"[2,[3]]",
            b'"s"',
            b"4",
        ]

    def test_empty_and_non_arrays(self) -> None:
        """An empty array and a non-array have no elements."""
        assert array_elements(b"[ ]") == []
        assert array_elements(b"{}") == []


class TestSplice:
    def test_replaces_spans_in_any_order(self) -> None:
        """Edits are applied by position, whatever order they are given in."""
        raw = b'{"id":1,"p":{"requestId":22}}'
        first = member_spans(raw, "id")[0]
        second = find_member(raw, ("p", "requestId"))
        assert second is not None
        assert (
            splice(raw, [(second, b'"b"'), (first, b'"a"')]) == b'{"id":"a","p":{"requestId":"b"}}'
        )

    def test_no_edits_returns_the_same_bytes(self) -> None:
        """Without edits the input is returned as it is."""
        raw = b'{"a":1}'
        assert splice(raw, []) is raw

    def test_large_string_values(self) -> None:
        """A multi-megabyte string is skipped whole and the id after it is still found."""
        raw = b'{"params":{"text":"' + b'x\\"' * 1_000_000 + b'"},"id":9}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"9"]


@given(st.text(), st.one_of(st.integers(), st.text()))
def test_any_string_value_is_skipped_exactly(text: str, id_value: int | str) -> None:
    """Whatever a string holds (quotes, backslashes, unicode), the id after it is found whole."""
    encoded_id = json.dumps(id_value).encode()
    for ensure_ascii in (True, False):
        value = json.dumps(text, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
        raw = b'{"params":{"text":' + value + b',"id":"inner"},"id":' + encoded_id + b"}"
        assert [raw[s:e] for s, e in member_spans(raw, "id")] == [encoded_id]
        assert splice(raw, [(member_spans(raw, "id")[0], b"0")]) == raw.replace(
            b'"id":' + encoded_id + b"}", b'"id":0}'
        )


class TestKnownPresentFastPath:
    """``present=True``: the caller parsed the object and knows it has the key."""

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            (b'{"jsonrpc":"2.0","id":42,"method":"x"}', [b"42"]),
            (b'{"result":{"big":"' + b"y" * 10_000 + b'"},"id" : "s"}', [b'"s"']),
            # a second "id" (nested, or inside a string) sends the caller to the walk
            (b'{"params":{"id":1},"id":"top"}', [b'"top"']),
            (b'{"text":"say \\"id","id":5}', [b"5"]),
            (b'{"id":1, "method":"m", "id" : 2}', [b"1", b"2"]),
            # the key spelled with escapes, a literal "id" elsewhere: the walk, not the literal
            (b'{"\\u0069d":7,"p":{"id":8}}', [b"7"]),
            (b'{"i\\u0064":7,"p":{"id":8}}', [b"7"]),
            (b'{"\\u0069\\u0064":7,"p":{"id":8}}', [b"7"]),
            (b'{"\\u0069D":7,"p":{"id":8}}', []),  # the key iD, not id
            # past the quotes hopped one by one, the rest is searched as a whole
            (b'{"id":1,"a":[' + b'"q",' * 100 + b'"q"],"p":{"id":2}}', [b"1"]),
            (b'{"id":1,"a":[' + b'"q",' * 100 + b'"q"],"b":"\\n"}', [b"1"]),
            # past 4 KiB the second occurrence is looked for by hopping from quote to quote
            (b'{"id":1,"a":[' + b'"q",' * 2000 + b'"q"],"p":{"id":2}}', [b"1"]),
            (b'{"id":1,"a":[' + b'"q",' * 2000 + b'"q"],"p":{"di":2}}', [b"1"]),
            # the first "id" is a string value, not a key
            (b'{"method":"id","id":3}', [b"3"]),
            (b'{"method":"id"  ,  "id"  :  3}', [b"3"]),
            # whitespace on either side of the colon: the member's pattern, not the compact test
            (b'{"id": 4}', [b"4"]),
            (b'{"id":\t"t"}', [b'"t"']),
            (b'{"id" :4}', [b"4"]),
            (b'{"id":\r\n4}', [b"4"]),
        ],
    )
    def test_agrees_with_the_walk(self, raw: bytes, expected: list[bytes]) -> None:
        """The fast path finds what walking every member finds, or leaves it to the walk."""
        assert [text(raw, s) for s in member_spans(raw, "id", present=True)] == expected
        assert member_spans(raw, "id", present=True) == member_spans(raw, "id")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["id", "x", "\u0069d", "params"]) | st.text(), children)
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(st.text(max_size=5), _JSON, max_size=4),
    st.one_of(st.integers(), st.text()),
    st.integers(min_value=0, max_value=4),
    st.booleans(),
    st.sampled_from([":", ": ", ":  ", " :", " : ", ":\t", ":\n "]),
)
def test_fast_path_agrees_with_the_walk(
    members: dict[str, object], id_value: int | str, position: int, ascii_only: bool, colon: str
) -> None:
    """Any object holding ``id``, however written (compact, as ``json.dumps`` writes it by
    default, other whitespace around the colons): the fast path and the walk agree."""
    items = [(k, v) for k, v in members.items() if k != "id"]
    items.insert(min(position, len(items)), ("id", id_value))
    body = ",".join(
        json.dumps(k, ensure_ascii=ascii_only) + colon + json.dumps(v, ensure_ascii=ascii_only)
        for k, v in items
    )
    raw = ("{" + body + "}").encode("utf-8", "surrogatepass")
    assert member_spans(raw, "id", present=True) == member_spans(raw, "id")


class TestBounds:
    """A message of any shape costs a bounded, linear walk (DESIGN 10: nothing stalls the loop)."""

    def test_nesting_in_runs_costs_two_steps(self) -> None:
        """6 MB of nesting, opened and closed in runs, is walked in a step each way (the id after
        it is found), and left unclosed it is found unterminated: neither is walked level by level."""
        depth = 3_000_000
        raw = b'{"params":' + b"[" * depth + b"]" * depth + b',"id":3}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"3"]
        with pytest.raises(ValueError, match="unterminated container at byte 10"):
            member_spans(b'{"params":' + b"[" * 2 * depth + b',"id":3}', "id")

    def test_a_run_of_closing_brackets_may_close_more_than_the_value(self) -> None:
        """The value ends at its own closing bracket, inside a run of them."""
        raw = b'{"a":{"params":[[[1]],{"b":[' + b"[" * 10 + b"]" * 10 + b']}]}, "id":2}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b"2"]
        assert text(raw, find_member(raw, ("a", "params"))).endswith(b"]]]}]")

    def test_shallow_containers_cost_no_steps(self) -> None:
        """Millions of small containers, a few levels deep, are skipped by the compiled pattern:
        the walk succeeds although it holds far more containers than the step budget."""
        item = b'{"a":[[],{"b":[1,"]"]}],"c":"x"}'
        count = 3 * MAX_STEPS
        raw = b'{"params":[' + b",".join([item] * count) + b'],"id":"x","p":{"id":0}}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [b'"x"']

    def test_more_steps_than_the_budget_are_refused(self) -> None:
        """Containers nested deeper than the pattern skips, more of them than the budget allows,
        are refused (each of them is a step)."""
        deep = b"[1," * 12 + b"]" * 12
        raw = b'{"params":[' + b",".join([deep] * MAX_STEPS) + b'],"id":1}'
        with pytest.raises(ScanLimit, match=f"more than {MAX_STEPS}") as raised:
            member_spans(raw, "id")
        assert raised.value.keys == {"params"}

    def test_more_members_than_the_budget_are_refused(self) -> None:
        """An object of more top-level members than the budget is refused, not walked."""
        raw = b"{" + b'"a":1,' * MAX_STEPS + b'"id":1}'
        with pytest.raises(ScanLimit):
            member_spans(raw, "id")

    def test_a_long_run_of_backslashes_is_read_in_one_match(self) -> None:
        """A string of millions of escaped backslashes ends where it ends (no step per byte)."""
        value = b'"' + b"\\\\" * 5_000_000 + b'\\""'
        raw = b'{"id":' + value + b',"x":"id"}'
        assert [text(raw, s) for s in member_spans(raw, "id")] == [value]
        assert [text(raw, s) for s in member_spans(raw, "id", present=True)] == [value]


_DEEP_JSON = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab"\\[]{},: \n\u00e9', max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children)
    ),
    max_leaves=40,
)


@given(_DEEP_JSON, st.integers(min_value=0, max_value=20), st.sampled_from([" ", "", "\n\t"]))
def test_any_value_is_spanned_exactly_however_deep(value: object, wrap: int, space: str) -> None:
    """Whatever a value holds and however deep (beyond what the pattern skips at once, in runs
    of brackets or not), its span is exactly its bytes."""
    encoded = json.dumps(value, separators=("," + space, ":" + space)).encode()
    encoded = b"[" * wrap + encoded + b"]" * wrap
    raw = b'{"x":' + encoded + b', "id":1}'
    assert member_spans(raw, "x") == [(5, 5 + len(encoded))]
    assert [text(raw, s) for s in member_spans(raw, "id")] == [b"1"]
    assert array_elements(b"[" + encoded + b"," + encoded + b"]") == [
        (1, 1 + len(encoded)),
        (2 + len(encoded), 2 + 2 * len(encoded)),
    ]


class TestMetaEdits:
    """``meta_edits``: string members set in ``params._meta``, every other byte as it was."""

    FIELDS = (("traceparent", "00-ab-cd-01"), ("tracestate", "k=v"))

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            (
                b'{"id":1,"params":{"a":1}}',
                b'{"id":1,"params":{"_meta":{"traceparent":"00-ab-cd-01","tracestate":"k=v"},"a":1}}',
            ),
            (
                b'{"id":1,"params":{ }}',
                b'{"id":1,"params":{"_meta":{"traceparent":"00-ab-cd-01","tracestate":"k=v"} }}',
            ),
            (
                b'{"id":1,"params":{"_meta":{"traceparent":"old", "x":1e400}}}',
                b'{"id":1,"params":{"_meta":{"tracestate":"k=v","traceparent":"00-ab-cd-01", "x":1e400}}}',
            ),
            (
                b'{"id":1,"params":{"_meta":{}}}',
                b'{"id":1,"params":{"_meta":{"traceparent":"00-ab-cd-01","tracestate":"k=v"}}}',
            ),
            (  # the last duplicate is the one parsers read
                b'{"params":{"a":1},"params":{"_meta":{"traceparent":"x"}}}',
                b'{"params":{"a":1},"params":{"_meta":{"tracestate":"k=v","traceparent":"00-ab-cd-01"}}}',
            ),
        ],
    )
    def test_members_set_in_place(self, raw: bytes, expected: bytes) -> None:
        assert splice(raw, meta_edits(raw, self.FIELDS)) == expected

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"id":1,"params":[1]}',
            b'{"id":1}',
            b'{"id":1,"params":{"_meta":null}}',
            b'{"id":1,"params":{"_meta":"text"}}',
        ],
    )
    def test_nothing_set_where_there_is_no_object_for_it(self, raw: bytes) -> None:
        assert meta_edits(raw, self.FIELDS) == []


@given(
    st.integers(min_value=-(10**60), max_value=10**60) | st.sampled_from([True, False, None]),
    st.sampled_from(["", " ", "\t", "\r\n"]),
    st.sampled_from(["}", ',"x":1}']),
)
def test_a_scalar_ends_where_the_json_says(value: object, space: str, after: str) -> None:
    """A number of any length (stepped byte by byte when short, matched by a pattern past 24
    bytes), ``true``, ``false`` or ``null``, followed by whitespace or what closes it: its span
    is its token, by the fast path and by the walk."""
    token = json.dumps(value)
    raw = ('{"id":' + token + space + after).encode()
    assert [text(raw, s) for s in member_spans(raw, "id", present=True)] == [token.encode()]
    assert member_spans(raw, "id") == member_spans(raw, "id", present=True)
