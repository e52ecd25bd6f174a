"""Newline framing with a size limit, fed in arbitrary chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import framing
from proxy.core.framing import LineFramer, Oversized


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes | Oversized]:
    out: list[bytes | Oversized] = []
    for chunk in chunks:
        out += framer.feed(chunk)
    return out + framer.eof()


def test_splits_lines_across_chunks() -> None:
    """Messages split over chunk boundaries come out whole, in order."""
    data = b'{"a":1}\n{"b":2}\n{"c":3}\n'
    for size in (1, 2, 5, 100):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert feed_all(LineFramer(100), chunks) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


def test_skips_blank_lines() -> None:
    """Empty and whitespace-only lines are not messages."""
    assert feed_all(LineFramer(100), [b"\n \n\r\n{}\n\t\n"]) == [b"{}"]


def test_keeps_carriage_returns_inside_the_message() -> None:
    """A CRLF line keeps its CR (JSON whitespace), so bytes are forwarded untouched."""
    assert feed_all(LineFramer(100), [b"{}\r\n"]) == [b"{}\r"]


def test_delivers_an_unterminated_last_line_at_eof() -> None:
    """A peer that ends without a final newline still has its last message delivered."""
    framer = LineFramer(100)
    assert framer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert framer.feed(b":2}") == []
    assert framer.eof() == [b'{"b":2}']


def test_oversized_line_in_one_chunk() -> None:
    """A line over the limit is reported with its size and the next line still arrives."""
    framer = LineFramer(10)
    assert framer.feed(b"x" * 11 + b"\n{}\n") == [Oversized(11, 10), b"{}"]


def test_oversized_line_streamed_is_not_buffered() -> None:
    """An endless line is discarded as it streams; memory stays bounded by the limit."""
    framer = LineFramer(1000)
    for _ in range(1000):
        assert framer.feed(b"y" * 1000) == []
        assert len(framer._buffer) <= 1000
    assert framer.feed(b"yy\n{}\n") == [Oversized(1_000_002, 1000), b"{}"]


def test_oversized_at_eof() -> None:
    """An oversized unterminated line is reported at EOF."""
    framer = LineFramer(4)
    framer.feed(b"123456")
    assert framer.eof() == [Oversized(6, 4)]


def test_exact_limit_is_accepted() -> None:
    """A line of exactly the limit passes."""
    assert feed_all(LineFramer(4), [b"1234\n"]) == [b"1234"]


def test_limit_must_be_positive() -> None:
    """A zero limit is a configuration error."""
    with pytest.raises(ValueError, match="at least one byte"):
        LineFramer(0)


@given(
    st.lists(
        st.one_of(st.binary(max_size=40), st.sampled_from([b"\n", b" \n", b"x" * 70 + b"\n"])),
        max_size=30,
    ).map(b"".join),
    st.lists(st.integers(0, 2000), max_size=6),
)
def test_many_lines_split_at_once_are_the_lines_cut_one_by_one(
    data: bytes, cuts: list[int]
) -> None:
    """Complete lines are split in one call when they are few bytes in all, cut one at a time
    when many: both give the same messages and markers, however the stream is cut."""
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    at_once = feed_all(LineFramer(64), chunks)
    one_by_one = framing.SPLIT_AT_MOST
    try:
        framing.SPLIT_AT_MOST = -1  # every region is "large"
        assert feed_all(LineFramer(64), chunks) == at_once
    finally:
        framing.SPLIT_AT_MOST = one_by_one


def test_a_region_of_many_mb_is_cut_line_by_line() -> None:
    """Lines beyond SPLIT_AT_MOST in one read: each whole, the oversized one marked."""
    big = b"y" * (framing.SPLIT_AT_MOST + 10)
    data = b"{}\n" + big + b"\n\n" + b"[1]\n" + b"tail"
    assert feed_all(LineFramer(len(big)), [data]) == [b"{}", big, b"[1]", b"tail"]
    assert feed_all(LineFramer(100), [data]) == [b"{}", Oversized(len(big), 100), b"[1]", b"tail"]


def test_the_markers_returned_are_counted() -> None:
    """The framer counts the markers of messages too large it has returned (a reader knows
    whether a read brought one without looking at each message)."""
    framer = LineFramer(4)
    framer.feed(b"ab\nabcdef\nc")
    assert framer.oversized == 1
    framer.feed(b"xxxxx")
    framer.feed(b"yy\n")
    assert framer.oversized == 2
    framer.feed(b"zzzzzz")
    framer.eof()
    assert framer.oversized == 3
