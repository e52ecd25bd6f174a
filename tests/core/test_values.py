"""The value types of the per-message path (proxy/core/values.py): they behave as frozen
dataclasses do (equality, hashing, ``compare=False``, keyword-only fields, ``replace``), and
assigning a field is a type error (checked by mypy on the code base, not here)."""

from __future__ import annotations

import dataclasses
from dataclasses import field

import pytest

from proxy.core.commands import Send
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind, Message, parse
from proxy.core.observations import Relayed
from proxy.core.values import value


@value
class Point:
    x: int
    y: int = 0
    note: str = field(default="", compare=False)


@value(kw_only=True)
class Named:
    name: str
    size: int = 1


def test_a_value_compares_and_hashes_by_its_compared_fields() -> None:
    assert Point(1, 2) == Point(1, 2, note="other")
    assert Point(1, 2) != Point(2, 1)
    assert hash(Point(1, 2)) == hash(Point(1, 2, note="other"))
    assert len({Point(1), Point(1), Point(2)}) == 2


def test_a_value_has_slots_and_no_instance_dict() -> None:
    assert not hasattr(Point(1), "__dict__")
    assert Point.__dict__["__slots__"] == ("x", "y", "note")


def test_keyword_only_values_refuse_positional_fields() -> None:
    assert Named(name="a").size == 1
    with pytest.raises(TypeError):
        Named("a")  # type: ignore[call-arg]


def test_a_value_is_replaced_not_changed() -> None:
    first = Point(1, 2)
    second = dataclasses.replace(first, y=5)
    assert (first.y, second.y) == (2, 5)


def test_the_relays_values_are_declared_so() -> None:
    """The event, message, observation and command types are values: equal by field."""
    assert Send(Side.CLIENT, b"x") == Send(Side.CLIENT, b"x")
    assert dataclasses.fields(Relayed)[0].name == "direction"
    seen = Relayed(
        direction=Direction.TO_AGENT, kind=Kind.NOTIFICATION, method="m", session=None, size=1
    )
    message = parse(b'{"method":"m"}')
    assert isinstance(message, Message)
    assert seen == dataclasses.replace(seen, message=message)  # not compared
