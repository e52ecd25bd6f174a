"""``slice``: the message is written in pieces of about ``average_size`` bytes (plus or minus
``size_variation``, drawn from the seeded stream), ``gap_us`` apart (Toxiproxy's ``slicer``): the
peer reads partial lines on stdio, partial chunks of an HTTP body or an SSE stream, or a text
message in continuation frames over a WebSocket. The peer still gets the message whole, and the
messages behind it wait for its last piece (nothing is interleaved).

The pieces are those of the bytes the transport writes (a line with its end, an SSE event with
its fields, a frame's payload): the sizes are drawn for the message's length and
:data:`FRAMING_BYTES` more; what is left after the last size drawn (at most :data:`MAX_PIECES`)
goes as one last piece. Over a WebSocket a piece never ends inside a UTF-8 character."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Split

__all__ = ["ACTION", "FRAMING_BYTES", "MAX_PIECES", "Slice"]

MAX_PIECES = 4096
"""The most pieces one message is cut into: 1-byte pieces of a 4 MB message would be four
million writes (their gaps an hour); past this many the rest goes whole."""
FRAMING_BYTES = 64
"""What a transport adds to a message, at most, that the pieces also cover (SSE's fields)."""


class Slice(ActionModel):
    """Write the message in pieces of ``average_size`` bytes, ``gap_us`` apart."""

    action: Literal["slice"]
    average_size: PositiveInt = Field(le=1 << 30, description="bytes of each piece, on average")
    size_variation: NonNegativeInt = Field(
        0,
        le=1 << 30,
        description="each piece is up to this many bytes longer or shorter (at least 1)",
    )
    gap_us: NonNegativeInt = Field(
        0, le=60_000_000, description="microseconds between two pieces (at most a minute)"
    )


def apply(params: Slice, fault: Fault) -> list[Effect]:
    """The sizes of the pieces, drawn from the experiment's random stream."""
    rng, average, variation = fault.rng, params.average_size, params.size_variation
    left = len(fault.message.raw) + FRAMING_BYTES
    sizes: list[int] = []
    while left > 0 and len(sizes) < MAX_PIECES:
        size = max(average + rng.randint(-variation, variation), 1) if variation else average
        sizes.append(size)
        left -= size
    return [Split(tuple(sizes), params.gap_us / 1_000_000)]


def notes(params: Slice) -> list[tuple[str, str]]:
    """Settings that are likely not what was meant."""
    if params.size_variation >= params.average_size:
        return [("do.size_variation", "as large as average_size: many pieces will be 1 byte")]
    return []


ACTION = Action(
    Slice,
    apply,
    "the message is written in pieces of about `average_size` bytes (± `size_variation`), "
    "`gap_us` apart: partial lines, body chunks or continuation frames; it arrives whole",
    notes=notes,
)
