"""The bench WebSocket Client's parser of a server's frames (``ServerFrames``), sans I/O: the
same messages however the bytes are cut into reads, pings and a close taken between them, and
each frame no server sends refused as soon as its header is read."""

from __future__ import annotations

import pytest

from proxy.tools.bench.messages import text_frame
from proxy.tools.bench.ws_driver import ServerFrames

LIMIT = 1 << 20


def frame(opcode: int, payload: bytes, *, fin: bool = True, second: int = 0) -> bytes:
    """A server's frame (unmasked) of any opcode, its length in the shortest form."""
    size = len(payload)
    if size < 126:
        head = bytes(((0x80 if fin else 0) | opcode, second | size))
    elif size < 1 << 16:
        head = bytes(((0x80 if fin else 0) | opcode, second | 126)) + size.to_bytes(2, "big")
    else:
        head = bytes(((0x80 if fin else 0) | opcode, second | 127)) + size.to_bytes(8, "big")
    return head + payload


WHOLE = [b"a" * 125, b"b" * 126, b"c" * 65535, b"d" * 65536, b""]
"""Messages at the edges of the three lengths (7 bits, 16, 64)."""
STREAM = (
    b"".join(text_frame(message) for message in WHOLE)
    + frame(0x1, b'{"part":', fin=False)
    + frame(0x9, b"are you there")  # a ping amid a fragmented message
    + frame(0x0, b" 1,", fin=False)
    + frame(0xA, b"")  # an unasked pong: ignored
    + frame(0x0, b' "end": 2}')
    + frame(0x2, b"\x00binary")
    + frame(0x8, b"\x03\xe8bye")
    + text_frame(b"after the close: never parsed")
)


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 10, 4096, len(STREAM)])
def test_the_same_messages_however_the_reads_are_cut(cut: int) -> None:
    """Every header and payload split across reads (down to a byte a read), whole or not."""
    frames = ServerFrames(LIMIT)
    for start in range(0, len(STREAM), cut):
        frames.feed(STREAM[start : start + cut])
    assert list(frames.messages) == [*WHOLE, b'{"part": 1, "end": 2}', b"\x00binary"]
    assert frames.pings == [b"are you there"]
    assert frames.close == b"\x03\xe8bye"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (frame(0x1, b"x", second=0x80) + b"mask", "a frame no server sends"),  # masked
        (bytes((0xC1, 1)) + b"x", "a frame no server sends"),  # RSV1, no extension
        (frame(0x3, b"x"), "a frame no server sends"),  # a reserved data opcode
        (frame(0xB, b"x"), "a frame no server sends"),  # a reserved control opcode
        (frame(0x9, b"x" * 126), "a frame no server sends"),  # a control frame too long
        (frame(0x9, b"x", fin=False), "a frame no server sends"),  # a fragmented control frame
        (frame(0x0, b"x"), "a continuation frame with no message begun"),
        (frame(0x1, b"x", fin=False) + frame(0x1, b"y"), "a new message amid a fragmented one"),
        (bytes((0x81, 127)) + (LIMIT + 1).to_bytes(8, "big"), "a frame no server sends"),
        (bytes((0x81, 127)) + (1 << 63).to_bytes(8, "big"), "a frame no server sends"),
        (
            frame(0x1, b"x" * 1000, fin=False) + frame(0x0, b"x" * 1000, fin=False),
            "a message over 1500 bytes",
        ),
    ],
    ids=[
        "masked",
        "rsv1",
        "reserved data opcode",
        "reserved control opcode",
        "long control",
        "fragmented control",
        "stray continuation",
        "new message amid fragments",
        "frame over the limit",
        "64-bit length with its top bit",
        "fragments over the limit",
    ],
)
def test_a_frame_no_server_sends_is_refused_from_its_header(data: bytes, error: str) -> None:
    """Refused as soon as the header is in (a frame over the limit: before its payload)."""
    frames = ServerFrames(1500 if "1500" in error else LIMIT)
    with pytest.raises(ValueError, match=error):
        frames.feed(data)
