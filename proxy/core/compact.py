"""A parsed message made small enough to cross a process boundary: what a parsing worker returns.

Parsing builds one Python object per JSON value while holding the interpreter: a 60 MB message of
millions of small containers takes seconds, and the proxy's other links, its control API and its
timers would wait for it. The shell therefore parses a large message in a worker process
(:mod:`proxy.shell.parsing`), which sends back, instead of the message, what the relay reads of
it:

* its classification, ids, id spans, method and session, exactly as
  :func:`~proxy.core.jsonrpc.parse` makes them (a batch's elements with their spans in it);
* a bounded copy of its body: at most :data:`MAX_VALUES` values, :data:`MAX_DEPTH` levels, strings
  and keys of at most :data:`MAX_STRING` characters. A value past a bound is an :class:`Elided`,
  which no ``params`` pattern of a fault rule matches (it equals nothing but itself);
* the digest the ledger takes of a prompt (``session/prompt``'s ``params.prompt``, a
  ``session/update``'s ``params.update.content``), computed from the whole value, so the ledger's
  checks see a large prompt as they see a small one.

Unpickling that copy costs the event loop a bounded time whatever the message holds. The bytes
are not sent back: :func:`restore` attaches the ones the shell kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from proxy.core import acp
from proxy.core.jsonrpc import Batch, Invalid, Message, parse
from proxy.core.ledger import prompt_hash
from proxy.core.splice import Span, array_elements

__all__ = [
    "MAX_DEPTH",
    "MAX_STRING",
    "MAX_VALUES",
    "Compacted",
    "Elided",
    "compact",
    "content_of",
    "parse_compacted",
    "restore",
]

MAX_VALUES = 10_000
"""The most values (containers, strings, numbers...) a compacted body keeps."""
MAX_STRING = 64 * 1024
"""The longest string (or key) a compacted body keeps, in characters."""
MAX_DEPTH = 64
"""The deepest nesting a compacted body keeps."""


@dataclass(frozen=True, slots=True)
class Elided:
    """A value left out of a compacted body: too long, too deep, or past :data:`MAX_VALUES`."""

    type: str
    """The JSON type of the value left out: ``string``, ``array`` or ``object``."""
    size: int
    """Its length: characters of a string, members of an object, elements of an array."""


@dataclass(frozen=True, slots=True)
class Compacted:
    """What a worker returns for one message: its parse without its bytes."""

    parsed: Message | Batch | Invalid
    """The parse, with empty ``raw`` fields and bounded bodies."""
    spans: tuple[Span, ...] = ()
    """A batch's elements, where each sits in the message."""


def content_of(message: Message) -> Any:
    """The value whose digest the ledger takes: a prompt's ``params.prompt``, an update's
    ``params.update.content`` (``None`` for other messages)."""
    params = message.params
    if not isinstance(params, dict):
        return None
    if message.method == acp.PROMPT:
        return params.get("prompt")
    update = params.get("update")
    if message.method == acp.SESSION_UPDATE and isinstance(update, dict):
        return update.get("content")
    return None


def parse_compacted(raw: bytes) -> Compacted:
    """Parse ``raw`` and compact the result (run in the worker; never raises)."""
    parsed = parse(raw)
    if isinstance(parsed, Batch):
        spans = tuple(array_elements(raw))
        elements = tuple(map(compact, parsed.elements))
        return Compacted(replace(parsed, raw=b"", elements=elements), spans)
    return Compacted(compact(parsed))


def compact(parsed: Message | Invalid) -> Message | Invalid:
    """``parsed`` without its bytes, with a bounded body and its content's digest."""
    if isinstance(parsed, Invalid):
        return replace(parsed, raw=b"")
    content = content_of(parsed)
    digest = None if content is None else prompt_hash(content)
    body = _bounded(parsed.body, [MAX_VALUES], 0)
    assert isinstance(body, dict)  # a message's body is an object, and objects come first
    return replace(parsed, raw=b"", body=body, content_digest=digest)


def restore(compacted: Compacted, raw: bytes) -> Message | Batch | Invalid:
    """The parse of ``raw`` a worker compacted, with ``raw`` attached again."""
    parsed = compacted.parsed
    if isinstance(parsed, Batch):
        elements = tuple(
            replace(element, raw=raw[start:end])
            for element, (start, end) in zip(parsed.elements, compacted.spans, strict=True)
        )
        return replace(parsed, raw=raw, elements=elements)
    return replace(parsed, raw=raw)


def _bounded(value: Any, room: list[int], depth: int) -> Any:
    """A copy of ``value`` within the bounds; ``room[0]`` is how many more values it may hold."""
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else Elided("string", len(value))
    if isinstance(value, dict):
        if depth >= MAX_DEPTH or len(value) > room[0]:
            return Elided("object", len(value))
        if any(len(key) > MAX_STRING for key in value):
            return Elided("object", len(value))
        room[0] -= len(value)
        return {key: _bounded(item, room, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        if depth >= MAX_DEPTH or len(value) > room[0]:
            return Elided("array", len(value))
        room[0] -= len(value)
        return [_bounded(item, room, depth + 1) for item in value]
    return value
