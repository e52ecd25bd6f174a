"""``delay``: the message is held ``ms`` (plus a uniform draw up to ``jitter_ms``), then forwarded;
the messages behind it keep flowing, so it is overtaken.

``distribution`` gives the delay the shapes of ``tc netem delay ... distribution``: ``normal``
(mean ``ms``, standard deviation ``jitter_ms``), ``pareto`` (a Pareto law of shape 3, heavy on
the long side, moved and scaled to the same mean and deviation) and ``paretonormal`` (a quarter
Pareto, three quarters normal, the same mean and deviation); a delay below 0 is 0.
``correlation`` (percent, as netem's) ties each delay to the rule's previous one: the standard
draw behind it is ``c`` times the previous draw plus ``sqrt(1 - c^2)`` times a fresh one, which
keeps the mean and the deviation (netem's way narrows the deviation as ``c`` grows)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, NonNegativeFloat

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Hold

__all__ = ["ACTION", "Delay"]

PARETO_SHAPE = 3.0
"""The shape of ``pareto``'s law: the smallest whole one with a finite deviation."""
_PARETO_MEAN = PARETO_SHAPE / (PARETO_SHAPE - 1)
_PARETO_DEVIATION = math.sqrt(PARETO_SHAPE / ((PARETO_SHAPE - 1) ** 2 * (PARETO_SHAPE - 2)))
_MIX = math.hypot(0.25, 0.75)
"""The deviation of a quarter of one standard draw plus three quarters of another."""
_UNIFORM_DEVIATION = math.sqrt(12.0)
"""A uniform draw on [0, 1) minus 0.5, times this, has a deviation of 1."""


class Delay(ActionModel):
    """Hold the message ``ms`` (+ uniform ``jitter_ms``), then forward it; others keep flowing."""

    action: Literal["delay"]
    ms: NonNegativeFloat = Field(description="milliseconds the message is held")
    jitter_ms: NonNegativeFloat = Field(
        0.0,
        description="up to this many milliseconds more, drawn uniformly from the seeded stream "
        "(with a `distribution`: its standard deviation)",
    )
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] = Field(
        "uniform",
        description="the law of the delay: `uniform` on [ms, ms + jitter_ms], else mean `ms` "
        "and standard deviation `jitter_ms` (netem's tables' shapes)",
    )
    correlation: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="percent: how much each delay of the rule follows the previous one",
    )


def apply(params: Delay, fault: Fault) -> list[Effect]:
    """Hold for ``ms`` plus the jitter, drawn from the experiment's random stream."""
    jitter = params.jitter_ms
    if not jitter:
        return [Hold(params.ms / 1000)]
    if params.distribution == "uniform" and not params.correlation:
        return [Hold((params.ms + fault.rng.uniform(0.0, jitter)) / 1000)]
    draw = _standard(params.distribution, fault)
    if params.correlation:
        weight = params.correlation / 100
        previous = fault.memory.get("draw")
        if previous is not None:
            draw = weight * previous + math.sqrt(1 - weight * weight) * draw
        fault.memory["draw"] = draw
    if params.distribution == "uniform":
        share = min(max(draw / _UNIFORM_DEVIATION + 0.5, 0.0), 1.0)
        return [Hold((params.ms + jitter * share) / 1000)]
    return [Hold(max(params.ms + jitter * draw, 0.0) / 1000)]


def _standard(distribution: str, fault: Fault) -> float:
    """A draw of mean 0 and deviation 1, of ``distribution``'s shape."""
    rng = fault.rng
    if distribution == "uniform":
        return (rng.random() - 0.5) * _UNIFORM_DEVIATION
    if distribution == "normal":
        return rng.gauss(0.0, 1.0)
    pareto = (rng.paretovariate(PARETO_SHAPE) - _PARETO_MEAN) / _PARETO_DEVIATION
    if distribution == "pareto":
        return pareto
    return (0.25 * pareto + 0.75 * rng.gauss(0.0, 1.0)) / _MIX


def notes(params: Delay) -> list[tuple[str, str]]:
    """Settings that do nothing, or likely not what was meant."""
    found = []
    if params.distribution != "uniform" and not params.jitter_ms:
        found.append(("do.distribution", "without jitter_ms every delay is ms: no law to draw"))
    if params.correlation and not params.jitter_ms:
        found.append(("do.correlation", "without jitter_ms there is nothing to correlate"))
    elif 0 < params.correlation < 1:
        percent = f"{params.correlation * 100:g}"
        found.append(("do.correlation", f"a percent: did you mean {percent} (not a fraction)?"))
    return found


ACTION = Action(
    Delay,
    apply,
    "the message is held `ms` (+ a uniform draw up to `jitter_ms`, or a `normal`, `pareto` or "
    "`paretonormal` one of deviation `jitter_ms`, each tied to the last by `correlation`), then "
    "forwarded; others keep flowing past it",
    notes=notes,
)
