"""Server-sent events: encoding one message per event, decoding as the SDKs do."""

from __future__ import annotations

from proxy.core.framing import Oversized
from proxy.core.sse import KEEPALIVE, SseDecoder, encode_event


def decode_all(chunks: list[bytes], limit: int = 1000) -> list[bytes | Oversized]:
    decoder = SseDecoder(limit)
    out: list[bytes | Oversized] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out + decoder.eof()


def test_encode_one_message_per_event() -> None:
    """A compact message is one data line and a blank line."""
    assert encode_event(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_encode_splits_raw_newlines_into_data_lines() -> None:
    """Pretty-printed JSON becomes several data lines that decode back to it."""
    event = encode_event(b'{\n  "a": 1\r\n}')
    assert event == b'data: {\ndata:   "a": 1\ndata: }\n\n'
    assert decode_all([event]) == [b'{\n  "a": 1\n}']


def test_decode_across_chunk_boundaries_and_line_endings() -> None:
    """Events split anywhere, with LF, CRLF or CR line ends, decode the same."""
    stream = b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\ndata: {"c":3}\r\r'
    expected = [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    for size in (1, 2, 3, 7, 100):
        assert decode_all([stream[i : i + size] for i in range(0, len(stream), size)]) == expected


def test_comments_fields_and_bom_are_ignored() -> None:
    """Keep-alives, id/event/retry fields and a leading BOM carry no data."""
    stream = (
        b"\xef\xbb\xbf"
        + KEEPALIVE
        + b'id: 4\nevent: message\nretry: 10\ndata:{"a":1}\n\n: ping\n\n'
    )
    assert decode_all([stream]) == [b'{"a":1}']


def test_multi_line_data_is_joined() -> None:
    """Several data lines of one event are joined with newlines."""
    assert decode_all([b"data: [1,\ndata: 2]\n\n"]) == [b"[1,\n2]"]


def test_event_without_data_is_skipped() -> None:
    """A blank line with no data before it dispatches nothing."""
    assert decode_all([b"\n\nevent: x\n\n"]) == []


def test_oversized_event_is_reported_and_the_stream_goes_on() -> None:
    """An event above the limit is discarded as it streams; the next one arrives."""
    out = decode_all(
        [b"data: " + b"x" * 600 + b"\n", b"data: " + b"y" * 600 + b"\n\n", b'data: {"ok":1}\n\n']
    )
    assert isinstance(out[0], Oversized)
    assert out[1:] == [b'{"ok":1}']


def test_an_endless_line_does_not_grow_the_buffer() -> None:
    """A line with no end is dropped as it streams, memory bounded by the limit."""
    decoder = SseDecoder(100)
    for _ in range(100):
        decoder.feed(b"data: " + b"z" * 100)
        assert len(decoder._buffer) <= 200
    assert isinstance(decoder.feed(b"\n\n")[0], Oversized)


def test_an_unfinished_event_at_eof_is_discarded() -> None:
    """Data not closed by a blank line before the stream ends is not an event."""
    assert decode_all([b'data: {"a":1}\n\ndata: {"partial"']) == [b'{"a":1}']


def test_a_long_comment_streamed_in_pieces_is_still_a_comment() -> None:
    """A line too long to buffer is skipped to its end: its tail is not read as a line of its own,
    and a comment or another field does not make the event oversized."""
    stream = b": " + b"x" * 100 + b"data: lost\ndata: 1\n\n" + b"retry: " + b"9" * 100 + b"\n\n"
    assert decode_all([stream], limit=10) == [b"1"]
    assert decode_all([stream[i : i + 7] for i in range(0, len(stream), 7)], limit=10) == [b"1"]


def test_a_long_data_line_ending_in_a_carriage_return_keeps_the_next_line() -> None:
    """A CR that ends an over-long line at a chunk boundary is not mistaken for the line's tail."""
    out = decode_all([b"data: " + b"y" * 40 + b"\r", b"\rdata: 2\n\n"], limit=10)
    assert isinstance(out[0], Oversized)
    assert out[1:] == [b"2"]


def test_only_a_bom_at_the_start_of_the_stream_is_dropped() -> None:
    """A BOM after the first line is part of a field name, however the stream is chunked."""
    stream = b'\n\xef\xbb\xbfdata: {"a":1}\n\ndata: 2\n\n'
    assert decode_all([stream]) == [b"2"]
    assert decode_all([stream[:1], stream[1:]]) == [b"2"]
    assert decode_all([b"\xef", b"\xbb", b"\xbfdata: 3\n\n"]) == [b"3"]
