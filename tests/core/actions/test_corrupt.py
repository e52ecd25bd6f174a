"""``corrupt``: the forwarded bytes rewritten so that the peer cannot read them, framing kept."""

from __future__ import annotations

import random

import pytest
from action_lab import fault

from proxy.core.actions.base import Rewrite
from proxy.core.actions.corrupt import ACTION, Corrupt, corrupt

RAW = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"text":"hello"}}'


@pytest.mark.parametrize("mode", ["truncate", "garbage", "invalid_utf8"])
def test_every_mode_breaks_the_message_and_never_its_framing(mode: str) -> None:
    """No mode writes a newline; each leaves bytes no JSON parser reads."""
    out = corrupt(RAW, mode, iter(lambda: random.Random(1).randrange(0x21, 0x7F), None))
    assert b"\n" not in out
    assert out != RAW


def test_truncate_and_invalid_utf8_are_exact() -> None:
    """``truncate``: the first half; ``invalid_utf8``: a bad sequence inside the first string."""
    assert corrupt(RAW, "truncate", iter(())) == RAW[: len(RAW) // 2]
    assert corrupt(RAW, "invalid_utf8", iter(())) == b'{"\xc3(jsonrpc"' + RAW[10:]


def test_garbage_is_drawn_when_written_from_the_seeded_stream() -> None:
    """The noise comes from the experiment's random stream, as the bytes are written."""
    first = fault(RAW, seed=5)
    [rewrite] = ACTION.apply(Corrupt(action="corrupt"), first)
    assert isinstance(rewrite, Rewrite)
    assert rewrite.unreadable
    again = fault(RAW, seed=5)
    [same] = ACTION.apply(Corrupt(action="corrupt"), again)
    assert isinstance(same, Rewrite)
    assert rewrite.transform(RAW) == same.transform(RAW)
    assert all(0x21 <= byte < 0x7F for byte in rewrite.transform(RAW))
