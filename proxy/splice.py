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
* It only jumps between structural bytes (quotes, brackets, braces) using compiled regular
  expressions, so a 64 MiB string value costs one regex match, not a Python loop per byte.
* Keys are compared after JSON unescaping: ``"\\u0069d"`` is the key ``id``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence

__all__ = [
    "Span",
    "array_elements",
    "find_member",
    "member_spans",
    "members",
    "splice",
]

Span = tuple[int, int]
"""A half-open byte range ``[start, end)`` in a message."""

_WS = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb"[^,\]}\s]+")
_STRUCTURAL = re.compile(rb'["\[\]{}]')


def _skip_ws(raw: bytes, pos: int) -> int:
    match = _WS.match(raw, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _string_end(raw: bytes, pos: int) -> int:
    """The offset just past the string whose opening quote is at ``pos``.

    Jumps from quote to quote with ``bytes.find`` (memchr speed: a 64 KiB string costs a few
    microseconds, where a regular expression walks it byte by byte) and counts the backslashes
    before each quote: an odd number escapes it.
    """
    index = pos + 1
    while True:
        quote = raw.find(b'"', index)
        if quote < 0:
            raise ValueError(f"unterminated string at byte {pos}")
        before = quote - 1
        while raw[before] == 0x5C:  # backslash
            before -= 1
        if (quote - 1 - before) % 2 == 0:
            return quote + 1
        index = quote + 1


def _skip_value(raw: bytes, pos: int) -> int:
    """Return the offset just past the JSON value starting at ``pos``."""
    first = raw[pos : pos + 1]
    if first == b'"':
        return _string_end(raw, pos)
    if first in (b"{", b"["):
        depth = 1
        index = pos + 1
        while depth:
            match = _STRUCTURAL.search(raw, index)
            if match is None:
                raise ValueError(f"unterminated container at byte {pos}")
            at = match.start()
            char = raw[at]
            if char == 0x22:  # '"'
                index = _string_end(raw, at)
                continue
            depth += 1 if char in (0x7B, 0x5B) else -1  # '{' '['
            index = at + 1
        return index
    match = _SCALAR.match(raw, pos)
    if match is None:
        raise ValueError(f"no JSON value at byte {pos}")
    return match.end()


def _decode_key(raw: bytes, start: int, end: int) -> str:
    body = raw[start + 1 : end - 1]
    if b"\\" in body:
        decoded: str = json.loads(raw[start:end])
        return decoded
    return body.decode("utf-8", "surrogatepass")


def _members(raw: bytes, pos: int) -> Iterator[tuple[str, Span]]:
    """Yield ``(key, value span)`` for each member of the object whose ``{`` is at ``pos``."""
    index = _skip_ws(raw, pos + 1)
    if raw[index : index + 1] == b"}":
        return
    while True:
        key_end = _string_end(raw, index)
        key = _decode_key(raw, index, key_end)
        index = _skip_ws(raw, key_end)
        if raw[index : index + 1] != b":":
            raise ValueError(f"expected ':' at byte {index}")
        value_start = _skip_ws(raw, index + 1)
        value_end = _skip_value(raw, value_start)
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
    for name, span in _members(raw, pos):
        found.setdefault(name, []).append(span)
    return found


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_]+\Z")


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
    match = member.match(raw, at)
    if match is None:
        return None
    if len(raw) <= _SHORT:
        again = raw.find(needle, at + 1) >= 0
    else:
        again = _occurs_from(raw, needle, at + 1)
    if again or (b"\\" in raw and _escapes_of(key).search(raw)):
        return None
    value_start = match.end()
    return value_start, _skip_value(raw, value_start)


_SHORT = 4096
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


def array_elements(raw: bytes, start: int = 0) -> list[Span]:
    """Spans of the elements of the array at ``start``; empty if it is not an array."""
    index = _skip_ws(raw, start)
    if raw[index : index + 1] != b"[":
        return []
    spans: list[Span] = []
    index = _skip_ws(raw, index + 1)
    if raw[index : index + 1] == b"]":
        return spans
    while True:
        end = _skip_value(raw, index)
        spans.append((index, end))
        index = _skip_ws(raw, end)
        separator = raw[index : index + 1]
        if separator == b"]":
            return spans
        if separator != b",":
            raise ValueError(f"expected ',' or ']' at byte {index}")
        index = _skip_ws(raw, index + 1)


def splice(raw: bytes, edits: Sequence[tuple[Span, bytes]]) -> bytes:
    """Return ``raw`` with each span of ``edits`` replaced by its bytes.

    Edits may come in any order but must not overlap.
    """
    if not edits:
        return raw
    parts: list[bytes] = []
    previous = 0
    for (start, end), value in sorted(edits, key=lambda edit: edit[0]):
        parts.append(raw[previous:start])
        parts.append(value)
        previous = end
    parts.append(raw[previous:])
    return b"".join(parts)
