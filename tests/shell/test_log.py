"""Log lines: each one reaches stderr whole, in one write."""

from __future__ import annotations

import io
import json

from proxy.shell.log import configure_logging, get_logger


class Writes(io.StringIO):
    """A text stream that remembers each ``write`` call apart."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_line_is_one_write() -> None:
    """The Agent writes to the same stderr: a line split over two writes could be cut in two by
    the Agent's output (print() writes the newline apart when the stream is unbuffered)."""
    stream = Writes()
    try:
        configure_logging("json", "info", stream)
        get_logger("test").info("one line", detail="x" * 1000)
        get_logger("test").warning("another")
    finally:
        configure_logging()
    assert len(stream.calls) == 2
    for call in stream.calls:
        assert call.endswith("\n")
        assert call.count("\n") == 1
        json.loads(call)


def test_a_payload_is_shortened_and_an_error_kept_whole_up_to_its_own_bound() -> None:
    """What a peer sent is cut at 200 characters; the proxy's own error (a fault file's error
    lists every valid action) is kept whole up to 2,000."""
    stream = Writes()
    try:
        configure_logging("json", "info", stream)
        get_logger("test").error("refused", payload="p" * 500, error="e" * 500)
        get_logger("test").error("refused", error="e" * 5000)
    finally:
        configure_logging()
    first, second = (json.loads(call) for call in stream.calls)
    assert first["payload"] == "p" * 200 + "... (500 chars)"
    assert first["error"] == "e" * 500
    assert second["error"] == "e" * 2000 + "... (5000 chars)"
