"""What every transport shares: the pieces of a message written in pieces (``slice``)."""

from __future__ import annotations

import asyncio

from proxy.shell.endpoint import Sliced, pieces


def test_pieces_take_the_sizes_in_turn_and_the_rest_goes_last() -> None:
    assert pieces(b"abcdefghij", (3, 3)) == [b"abc", b"def", b"ghij"]
    assert pieces(b"abc", (2, 5, 5)) == [b"ab", b"c"]
    assert pieces(b"abc", ()) == [b"abc"]
    assert pieces(b"", (1,)) == []


def test_text_pieces_never_end_inside_a_utf8_character() -> None:
    data = "aé€😀z".encode()  # 1, 2, 3, 4 and 1 bytes
    for size in range(1, 6):
        parts = pieces(data, (size,) * 20, text=True)
        assert b"".join(parts) == data
        assert all(part.decode() for part in parts)  # each decodes alone: no split character
    # A cut that would fall inside the first character of a piece moves past its end instead.
    assert pieces("€€".encode(), (1, 1, 1), text=True) == ["€".encode(), "€".encode()]


async def test_the_chunks_of_a_sliced_message_come_with_its_gap() -> None:
    sliced = Sliced(b"abcdefg", (2, 2), 0.0)
    assert len(sliced) == 7
    assert [part async for part in sliced.chunks()] == [b"ab", b"cd", b"efg"]
    loop = asyncio.get_running_loop()
    paced = Sliced(b"abc", (1, 1), 0.02)
    start = loop.time()
    async for _ in paced.chunks():
        pass
    assert loop.time() - start >= 0.04  # two gaps (a lower bound: the gaps are the fault)
