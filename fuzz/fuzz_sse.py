"""Fuzz server-sent-event decoding (proxy/core/sse.py ``SseDecoder``, how the HTTP upstream reads).

Invariants: :func:`invariants.check_sse` (any chunking gives the events of the reference reading
of the stream; an event's data never exceeds the limit; the buffer stays bounded).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

from target import run


def test_one_input(data: bytes) -> None:
    """The bytes as a stream; its last byte picks the limit, its last 8 bytes where to cut."""
    limit = 1 + (data[-1] if data else 0) % 64
    invariants.check_sse(data, data[-8:], limit)


if __name__ == "__main__":
    run(test_one_input, "sse")
