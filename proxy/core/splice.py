"""Locate JSON members in raw bytes and splice new values in, leaving every other byte alone.

DESIGN 5.2: apart from the ``id`` member, a forwarded message is byte-identical to what arrived.
Re-serialising would reorder keys, change escapes, turn ``1e400`` into ``Infinity`` and collapse
duplicate keys, so the relay never does it. Instead this module walks the *structure* of a
message that is already known to be valid JSON (it has been parsed first) and reports the byte
span of a member's value, which the caller replaces.

Rules of this module:

* Input is valid JSON. The scanner does not validate; on malformed input it may return
  ``None`` or raise ``ValueError``, and callers parse before they scan, but for one: looking
  for the id a lenient peer would read in bytes that did not parse (``jsonrpc``), which
  catches the ``ValueError``.
* Its cost is linear in the size of the input with a small constant, and bounded, whatever
  the input's shape: strings are skipped with ``bytes.find`` and containers with one match of
  a compiled pattern (possessive, so it never backtracks) that covers :data:`_SHALLOW` levels
  of nesting; only the members read and the brackets of deeper containers (a run of them at a
  time) take a step of Python each, and a walk takes at most :data:`MAX_STEPS` of them, or
  raises :class:`ScanLimit` (a ``ValueError``). 60 MB of ``[[[[...]]]]`` take two steps.
* Keys are compared after JSON unescaping: ``"\\u0069d"`` is the key ``id``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from typing import Final

from proxy.core.search import BACKSLASH, COLON, SPACE

__all__ = [
    "MAX_STEPS",
    "ScanLimit",
    "Span",
    "array_elements",
    "find_member",
    "member_spans",
    "members",
    "meta_edits",
    "splice",
    "without_member",
]

Span = tuple[int, int]
"""A half-open byte range ``[start, end)`` in a message."""

_WS: Final = re.compile(rb"[ \t\n\r]*")
_WS_BYTES: Final = b" \t\n\r"
"""JSON's whitespace (``raw[i] in _WS_BYTES``: a byte's value, found with ``memchr``)."""
_SCALAR: Final = re.compile(rb"[^,\]}\s]+")
_SCALAR_ENDS: Final = b",]} \t\n\r\x0b\x0c"
"""What ends a scalar (:data:`_SCALAR`'s complement: ``\\s`` of bytes is these six)."""
_SHORT_SCALAR: Final = 24
"""Bytes of a scalar stepped one by one before the pattern takes over (a long number)."""

MAX_STEPS: Final = 100_000
"""The most steps one walk may take, so that no message costs more than a bounded stretch of
Python however it is shaped. A step is a member read, or a run of brackets that the compiled
pattern does not skip (a container nested more than :data:`_SHALLOW` levels below the one being
walked is entered or left in a step, and so is any depth of brackets in a row: ``[[[[...]]]]``
takes two). Real ACP messages take a handful: their few top-level members are read one by one
and everything inside them is skipped by one regular-expression match."""
_SHALLOW: Final = 8
"""Nesting levels that one match of :data:`_RUN` skips."""


class ScanLimit(ValueError):
    """The bytes need more than :data:`MAX_STEPS` steps to walk.

    :attr:`keys` holds the keys of the members of the object being walked that were met before
    the limit (the one whose value was being skipped included), when they are known.
    """

    keys: frozenset[str]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.keys = frozenset()


def _shallow_run(levels: int) -> re.Pattern[bytes]:
    """A pattern that skips, in one match, the values, separators and strings at one level and
    every container nested at most ``levels`` deep inside them, stopping before anything else:
    the bracket that closes the current container, a container nested deeper, an unterminated
    string or the end. Possessive quantifiers: no backtracking, linear time."""
    string = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    atom = rb'[^"\[\]{}]++|' + string
    level = atom
    for _ in range(levels):
        level = atom + rb"|[\[{](?:" + level + rb")*+[\]}]"
    return re.compile(rb"(?s)(?:" + level + rb")*+")


_RUN: Final = _shallow_run(_SHALLOW)
_OPENERS: Final = re.compile(rb"[\[{]+")
_CLOSERS: Final = re.compile(rb"[\]}]+")
_STRING: Final = re.compile(rb'(?s)"[^"\\]*+(?:\\.[^"\\]*+)*+"')


class _Steps:
    """The step budget of one walk (:data:`MAX_STEPS`)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_STEPS

    def take(self, at: int) -> None:
        self.left -= 1
        if self.left < 0:
            raise ScanLimit(f"more than {MAX_STEPS} nested containers or members (at byte {at})")


def _skip_ws(raw: bytes, pos: int) -> int:
    match = _WS.match(raw, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _string_end(raw: bytes, pos: int) -> int:
    """The offset just past the string whose opening quote is at ``pos``.

    Jumps to the next quote with ``bytes.find`` (memchr speed: a 64 KiB string costs a few
    microseconds, where a regular expression walks it byte by byte); a quote right after a
    backslash may be escaped, and then one match of the string pattern settles it in linear
    time, however many backslashes there are.
    """
    quote = raw.find(b'"', pos + 1)
    if quote < 0:
        raise ValueError(f"unterminated string at byte {pos}")
    if raw[quote - 1] != 0x5C:  # no backslash before it: the string ends here
        return quote + 1
    match = _STRING.match(raw, pos)
    if match is None:
        raise ValueError(f"unterminated string at byte {pos}")
    return match.end()


def _skip_value(raw: bytes, pos: int, steps: _Steps | None = None) -> int:
    """Return the offset just past the JSON value starting at ``pos`` (a container's members
    counted in ``steps``, a budget of their own when none is given)."""
    first = raw[pos : pos + 1]
    if first == b'"':
        return _string_end(raw, pos)
    if first in (b"{", b"["):
        return _container_end(raw, pos, _Steps() if steps is None else steps)
    end = pos
    size = len(raw)
    while end < size and raw[end] not in _SCALAR_ENDS and end - pos < _SHORT_SCALAR:
        end += 1  # a number, true, false or null: a few bytes, stepped (cheaper than a pattern)
    if end < size and end - pos >= _SHORT_SCALAR:
        match = _SCALAR.match(raw, pos)
        assert match is not None  # the first byte is no end: one at least
        end = match.end()
    if end == pos:
        raise ValueError(f"no JSON value at byte {pos}")
    return end


def _container_end(raw: bytes, pos: int, steps: _Steps) -> int:
    """The offset just past the container whose bracket is at ``pos``.

    One match of :data:`_RUN` skips everything up to :data:`_SHALLOW` levels deep; the loop
    steps only over the brackets of containers nested deeper, a run of them at a time, and
    counts each step against the budget.
    """
    depth = 0
    index = pos
    while True:
        char = raw[index : index + 1]
        if char in (b"[", b"{"):
            run = _OPENERS.match(raw, index)
            assert run is not None  # it starts with an opening bracket
            depth += run.end() - index
            index = run.end()
        elif char in (b"]", b"}"):
            run = _CLOSERS.match(raw, index)
            assert run is not None  # it starts with a closing bracket
            if run.end() - index >= depth:
                return index + depth
            depth -= run.end() - index
            index = run.end()
        elif char == b'"':
            raise ValueError(f"unterminated string at byte {index}")
        else:
            raise ValueError(f"unterminated container at byte {pos}")
        steps.take(index)
        skipped = _RUN.match(raw, index)
        assert skipped is not None  # the pattern matches the empty string
        index = skipped.end()


def _decode_key(raw: bytes, start: int, end: int) -> str:
    body = raw[start + 1 : end - 1]
    if BACKSLASH in body:
        decoded: str = json.loads(raw[start:end])
        return decoded
    return body.decode("utf-8", "surrogatepass")


def _members(raw: bytes, pos: int, steps: _Steps) -> Iterator[tuple[str, Span]]:
    """Yield ``(key, value span)`` for each member of the object whose ``{`` is at ``pos``."""
    index = _skip_ws(raw, pos + 1)
    if raw[index : index + 1] == b"}":
        return
    while True:
        steps.take(index)
        key_end = _string_end(raw, index)
        key = _decode_key(raw, index, key_end)
        index = _skip_ws(raw, key_end)
        if raw[index : index + 1] != b":":
            raise ValueError(f"expected ':' at byte {index}")
        value_start = _skip_ws(raw, index + 1)
        try:
            value_end = _skip_value(raw, value_start, steps)
        except ScanLimit as exc:
            exc.keys = exc.keys.union((key,))
            raise
        yield key, (value_start, value_end)
        index = _skip_ws(raw, value_end)
        separator = raw[index : index + 1]
        if separator == b"}":
            return
        if separator != b",":
            raise ValueError(f"expected ',' or '}}' at byte {index}")
        index = _skip_ws(raw, index + 1)


def member_spans(raw: bytes, key: str, start: int = 0, *, present: bool = False) -> list[Span]:
    """Spans of every value of ``key`` in the object at ``start`` (duplicates included).

    JSON parsers disagree on which duplicate wins, so the relay rewrites all of them.
    Returns an empty list when the value at ``start`` is not an object.

    ``present``: the caller has parsed ``raw`` (the whole of it, ``start`` 0) and knows the
    object has ``key``. Then, when ``"key"`` occurs only once in the bytes and no ``\\u``
    escape could spell it another way, that occurrence is the member: its value is found
    without walking the members before and after it (see :func:`_sole_member`).
    """
    if present and start == 0:
        span = _sole_member(raw, key)
        if span is not None:
            return [span]
    return members(raw, start).get(key, [])


def members(raw: bytes, start: int = 0) -> dict[str, list[Span]]:
    """The value spans of every member of the object at ``start``, by key (duplicates in order),
    in one walk; empty when the value at ``start`` is not an object."""
    pos = _skip_ws(raw, start)
    if raw[pos : pos + 1] != b"{":
        return {}
    found: dict[str, list[Span]] = {}
    try:
        for name, span in _members(raw, pos, _Steps()):
            found.setdefault(name, []).append(span)
    except ScanLimit as exc:
        exc.keys = exc.keys.union(found)
        raise
    return found


_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_]+\Z")


def _sole_member(raw: bytes, key: str) -> Span | None:
    """The value span of ``key`` in the top-level object that is known to have it, or ``None``.

    A key of letters, digits and ``_`` can be written only literally or with ``\\uXXXX``
    escapes of its characters. Without such escapes in ``raw``, the member that is known to
    exist accounts for one occurrence of ``"key"``; when there is no other, that occurrence is
    the member (whatever else holds the same bytes, inside a string or a nested object, would
    be a second occurrence). ``None`` when the fast path cannot decide: the caller walks.
    """
    known = _key_patterns(key)
    if known is None:
        return None
    needle, member = known
    at = raw.find(needle)
    if at < 0:
        return None
    value_start = at + len(needle) + 1
    size = len(raw)
    plain = value_start < size and raw[value_start - 1] == COLON
    if plain and raw[value_start] == SPACE:
        value_start += 1  # ": ", as Python's json.dumps writes it by default
        plain = value_start < size
    if not plain or raw[value_start] in _WS_BYTES:
        match = member.match(raw, at)  # other whitespace around the colon (compact JSON has none)
        if match is None:
            return None
        value_start = match.end()
    if len(raw) <= _SHORT:
        again = raw.find(needle, at + 1) >= 0
    else:
        again = _occurs_from(raw, needle, at + 1)
    if again or (BACKSLASH in raw and _escapes_of(key).search(raw)):
        return None
    return value_start, _skip_value(raw, value_start)


_SHORT: Final = 4096
"""Up to this size a plain substring search beats hopping from quote to quote."""


@functools.cache
def _key_patterns(key: str) -> tuple[bytes, re.Pattern[bytes]] | None:
    """``"key"`` and a pattern of it followed by its colon, for a plain key; else ``None``."""
    if not _PLAIN_KEY.match(key):
        return None
    needle = b'"' + key.encode() + b'"'
    return needle, re.compile(re.escape(needle) + rb"[ \t\n\r]*:[ \t\n\r]*")


def _occurs_from(raw: bytes, needle: bytes, start: int) -> bool:
    """Whether ``needle`` (which starts with a quote) occurs in ``raw`` from ``start`` on.

    Hops from quote to quote with ``bytes.find`` of one byte (memchr: a 64 KiB text costs about
    a microsecond, where a search for several bytes steps a few bytes at a time); a message
    with many strings is left to the substring search after a few dozen quotes.
    """
    index = start
    for _ in range(64):
        quote = raw.find(b'"', index)
        if quote < 0:
            return False
        if raw.startswith(needle, quote):
            return True
        index = quote + 1
    return raw.find(needle, index) >= 0


@functools.cache
def _escapes_of(key: str) -> re.Pattern[bytes]:
    """``\\uXXXX`` escapes of any character of ``key``, in either case of hex digits."""
    forms = b"|".join(b"%04x" % ord(char) for char in sorted(set(key)))
    return re.compile(rb"\\u(?:" + forms + rb")", re.IGNORECASE)


def find_member(raw: bytes, path: Sequence[str], start: int = 0) -> Span | None:
    """Span of the value at ``path`` (``("params", "requestId")``), or ``None`` if absent.

    At each level the last duplicate wins, as in the parsers the relay uses.
    """
    span: Span = (start, len(raw))
    for key in path:
        spans = member_spans(raw, key, span[0])
        if not spans:
            return None
        span = spans[-1]
    return span


def without_member(raw: bytes, path: Sequence[str], key: str) -> bytes | None:
    """``raw`` without the members ``key`` of the object at ``path`` (``("params", "_meta")``),
    every other byte as it was but the separators between that object's members, which become
    single commas; ``None`` when there is no such object or no such member."""
    span = find_member(raw, path) if path else (0, len(raw))
    if span is None or raw[span[0] : span[0] + 1] != b"{":
        return None
    start = span[0]
    kept: list[bytes] = []
    found = False
    for name, key_start, value_end in _entries(raw, start, _Steps()):
        if name == key:
            found = True
        else:
            kept.append(raw[key_start:value_end])
    if not found:
        return None
    return splice(raw, [(span, b"{" + b",".join(kept) + b"}")])


def meta_edits(raw: bytes, fields: Sequence[tuple[str, str]]) -> list[tuple[Span, bytes]]:
    """The edits (for :func:`splice`) that set each string member ``(name, value)`` of
    ``fields`` in the message's ``params._meta``: a member already there has its value
    replaced, a missing one is added first in ``_meta``, a missing ``_meta`` is added first in
    ``params``; every other byte stays. No edits when ``params`` or ``_meta`` is there but not
    an object, or the message is too deep to walk."""
    try:
        params = find_member(raw, ("params",))
        if params is None or raw[params[0] : params[0] + 1] != b"{":
            return []
        meta = find_member(raw, ("_meta",), params[0])
        if meta is not None and raw[meta[0] : meta[0] + 1] != b"{":
            return []  # a _meta that is not an object is the sender's business: left alone
        edits: list[tuple[Span, bytes]] = []
        added: list[bytes] = []
        for name, value in fields:
            encoded = json.dumps(value).encode()
            found = None if meta is None else find_member(raw, (name,), meta[0])
            if found is None:
                added.append(json.dumps(name).encode() + b":" + encoded)
            else:
                edits.append((found, encoded))
    except ScanLimit:
        return []
    if added:
        opening = params[0] if meta is None else meta[0]
        inserted = b",".join(added)
        if meta is None:
            inserted = b'"_meta":{' + inserted + b"}"
        first = _skip_ws(raw, opening + 1)
        if raw[first : first + 1] != b"}":  # members follow
            inserted += b","
        edits.append(((opening + 1, opening + 1), inserted))
    return edits


def _entries(raw: bytes, pos: int, steps: _Steps) -> Iterator[tuple[str, int, int]]:
    """``(key, where its key starts, where its value ends)`` for each member of the object at
    ``pos``."""
    index = _skip_ws(raw, pos + 1)
    if raw[index : index + 1] == b"}":
        return
    for key, (_, value_end) in _members(raw, pos, steps):
        yield key, index, value_end
        index = _skip_ws(raw, value_end)
        if raw[index : index + 1] == b",":
            index = _skip_ws(raw, index + 1)


def array_elements(raw: bytes, start: int = 0) -> list[Span]:
    """Spans of the elements of the array at ``start``; empty if it is not an array."""
    index = _skip_ws(raw, start)
    if raw[index : index + 1] != b"[":
        return []
    spans: list[Span] = []
    index = _skip_ws(raw, index + 1)
    if raw[index : index + 1] == b"]":
        return spans
    steps = _Steps()
    while True:
        steps.take(index)
        end = _skip_value(raw, index, steps)
        spans.append((index, end))
        index = _skip_ws(raw, end)
        separator = raw[index : index + 1]
        if separator == b"]":
            return spans
        if separator != b",":
            raise ValueError(f"expected ',' or ']' at byte {index}")
        index = _skip_ws(raw, index + 1)


_COPY_SLICES_BELOW: Final = 4096
"""Messages up to this size are spliced from slices of their bytes (cheaper than a view's)."""


def splice(raw: bytes, edits: Sequence[tuple[Span, bytes]]) -> bytes:
    """Return ``raw`` with each span of ``edits`` replaced by its bytes.

    Edits may come in any order but must not overlap.
    """
    if not edits:
        return raw
    # Slices of a view are not copies: a large message is copied once, by the join.
    source = memoryview(raw) if len(raw) > _COPY_SLICES_BELOW else raw
    parts: list[bytes | memoryview] = []
    previous = 0
    for (start, end), value in sorted(edits, key=lambda edit: edit[0]):
        parts.append(source[previous:start])
        parts.append(value)
        previous = end
    parts.append(source[previous:])
    return b"".join(parts)
