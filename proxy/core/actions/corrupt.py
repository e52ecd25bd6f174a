"""``corrupt``: malformed bytes instead of the message, to test the peer's bad-input handling
(``truncate``: its first half; ``garbage``: printable noise; ``invalid_utf8``: an invalid UTF-8
sequence inside its first string). Never a newline, so the framing survives."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from typing import Literal

from pydantic import Field

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Rewrite

__all__ = ["ACTION", "Corrupt", "corrupt"]


class Corrupt(ActionModel):
    """Send malformed bytes instead of the message."""

    action: Literal["corrupt"]
    mode: Literal["truncate", "garbage", "invalid_utf8"] = Field(
        "garbage",
        description="`truncate`: the first half of the message; `garbage`: printable noise; "
        "`invalid_utf8`: an invalid UTF-8 sequence inside its first string",
    )


def corrupt(data: bytes, mode: str, draw: Iterator[int]) -> bytes:
    """Malformed bytes in place of ``data`` (never a newline, so framing survives).

    ``truncate``: the first half; ``garbage``: printable noise drawn from ``draw``;
    ``invalid_utf8``: the message with an invalid UTF-8 sequence inside its first string.
    """
    if mode == "truncate":
        return data[: max(1, len(data) // 2)]
    if mode == "garbage":
        return bytes(next(draw) for _ in range(min(max(len(data), 1), 256)))
    quote = data.find(b'"')
    at = quote + 1 if quote >= 0 else len(data) // 2
    return data[:at] + b"\xc3\x28" + data[at:]


def _printable(rng: random.Random) -> Iterator[int]:
    return iter(lambda: rng.randrange(0x21, 0x7F), None)


def apply(params: Corrupt, fault: Fault) -> list[Effect]:
    """Rewrite what is forwarded (noise is drawn when it is written, from the random stream)."""
    return [Rewrite(functools.partial(corrupt, mode=params.mode, draw=_printable(fault.rng)))]


ACTION = Action(
    Corrupt,
    apply,
    "malformed bytes instead of the message (`mode`: `truncate`, `garbage`, `invalid_utf8`), to "
    "test the peer's bad-input handling",
)
