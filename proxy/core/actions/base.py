"""What every fault action is made of: its parameters' model, the fault it acts on, its effects.

An action is data and a pure function (toxiproxy's toxics, as data). Its :class:`ActionModel`
subclass is the ``do`` of a rule: ``action: Literal["name"]`` and the action's own fields, each
validated like any field of a fault file (unknown fields refused). Its ``apply`` takes those
parameters and the :class:`Fault` (the message, what rules match on, the random stream) and
returns :data:`Effect` s: what should happen to the message and around it. It never carries them
out: the relay (:mod:`proxy.core.relay`) folds the effects of every rule that fired into the
commands of the link, whichever action produced them.

The effects, the one vocabulary shared by every action:

* :class:`Stop`: the message goes no further (``dropped``, ``answered_by_proxy``, ``severed``,
  ``refused``);
* :class:`Reply`: the proxy answers the sender itself (bytes under the sender's id);
* :class:`Hold`: the message is forwarded that much later (holds of several rules add up);
* :class:`Breakpoint`: the message waits for the control API to act on it (a ``hold``), at
  most a timeout;
* :class:`Pace`: the message waits its turn in a token bucket of its link and direction (a
  throttled link: the relay keeps one :class:`TokenBucket` per rule and direction);
* :class:`Freeze`: nothing goes on in its direction for a while, the message first (then what
  was held goes on, or the connection is cut);
* :class:`CloseLate`: the close of the connection toward its peer comes late, when it comes;
* :class:`Copies`: extra copies follow it, ``gap`` seconds apart (a request's copies get ids of
  their own, and only the first answer is relayed);
* :class:`Rewrite`: what is forwarded is rewritten (its copies too);
* :class:`Split`: the message is written in pieces, with gaps between them;
* :class:`Cut`: a connection is cut, before or after forwarding;
* :class:`KillStream`: the message is translated but not written: the SSE stream that would
  carry it dies with it;
* :class:`Now` and :class:`After`: a command of the shell, at once or once the message was
  forwarded (a delay may follow).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import UnionType
from typing import Annotated, Any, Generic, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    WrapValidator,
    model_validator,
)

from proxy.core.commands import Command
from proxy.core.events import Direction
from proxy.core.jsonrpc import Kind, Message
from proxy.core.observations import HeldThen, Stopping
from proxy.core.values import value

__all__ = [
    "ATTRIBUTE_DESCRIPTION",
    "MIN_WAIT",
    "Action",
    "ActionModel",
    "After",
    "Breakpoint",
    "CloseLate",
    "Copies",
    "Cut",
    "CutShort",
    "Effect",
    "Fault",
    "Freeze",
    "Hold",
    "KillStream",
    "Now",
    "Pace",
    "Reply",
    "Rewrite",
    "Split",
    "Stop",
    "StrictModel",
    "Subject",
    "TokenBucket",
    "attribution",
]


class StrictModel(BaseModel):
    """Every model of a fault file: unknown fields refused, values frozen, no infinity (a time of
    ``.inf`` would dump as null, which does not load back), and a number is a number: ``true``
    or ``"200"`` where one goes is refused (pydantic would read them as 1 and 200), while ``2.0``
    for a count still is one."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        changed = None
        for key in _number_fields(cls).intersection(data):
            value = data[key]
            if isinstance(value, bool | str):  # pydantic would read them as numbers
                changed = changed or dict(data)
                changed[key] = _NotANumber(value)
        return data if changed is None else changed


class _NotANumber:
    """What a boolean or a text in a number's place becomes before validation: a value that no
    number field takes (so it is refused where it is, as pydantic words it)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


@functools.cache
def _number_fields(model: type[BaseModel]) -> frozenset[str]:
    """The keys (names and aliases) of ``model``'s fields that hold a number (or None), but
    those that read a text themselves (a signal by name)."""
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        reads_text = any(isinstance(meta, _OWN_READING) for meta in info.metadata)
        if _holds_number(info.annotation) and not reads_text:
            keys.add(name)
            if info.alias:
                keys.add(info.alias)
    return frozenset(keys)


_OWN_READING = (BeforeValidator, PlainValidator, WrapValidator)


def _holds_number(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _holds_number(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        return bool(args) and all(_holds_number(arg) for arg in args)
    return annotation is int or annotation is float


class ActionModel(StrictModel):
    """The parameters of an action: a rule's ``do``. Subclasses set ``action`` to a Literal."""

    action: str


@value
class Subject:
    """What a rule can match on, for one message (an answer: its request's method and session)."""

    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    keyed: bool
    params: Any = None
    downstream: str = "stdio"
    """The Client's transport: ``stdio``, ``http`` or ``ws`` (HTTP-only actions need ``http``)."""


@value
class Fault:
    """What an action acts on: one message, as rules see it, and the experiment's random stream
    (every random decision is drawn from it, so the same seed gives the same faults); ``rule``
    is the name of the rule that fired (what an attributed error or status names)."""

    message: Message
    subject: Subject
    rng: random.Random
    rule: str = ""
    memory: dict[str, Any] = field(default_factory=dict)
    """What the rule's action keeps from one firing to the next (the engine's, per rule)."""


ATTRIBUTE_DESCRIPTION = (
    "say that the proxy injected it (`{rule, action}`); false imitates a real failure exactly"
)
"""The ``attribute`` field's description, for each action whose answer can say where it came
from."""


def attribution(fault: Fault, action: str) -> dict[str, str]:
    """What an attributed answer carries (an error's ``data.acpFault``, an HTTP status's
    ``Acp-Fault`` header): the rule that fired and its action, so that a test can tell an
    injected failure from a real one."""
    return {"rule": fault.rule, "action": action}


@value
class Stop:
    """The message goes no further; ``how`` it ended, as the trace says it."""

    how: Stopping


@value
class Reply:
    """The proxy answers the message's sender with ``data`` (a JSON-RPC message it wrote)."""

    data: bytes


@value
class Hold:
    """Forward the message ``seconds`` later; other messages keep flowing meanwhile. With
    ``passed``, sooner: once that many later messages in its direction have overtaken it."""

    seconds: float
    passed: int | None = None


@value
class Breakpoint:
    """Pause the message until the control API releases, drops or edits it, at most
    ``timeout`` seconds; then release it or drop it, as ``then`` says (:mod:`proxy.core.held`).
    Holds of other rules add up with its timeout."""

    timeout: float
    then: HeldThen


@value
class Pace:
    """Forward the message once the link (in its direction) has carried the bytes before it at
    ``bytes_per_second``: a :class:`TokenBucket` of ``burst`` bytes, one per rule and direction
    of each link. Holds of other rules add up with its wait."""

    bytes_per_second: float
    burst: int


@dataclass(slots=True)
class TokenBucket:
    """The bytes a link may still send at once in one direction for one ``bandwidth`` rule.

    It fills at ``rate`` bytes per second up to ``size`` (full at first). A message takes its
    bytes out, which may leave it in debt: the message waits until the debt is paid. A message
    larger than the bucket therefore waits as long as it takes the link to carry it, and each
    one's wait ends at least its own size's worth after the one before it (in order).
    """

    rate: float
    size: int
    tokens: float
    at: float
    holding: int | None = None
    """The timer of the last message it held back (the relay's: the next one goes behind it
    while it has not left)."""

    @classmethod
    def full(cls, rate: float, size: int, at: float) -> TokenBucket:
        """A bucket that has been idle: ``size`` bytes may go at once."""
        return cls(rate, size, float(size), at)

    def wait(self, size: int, at: float) -> float:
        """Seconds a message of ``size`` bytes arriving ``at`` would wait (nothing taken)."""
        return _waited(size - self._level(at), self.rate)

    def take(self, size: int, at: float) -> float:
        """Take ``size`` bytes at ``at``; the seconds the message waits."""
        self.tokens = self._level(at) - size
        self.at = max(at, self.at)
        return _waited(-self.tokens, self.rate)

    def _level(self, at: float) -> float:
        return min(self.tokens + max(at - self.at, 0.0) * self.rate, float(self.size))


MIN_WAIT = 1e-6
"""A wait shorter than this (a microsecond) is none: no timer, no ``held`` record."""


def _waited(debt: float, rate: float) -> float:
    """The seconds ``debt`` bytes take to pay at ``rate``; 0 under :data:`MIN_WAIT`."""
    seconds = debt / rate
    return seconds if seconds >= MIN_WAIT else 0.0


@value
class Freeze:
    """Nothing more goes on in the message's direction for ``seconds``, the message first (the
    connection stays open; the other direction flows). Then what was held goes on, in order; or,
    with ``sever``, the connection to those sides is cut and what was held is lost."""

    seconds: float
    sever: Literal["client", "agent", "both"] | None = None
    close_code: int = 1001


@value
class CloseLate:
    """From now on, the close of the connection toward the message's peer (the end of the other
    peer's stream, passed on) reaches that peer ``seconds`` late."""

    seconds: float


@value
class Copies:
    """Send ``count`` extra copies, ``gap`` seconds apart (after the message's own hold)."""

    count: int
    gap: float


@value
class Rewrite:
    """Forward ``transform(bytes)`` instead of the message (and of each copy). A request so
    rewritten that no peer can read its id is never answered: ``unreadable`` says so."""

    transform: Callable[[bytes], bytes]
    unreadable: bool = True


@value
class Split:
    """Write the message in pieces of ``sizes`` bytes (what is left after them: one more piece),
    ``gap`` seconds apart; what goes to the same peer after it waits for its last piece."""

    sizes: tuple[int, ...]
    gap: float


@value
class Cut:
    """Cut the connection to ``sides`` (both ways), ``before`` forwarding the message (then the
    message is lost and the queue discarded) or after it (what was queued is written first).
    ``close_code``: the WebSocket close code, where the connection is a WebSocket."""

    sides: Literal["client", "agent", "both"]
    before: bool
    close_code: int = 1001


@value
class CutShort:
    """Forward only the first ``size`` bytes of the message, then sever the peer it goes to."""

    size: int


@value
class KillStream:
    """The SSE stream that would carry the message is closed instead, and the message lost."""


@value
class Now:
    """Carry out ``command`` at once, whatever happens to the message."""

    command: Command


@value
class After:
    """Carry out ``command`` once the message was forwarded, ``delay`` seconds after that."""

    command: Command
    delay: float = 0.0


Effect = (
    Stop
    | Reply
    | Hold
    | Breakpoint
    | Pace
    | Freeze
    | CloseLate
    | Copies
    | Rewrite
    | Split
    | Cut
    | CutShort
    | KillStream
    | Now
    | After
)
"""What an action asks of the relay (a closed set: the relay handles each exhaustively)."""

M = TypeVar("M", bound=ActionModel)


def _always(_params: Any, _subject: Subject) -> bool:
    return True


def _no_notes(_params: Any) -> list[tuple[str, str]]:
    return []


@value
class Action(Generic[M]):
    """One fault action, as the registry holds it."""

    model: type[M]
    """The parameters: the ``do`` of a rule."""
    apply: Callable[[M, Fault], Sequence[Effect]]
    """The effects of the action on one message (pure: the random stream comes in the fault)."""
    summary: str
    """What it does, in a sentence (the docs and ``acp-proxy schema`` show it)."""
    applies: Callable[[M, Subject], bool] = _always
    """Whether it can act on a message of this shape at all (an ``error`` answers only requests):
    a rule whose action cannot act on a message does not match it."""
    needs_http: bool = False
    """It acts only on Clients that connect over Streamable HTTP (warned at load elsewhere)."""
    notes: Callable[[M], list[tuple[str, str]]] = _no_notes
    """What a rule's author should hear of these parameters: ``(field, message)`` pairs."""

    @property
    def name(self) -> str:
        """The action's name, as ``do.action`` spells it."""
        literal = self.model.model_fields["action"].annotation
        (name,) = getattr(literal, "__args__", (None,))
        if not isinstance(name, str):
            raise TypeError(f"{self.model.__name__}.action must be a Literal of one string")
        return name
