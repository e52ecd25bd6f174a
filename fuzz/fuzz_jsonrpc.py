"""Fuzz the message classifier (proxy/core/jsonrpc.py ``parse``): any bytes, alone or as params.

Invariants: :func:`invariants.check_parse` (never raises, keeps the bytes, agrees with the
standard library on kinds, ids and batches).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

from target import run


def test_one_input(data: bytes) -> None:
    """The bytes as a whole message, and as the params of a request with an odd id."""
    invariants.check_parse(data)
    if data:
        id_token = invariants.ID_TOKENS[data[0] % len(invariants.ID_TOKENS)]
        invariants.check_parse(invariants.message_bytes(id_token, b'"m"', params=data[1:]))


if __name__ == "__main__":
    run(test_one_input, "messages")
