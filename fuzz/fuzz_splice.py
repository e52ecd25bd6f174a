"""Fuzz the id splicer (proxy/core/splice.py): any message with an id gets any valid id spliced in.

Invariants: :func:`invariants.check_splice` (the bytes outside the id spans are identical; the
result parses to the same message with only its id changed).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

    from proxy.core.jsonrpc import Batch, Kind, Message, parse

from target import run

NEW_IDS = [
    token
    for token in invariants.ID_TOKENS
    if parse(invariants.message_bytes(token, b'"m"')).kind is Kind.REQUEST
] + [b"0", b"4096"]
"""Every valid id token: the ids the proxy mints and the senders' ids it puts back."""


def test_one_input(data: bytes) -> None:
    """The bytes as a message, or as params/result of a message with an odd (duplicate) id.

    The last bytes choose the new id, the old id and the shape, so seeds stay whole messages.
    """
    picks = data[-3:].rjust(3, b"\0")
    new_id = NEW_IDS[picks[2] % len(NEW_IDS)]
    old_id = invariants.ID_TOKENS[picks[1] % len(invariants.ID_TOKENS)]
    shape = picks[0] % 4
    if shape == 0:
        raw = data
    elif shape == 1:
        raw = invariants.message_bytes(old_id, b'"m"', params=data, spaced=True)
    elif shape == 2:
        raw = invariants.message_bytes(old_id, None, result=data, duplicate_id=new_id)
    else:
        raw = b"[" + invariants.message_bytes(old_id, b'"m"', params=data) + b"," + data + b"]"
    parsed = parse(raw)
    elements = parsed.elements if isinstance(parsed, Batch) else (parsed,)
    for element in elements:
        if isinstance(element, Message) and element.id_spans:
            invariants.check_splice(element, new_id)


if __name__ == "__main__":
    run(test_one_input, "messages")
