"""``duplicate``: copies that follow the message, spaced by ``gap_ms``."""

from __future__ import annotations

from action_lab import fault

from proxy.core.actions.base import Copies
from proxy.core.actions.duplicate import ACTION, Duplicate


def test_copies_and_their_spacing() -> None:
    """``copies`` extra messages, ``gap_ms`` apart (in seconds for the relay)."""
    params = Duplicate(action="duplicate", copies=3, gap_ms=20)
    assert ACTION.apply(params, fault()) == [Copies(3, 0.02)]
    assert ACTION.apply(Duplicate(action="duplicate"), fault()) == [Copies(1, 0.0)]
