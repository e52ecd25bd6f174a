"""What the tests count in parsed JSON, as an oracle independent of the product's own counts."""

from __future__ import annotations

from typing import Any


def values_in(value: Any) -> int:
    """The JSON values ``value`` is made of, itself included: the objects a parse builds."""
    if isinstance(value, dict):
        return 1 + sum(values_in(each) for each in value.values())
    if isinstance(value, list):
        return 1 + sum(values_in(each) for each in value)
    return 1
