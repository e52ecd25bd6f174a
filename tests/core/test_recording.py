"""The recording format: lines written, read back byte for byte, and every bad line located."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind
from proxy.core.recording import (
    MAX_PROBLEMS,
    VERSION,
    RecordingError,
    RecordingReader,
    header_line,
    link_line,
    message_line,
    read_recording,
)
from proxy.core.redact import REDACTED, Redaction, Redactor, parse_pattern

BIG = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"z":1,"a":123456789012345678901234567890,"f":1.50}}'


PATH = Redaction("path", "params.prompt[*].text")


def lines(*extra: bytes) -> list[bytes]:
    return [header_line(1.0, [PATH]), *extra]


def test_a_body_is_read_back_byte_for_byte() -> None:
    """Big integers, key order and the way numbers are written survive the round trip."""
    line = message_line(2.5, 1, Direction.TO_AGENT, (b"7", b"0"), BIG)
    assert BIG in line  # spliced in, not written again
    recording = read_recording("r", lines(line), max_bytes=10**6)
    (recorded,) = recording.messages
    assert recorded.message.raw == BIG
    assert recorded.message.kind is Kind.REQUEST
    assert recorded.pair == (b"7", b"0")
    assert (recorded.time, recorded.link, recorded.line) == (2.5, 1, 2)
    assert recording.redactions == (PATH,)


def test_a_body_with_line_breaks_is_kept_as_text() -> None:
    """A pretty-printed body cannot sit on one line: it is written as a string, read back exact."""
    raw = b'{\n  "jsonrpc": "2.0",\r\n  "method": "x"\n}'
    line = message_line(1.0, 1, Direction.TO_CLIENT, (None, None), raw)
    assert b"\n" not in line
    (recorded,) = read_recording("r", lines(line), max_bytes=10**6).messages
    assert recorded.message.raw == raw
    assert recorded.pair == (b"null", b"null")


def test_link_lines_and_redactions_are_read() -> None:
    """Open and close lines name their link and side; a message says where it was redacted."""
    body = message_line(1.0, 3, Direction.TO_AGENT, (b'"a"', b"1"), BIG, redacted=["params.z"])
    recording = read_recording(
        "r",
        lines(link_line(0.5, 3, "open", Side.CLIENT), body, link_line(2, 3, "close", Side.AGENT)),
        max_bytes=10**6,
    )
    assert [(e.event, e.side, e.link) for e in recording.links] == [
        ("open", Side.CLIENT, 3),
        ("close", Side.AGENT, 3),
    ]
    assert recording.messages[0].redacted == ("params.z",)
    assert recording.messages[0].pair == (b'"a"', b"1")


def test_the_header_says_what_was_redacted_without_the_secret() -> None:
    """A regular expression by its digest only, a path as it is; the header of an older writer
    (the patterns' text) still loads; an entry that is neither is a located problem."""
    secret = parse_pattern("hunter2XYZ").describe()
    header = header_line(1.0, [secret, PATH])
    assert b"hunter2XYZ" not in header
    assert orjson.loads(header)["redactions"] == [
        {"kind": "regex", "digest": secret.value},
        {"kind": "path", "path": "params.prompt[*].text"},
    ]
    assert read_recording("r", [header], max_bytes=10**6).redactions == (secret, PATH)
    older = b'{"format":"acp-recording","version":1,"time":1,"redactions":["hunter2XYZ","a.b"]}'
    assert read_recording("r", [older], max_bytes=10**6).redactions == (
        secret,
        Redaction("path", "a.b"),
    )
    bad = b'{"format":"acp-recording","version":1,"time":1,"redactions":[{"kind":"x"}]}'
    with pytest.raises(RecordingError, match="line 1: not a redaction"):
        read_recording("r", [bad], max_bytes=10**6)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"time":1,"link":1,"event":"nope"}', "unknown event 'nope'"),
        (b'{"time":"x","link":1,"event":"open","side":"client"}', "time is not"),
        (b'{"time":1,"link":1,"event":"open","side":"nobody"}', "side is neither"),
        (
            b'{"time":1,"link":1,"event":"message","direction":"up","body":{}}',
            "direction is neither",
        ),
        (
            b'{"time":1,"link":1,"event":"message","direction":"to_agent"}',
            "a message line without its body",
        ),
        (
            b'{"time":1,"link":1,"event":"message","direction":"to_agent","body":[1,2]}',
            "the body is not one JSON-RPC message",
        ),
        (
            b'{"time":1,"link":1,"event":"message","direction":"to_agent",'
            b'"body":{"jsonrpc":"1.0","id":1,"method":"m"}}',
            'the body is not a JSON-RPC 2.0 message (its "jsonrpc" is not "2.0")',
        ),
        (
            b'{"time":1,"link":1,"event":"message","direction":"to_agent",'
            b'"body":{"id":1,"method":"m"}}',
            "the body is not a JSON-RPC 2.0 message",
        ),
    ],
)
def test_a_bad_line_is_located(line: bytes, says: str) -> None:
    """Each bad line is a problem naming its line; the others are still read."""
    good = message_line(1.0, 1, Direction.TO_AGENT, (b"7", b"0"), BIG)
    with pytest.raises(RecordingError) as caught:
        read_recording("file.jsonl", lines(good, line, good), max_bytes=10**6)
    assert [p.line for p in caught.value.problems] == [3]
    assert f"file.jsonl: line 3: {says}" in str(caught.value)


def test_every_problem_is_said_up_to_a_bound() -> None:
    """Many bad lines: the first MAX_PROBLEMS are listed, the rest counted."""
    with pytest.raises(RecordingError) as caught:
        read_recording("r", lines(*[b"x"] * (MAX_PROBLEMS + 5)), max_bytes=10**6)
    assert len(caught.value.problems) == MAX_PROBLEMS
    assert caught.value.more == 5
    assert "and 5 more problems" in str(caught.value)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (b'{"hello":1}', 'not a recording: the first line has no "format"'),
        (
            orjson.dumps({"format": "acp-recording", "version": VERSION + 1, "time": 1}),
            "recorded by a newer acp-proxy (format version 2",
        ),
        (
            orjson.dumps({"format": "acp-recording", "version": 0, "time": 1}),
            "format version 0 is older than any",
        ),
        (orjson.dumps({"format": "acp-recording", "version": "1"}), "version is not an integer"),
    ],
)
def test_a_header_that_cannot_be_read_says_why(header: bytes, says: str) -> None:
    """Another format, a newer or older version: one problem on line 1, nothing read further."""
    with pytest.raises(RecordingError) as caught:
        read_recording("r", [header, b"garbage"], max_bytes=10**6)
    assert [p.line for p in caught.value.problems] == [1]
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("first", "says"),
    [
        (b"2026-12-06 INFO started", "its first line is not JSON"),
        (b"\x8f\x00\xff binary", "its first line is not JSON"),
        (b"[1, 2]", "its first line is not a JSON object"),
    ],
)
def test_a_file_that_is_no_recording_is_said_once(first: bytes, says: str) -> None:
    """A log, random bytes: the first line is no header, which is all there is to say (the
    thousands of lines after it are not read, nor listed)."""
    with pytest.raises(RecordingError) as caught:
        read_recording("app.log", [first, *[b"more of the log"] * 5000], max_bytes=10**9)
    assert str(caught.value) == f"app.log: line 1: not a recording: {says}"


def test_a_first_line_too_long_is_no_recording() -> None:
    """A first line over the caller's bound is no header either: one problem, nothing read."""
    reader = RecordingReader("r", max_bytes=10**6)
    assert reader.too_long(1, 64) is False
    assert reader.feed(2, header_line(1.0)) is False
    with pytest.raises(RecordingError) as caught:
        reader.finish()
    assert str(caught.value) == "r: line 1: not a recording: its first line is longer than 64 bytes"


def test_an_empty_file_is_no_recording() -> None:
    """No line at all: said so."""
    with pytest.raises(RecordingError, match="empty: not a recording"):
        read_recording("r", [], max_bytes=10)


def test_what_is_kept_is_bounded() -> None:
    """Past max_bytes of lines the reader stops, saying where."""
    reader = RecordingReader("r", max_bytes=200)
    good = message_line(1.0, 1, Direction.TO_AGENT, (b"7", b"0"), BIG)
    assert reader.feed(1, header_line(1.0))
    assert not reader.feed(2, good + b"\n")
    assert not reader.feed(3, good)
    with pytest.raises(RecordingError, match="the recording holds more than 200 bytes"):
        reader.finish()


def test_a_line_too_long_is_located() -> None:
    """The caller's line bound: the line is named, the others read."""
    reader = RecordingReader("r", max_bytes=10**6)
    reader.feed(1, header_line(1.0))
    reader.too_long(2, 64)
    with pytest.raises(RecordingError, match="longer than 64 bytes"):
        reader.finish()


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(st.text(max_size=5), _JSON, max_size=4),
    st.booleans(),
    st.sampled_from(["", " ", "\n", "\r\n  "]),
)
def test_any_message_is_read_back_as_it_was_written(
    params: dict[str, object], ascii_only: bool, space: str
) -> None:
    """Whatever a message holds and however it is written (escapes, spaces, line breaks), the
    recording gives back its very bytes; and a redaction of a path keeps it one JSON message."""
    message = {"jsonrpc": "2.0", "method": "m", "params": params}
    # the space between members only (a replace of ", " would break a string holding one)
    body = json.dumps(message, ensure_ascii=ascii_only, separators=("," + space, ": "))
    raw = body.encode("utf-8", "surrogatepass")
    line = message_line(1.0, 1, Direction.TO_AGENT, (None, None), raw)
    assert b"\n" not in line
    (recorded,) = read_recording("r", lines(line), max_bytes=10**7).messages
    assert recorded.message.raw == raw
    redacted, _ = Redactor.of(["params.*"]).redact(raw)
    again = read_recording(
        "r",
        lines(message_line(1.0, 1, Direction.TO_AGENT, (None, None), redacted)),
        max_bytes=10**7,
    )
    assert all(value == REDACTED for value in again.messages[0].message.params.values())
