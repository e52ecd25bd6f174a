"""``bandwidth``: the messages the rule matches go through a link of ``bytes_per_second`` in
their direction (Toxiproxy's ``bandwidth``, netem's ``rate``), per link: each waits until the
link has carried the bytes before it, then goes on; the messages the rule does not match flow
past.

A token bucket (:class:`~proxy.core.actions.base.TokenBucket`) of ``burst_bytes``: after an
idle spell that many bytes go at once, and no more. With the default 0 every message is paced as
a wire of that speed would carry it: a message of ``n`` bytes (its JSON as received) arrives
``n / bytes_per_second`` seconds after the link was free, so a stream of them keeps the rate,
in order. The wait of each is a fault in progress, as a delay's is (``--max-active-faults``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Pace

__all__ = ["ACTION", "Bandwidth"]


class Bandwidth(ActionModel):
    """At most ``bytes_per_second`` of matched messages per direction of each link."""

    action: Literal["bandwidth"]
    bytes_per_second: PositiveInt = Field(
        le=10**12, description="bytes per second the link carries in the message's direction"
    )
    burst_bytes: NonNegativeInt = Field(
        0,
        le=10**12,
        description="bytes that may go at once after an idle spell (the bucket's size); 0: "
        "every message waits as long as the link takes to carry it",
    )


def apply(params: Bandwidth, _fault: Fault) -> list[Effect]:
    """A place in the link's bucket (the relay keeps one per rule and direction)."""
    return [Pace(float(params.bytes_per_second), params.burst_bytes)]


ACTION = Action(
    Bandwidth,
    apply,
    "the messages it matches go through a link of `bytes_per_second` per direction (a token "
    "bucket of `burst_bytes`, per link): each waits its turn, in order; others flow past",
)
