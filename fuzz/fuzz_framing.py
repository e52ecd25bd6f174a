"""Fuzz newline framing (proxy/core/framing.py ``LineFramer``, how the stdio transport reads).

Invariants: :func:`invariants.check_line_framer` (any chunking gives the messages of the
reference split; an over-long line becomes ``Oversized`` and is never buffered whole).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

from target import run


def test_one_input(data: bytes) -> None:
    """The bytes as a stream; its last byte picks the limit, its last 8 bytes where to cut."""
    limit = 1 + (data[-1] if data else 0) % 64
    invariants.check_line_framer(data, data[-8:], limit)


if __name__ == "__main__":
    run(test_one_input, "messages")
