"""``delay``: a hold of ``ms`` plus a jitter drawn from the experiment's random stream."""

from __future__ import annotations

import math
import random
import statistics
from typing import Literal

import pytest
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


def holds(params: Delay, count: int = 2000, seed: int = 5) -> list[float]:
    """``count`` delays of one rule (one random stream, one memory), in milliseconds."""
    given = fault(seed=seed)
    drawn = []
    for _ in range(count):
        [hold] = ACTION.apply(params, given)
        assert isinstance(hold, Hold)
        drawn.append(hold.seconds * 1000)
    return drawn


Law = Literal["uniform", "normal", "pareto", "paretonormal"]
"""A delay's ``distribution``."""


def lag_one(values: list[float]) -> float:
    """The correlation of each value with the next."""
    return statistics.correlation(values[:-1], values[1:])


@pytest.mark.parametrize("distribution", ["normal", "pareto", "paretonormal"])
def test_each_distribution_has_mean_ms_and_deviation_jitter(distribution: Law) -> None:
    """2,000 draws of a fixed seed: the mean is ``ms`` and the deviation ``jitter_ms``, within
    what that many draws can hold (pareto's heavy tail spreads its sample deviation most)."""
    drawn = holds(Delay(action="delay", ms=100, jitter_ms=10, distribution=distribution))
    assert statistics.fmean(drawn) == pytest.approx(100, abs=1.0)
    assert abs(lag_one(drawn)) < 0.1  # independent draws
    if distribution != "pareto":
        assert statistics.stdev(drawn) == pytest.approx(10, rel=0.1)
        return
    # A tail this heavy spreads the sample deviation too much: its quartiles are what 2,000
    # draws hold. Pareto(shape 3) has quantiles (1 - q) ** (-1 / 3), standardized as the action.
    quartiles = statistics.quantiles(drawn, n=4)
    law = [100 + 10 * ((1 - q) ** (-1 / 3) - 1.5) / math.sqrt(0.75) for q in (0.25, 0.5, 0.75)]
    assert quartiles == pytest.approx(law, abs=0.5)


def test_pareto_leans_to_long_delays_and_normal_does_not() -> None:
    """Pareto's tail is on the long side: its median is under its mean, and it reaches further
    above the mean than below it; the normal law is even."""
    pareto = holds(Delay(action="delay", ms=100, jitter_ms=10, distribution="pareto"))
    normal = holds(Delay(action="delay", ms=100, jitter_ms=10, distribution="normal"))
    assert statistics.median(pareto) < statistics.fmean(pareto) - 1
    assert max(pareto) - 100 > 2 * (100 - min(pareto))
    assert statistics.median(normal) == pytest.approx(statistics.fmean(normal), abs=1.0)


@pytest.mark.parametrize("distribution", ["uniform", "normal", "pareto"])
def test_correlation_ties_each_delay_to_the_last_keeping_mean_and_deviation(
    distribution: Law,
) -> None:
    """``correlation: 75``: successive delays correlate at about 0.75; the normal law keeps its
    mean and deviation (netem's way would narrow it), the uniform one its bounds."""
    params = Delay(action="delay", ms=100, jitter_ms=10, distribution=distribution, correlation=75)
    drawn = holds(params, count=4000)
    assert lag_one(drawn) == pytest.approx(0.75, abs=0.08)
    if distribution == "uniform":
        assert all(100 <= value <= 110 for value in drawn)
    elif distribution == "normal":  # pareto's sample deviation is too wild for a correlated run
        assert statistics.fmean(drawn) == pytest.approx(100, abs=1.5)
        assert statistics.stdev(drawn) == pytest.approx(10, rel=0.1)


def test_a_delay_never_goes_below_zero() -> None:
    """A deviation larger than the mean: the draws below 0 are holds of 0."""
    drawn = holds(Delay(action="delay", ms=5, jitter_ms=50, distribution="normal"))
    assert min(drawn) == 0
    assert sum(value == 0 for value in drawn) > 500
