"""``delay``: a hold of ``ms`` plus a jitter drawn from the experiment's random stream."""

from __future__ import annotations

import random

from action_lab import fault

from proxy.core.actions.base import Hold
from proxy.core.actions.delay import ACTION, Delay


def test_without_jitter_the_hold_is_exact_and_draws_nothing() -> None:
    """``ms`` alone: a hold of that many milliseconds, the random stream untouched."""
    given = fault(seed=3)
    state = given.rng.getstate()
    assert ACTION.apply(Delay(action="delay", ms=250), given) == [Hold(0.25)]
    assert given.rng.getstate() == state


def test_the_jitter_is_drawn_from_the_seeded_stream() -> None:
    """The same seed gives the same hold, within ``[ms, ms + jitter_ms]``."""
    params = Delay(action="delay", ms=100, jitter_ms=50)
    [first] = ACTION.apply(params, fault(seed=9))
    [again] = ACTION.apply(params, fault(seed=9))
    assert first == again
    assert isinstance(first, Hold)
    assert first.seconds == (100 + random.Random(9).uniform(0, 50)) / 1000
    assert 0.1 <= first.seconds <= 0.15
