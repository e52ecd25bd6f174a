"""``delay``: the message is held ``ms`` (plus a uniform draw up to ``jitter_ms``), then forwarded;
the messages behind it keep flowing, so it is overtaken."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Hold

__all__ = ["ACTION", "Delay"]


class Delay(ActionModel):
    """Hold the message ``ms`` (+ uniform ``jitter_ms``), then forward it; others keep flowing."""

    action: Literal["delay"]
    ms: NonNegativeFloat = Field(description="milliseconds the message is held")
    jitter_ms: NonNegativeFloat = Field(
        0.0, description="up to this many milliseconds more, drawn uniformly from the seeded stream"
    )


def apply(params: Delay, fault: Fault) -> list[Effect]:
    """Hold for ``ms`` plus the jitter, drawn from the experiment's random stream."""
    jitter = fault.rng.uniform(0.0, params.jitter_ms) if params.jitter_ms else 0.0
    return [Hold((params.ms + jitter) / 1000)]


ACTION = Action(
    Delay,
    apply,
    "the message is held `ms` (+ a uniform draw up to `jitter_ms`), then forwarded; others keep "
    "flowing past it",
)
