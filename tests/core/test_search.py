"""The substring search: always the answer of ``needle in data``, for short and long texts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.search import MEMMEM_FROM, contains


@given(
    prefix=st.binary(max_size=64),
    needle=st.binary(max_size=16),
    suffix=st.binary(max_size=64),
    padding=st.sampled_from([0, MEMMEM_FROM - 1, MEMMEM_FROM, 3 * MEMMEM_FROM]),
    present=st.booleans(),
)
def test_contains_is_in(
    prefix: bytes, needle: bytes, suffix: bytes, padding: int, present: bool
) -> None:
    filler = b'"\x00' * (padding // 2)  # quotes and NUL bytes: JSON's commonest, C's terminator
    data = filler + prefix + (needle if present else b"") + suffix
    assert contains(data, needle) is (needle in data)


def test_a_needle_at_the_very_end_or_start_of_a_long_text_is_found() -> None:
    data = b"x" * (2 * MEMMEM_FROM)
    assert contains(data + b'"tool_call"', b'"tool_call"')
    assert contains(b'"tool_call"' + data, b'"tool_call"')
    assert not contains(data + b'"tool_call', b'"tool_call"')
    assert not contains(data, data + b"x")  # longer than the text
