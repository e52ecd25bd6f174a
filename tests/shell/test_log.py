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
