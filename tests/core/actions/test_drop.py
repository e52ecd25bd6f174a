"""``drop``: the message goes no further."""

from __future__ import annotations

from action_lab import fault

from proxy.core.actions.base import Stop
from proxy.core.actions.drop import ACTION, Drop


def test_the_message_is_stopped_as_dropped() -> None:
    """Any message: one effect, the stop."""
    assert ACTION.apply(Drop(action="drop"), fault()) == [Stop("dropped")]
