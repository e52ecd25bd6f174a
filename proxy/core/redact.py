"""Redaction of secrets from recorded messages (``acp-proxy run --record FILE --redact PATTERN``).

A pattern is either a JSON path or a regular expression:

* a **path** names members from the message's top: keys joined by dots, ``[*]`` for every
  element of an array, ``[N]`` for one, ``*`` for every member of an object
  (``params.prompt[*].text``, ``params._meta.*``). The value there, whatever it is, becomes the
  string :data:`REDACTED`.
* a **regular expression** (Python's ``re``) is searched in every string value of the message
  (keys are names, not data: left alone); each match becomes :data:`REDACTED`.

A pattern made only of names, dots and brackets, with at least one dot or bracket, is a path;
anything else is a regular expression. ``path:`` or ``re:`` in front says which it is. An
expression that matches the empty string (``z*``) is refused: it would mark every gap between two
characters; an empty match of any other (a lookahead alone) is never replaced.

The message's own ``id`` is redacted whole when a pattern names it (a regular expression found
in it, or a path ``id`` or ``*``): it becomes :data:`REDACTED`, ``#`` and a digest of the id keyed
by the redactor's ``key`` (:meth:`Redactor.redact_id`), the same for the same id, so a request
and its answer still pair up and two ids stay two; the recording gives its line's ``id`` and
``forwarded_id`` the same treatment. Nothing of the secret is left, and the digest, keyed by a
key of the run that is never written, cannot be tried against guesses.

A recording's header says what was redacted without a secret (:meth:`Pattern.describe`): a path
as it is (structure, not data), a regular expression by a digest of its text only.

The message is changed in place in its bytes (:mod:`proxy.core.splice`): only the values
redacted are written again, every other byte stays as it came. :meth:`Redactor.redact` says
where it changed (``params.prompt[0].text``), which the recording writes beside the message.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.core.errors import OptionError
from proxy.core.splice import Span, array_elements, find_member, members, splice

__all__ = [
    "DIGEST_CHARS",
    "MAX_DEPTH",
    "REDACTED",
    "Pattern",
    "Redaction",
    "Redactor",
    "TooDeep",
    "parse_pattern",
]

REDACTED = "[redacted]"
"""What a redacted value (or a redacted match in a string) becomes."""
MAX_DEPTH = 64
"""Levels of nesting an expression's walk enters; a message with a container deeper is not
redacted (:class:`TooDeep`): its writer leaves it out rather than write what was not searched."""
DIGEST_CHARS = 12
"""Hexadecimal characters of a digest (a redacted id's, a regular expression's in the header)."""

_STEP = re.compile(r"\.?([A-Za-z_$][\w$-]*|\*)|\[(\*|\d+)\]")
_LOOKS_LIKE_PATH = re.compile(r"[A-Za-z_$][\w$-]*(\.([A-Za-z_$][\w$-]*|\*)|\[(\*|\d+)\])+\Z")


@dataclass(frozen=True, slots=True)
class Redaction:
    """What a recording's header says of one pattern: a ``path`` and the path itself, or a
    ``regex`` and a digest of its text (never the text: it may be the secret)."""

    kind: Literal["path", "regex"]
    value: str
    """The path, or the expression's digest (:data:`DIGEST_CHARS` hexadecimal characters of its
    SHA-256)."""

    @classmethod
    def of_text(cls, text: str) -> Redaction:
        """The redaction of the pattern ``text`` (not compiled: an older recording's header
        listed the patterns themselves, which are read back so)."""
        if _is_path(text):
            return cls("path", text.removeprefix("path:"))
        digest = hashlib.sha256(text.removeprefix("re:").encode("utf-8", "surrogatepass"))
        return cls("regex", digest.hexdigest()[:DIGEST_CHARS])

    @classmethod
    def of_json(cls, value: Any) -> Redaction:
        """A header's entry: ``{"kind": "path", "path": P}``, ``{"kind": "regex", "digest":
        D}`` or (an older recording) the pattern's text; :class:`ValueError` for anything else."""
        if isinstance(value, str):
            return cls.of_text(value)
        if isinstance(value, dict):
            kind = value.get("kind")
            if kind == "path" and isinstance(value.get("path"), str):
                return cls("path", value["path"])
            if kind == "regex" and isinstance(value.get("digest"), str):
                return cls("regex", value["digest"])
        raise ValueError(
            f"not a redaction (a path, or a regular expression's digest): {value!r:.60}"
        )

    def to_json(self) -> dict[str, str]:
        """The header's entry."""
        return {"kind": self.kind, "path" if self.kind == "path" else "digest": self.value}


@dataclass(frozen=True, slots=True)
class Pattern:
    """One ``--redact`` pattern: a path (its steps) or a regular expression."""

    text: str
    steps: tuple[str, ...] | None = None
    """The path's steps (a key, ``*``, ``[*]`` or ``[N]``); ``None`` for a regular expression."""
    regex: re.Pattern[str] | None = None

    def describe(self) -> Redaction:
        """What the recording's header says of it (no secret: see :class:`Redaction`)."""
        return Redaction.of_text(self.text)


def _is_path(text: str) -> bool:
    return text.startswith("path:") or (
        not text.startswith("re:") and _LOOKS_LIKE_PATH.match(text) is not None
    )


def parse_pattern(text: str, option: str = "--redact") -> Pattern:
    """The pattern ``text`` (see the module); :class:`~proxy.core.errors.OptionError` naming
    ``option`` when it is neither a path nor a regular expression, or an expression that matches
    the empty string."""
    if _is_path(text):
        path = text.removeprefix("path:")
        steps: list[str] = []
        position = 0
        while position < len(path):
            match = _STEP.match(path, position)
            if match is None or (position == 0 and match.group(0).startswith(".")):
                where = f"character {position + 1}"
                raise OptionError(f"not a JSON path at {where}: {path!r}", option)
            steps.append(match.group(1) if match.group(1) is not None else f"[{match.group(2)}]")
            position = match.end()
        if not steps:
            raise OptionError("an empty JSON path", option)
        return Pattern(text, steps=tuple(steps))
    expression = text.removeprefix("re:")
    if not expression:
        raise OptionError("an empty regular expression", option)
    try:
        regex = re.compile(expression)
    except re.error as exc:
        raise OptionError(f"not a regular expression ({exc}): {expression!r}", option) from None
    if regex.search("") is not None:
        raise OptionError(
            f"{expression!r} matches the empty string: it would mark every gap between two "
            "characters; give an expression that needs at least one character",
            option,
        )
    return Pattern(text, regex=regex)


class TooDeep(ValueError):
    """A message nested deeper than :data:`MAX_DEPTH` levels: its strings were not all
    searched."""


class Redactor:
    """Replaces what its patterns name in a message's JSON text; ``key`` keys the digests of
    redacted ids (a recording's writer gives a random one of its run)."""

    def __init__(self, patterns: Sequence[Pattern], *, key: bytes = b"") -> None:
        self.patterns = tuple(patterns)
        self._paths = [p.steps for p in self.patterns if p.steps is not None]
        self._regexes = [p.regex for p in self.patterns if p.regex is not None]
        self._ids_named = any(steps in (("id",), ("*",)) for steps in self._paths)
        """Whether a path names the message's ``id`` (every id is then redacted)."""
        self._key = key

    @classmethod
    def of(cls, texts: Sequence[str], *, key: bytes = b"") -> Redactor:
        """A redactor of the patterns ``texts`` (:func:`parse_pattern` each)."""
        return cls([parse_pattern(text) for text in texts], key=key)

    def redact_id(self, token: bytes | None) -> bytes | None:
        """The id whose JSON text is ``token`` as a recording writes it: the marker, ``#`` and
        its keyed digest when a pattern names it (see the module), else ``token`` itself."""
        if token is None or not self._id_named(token):
            return token
        value = orjson.loads(token)
        text = value if isinstance(value, str) else token.decode("utf-8", "surrogateescape")
        digest = hmac.new(self._key, text.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return orjson.dumps(f"{REDACTED}#{digest.hexdigest()[:DIGEST_CHARS]}")

    def _id_named(self, token: bytes) -> bool:
        if self._ids_named:
            return True
        if not self._regexes or not token.startswith(b'"'):
            return False
        text = orjson.loads(token)
        return any(_found(regex, text) for regex in self._regexes)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def redact(self, raw: bytes) -> tuple[bytes, list[str]]:
        """``raw`` (one JSON object) with what the patterns name replaced, and the paths changed
        in the order they come in it (empty, and ``raw`` itself, when nothing was). A value two
        paths name, or one inside another's, is replaced once, as a whole. Linear in the size of
        the message but for the expressions' own cost. A message too large to walk raises a
        ``ValueError``: :class:`~proxy.core.splice.ScanLimit` (more members or elements than
        :data:`~proxy.core.splice.MAX_STEPS` in one container), or, searched by an expression,
        :class:`TooDeep`."""
        if not self.patterns:
            return raw, []
        named: list[tuple[Span, str, bytes]] = []
        id_span = find_member(raw, ("id",))
        if id_span is not None:
            token = raw[id_span[0] : id_span[1]]
            redacted_id = self.redact_id(token)
            if redacted_id is not None and redacted_id != token:
                named.append((id_span, "id", redacted_id))
        marker = orjson.dumps(REDACTED)
        for steps in self._paths:
            named.extend(
                (span, where, marker) for where, span in _at_path(raw, (0, len(raw)), steps, "")
            )
        edits = _outermost(named)
        if self._regexes:
            starts = [span[0] for span, _, _ in edits]
            ends = [span[1] for span, _, _ in edits]
            for where, span in _strings(raw, (0, len(raw)), "", 0):
                inside = bisect.bisect_right(starts, span[0]) - 1
                if inside >= 0 and span[1] <= ends[inside]:
                    continue  # a value replaced whole already
                text = orjson.loads(raw[span[0] : span[1]])
                new = text
                for regex in self._regexes:
                    new = regex.sub(_mark, new)
                if new != text:
                    edits.append((span, where, orjson.dumps(new)))
            edits.sort(key=lambda edit: edit[0][0])
        if not edits:
            return raw, []
        return splice(raw, [(span, new) for span, _, new in edits]), [w for _, w, _ in edits]


def _outermost(named: list[tuple[Span, str, bytes]]) -> list[tuple[Span, str, bytes]]:
    """The values ``named`` that no other one named holds (nor is: the first of equal ones),
    by their place in the message. JSON values are nested or apart, never overlapping: sorted
    by start, longest first, one inside the last kept starts before the kept one ends."""
    kept: list[tuple[Span, str, bytes]] = []
    end = -1
    for edit in sorted(named, key=lambda edit: (edit[0][0], -edit[0][1])):
        if edit[0][0] >= end:
            kept.append(edit)
            end = edit[0][1]
    return kept


def _mark(match: re.Match[str]) -> str:
    """What a match becomes: the marker, unless it is empty (left as it is: nothing)."""
    return REDACTED if match.end() > match.start() else ""


def _found(regex: re.Pattern[str], text: str) -> bool:
    """Whether ``regex`` matches some text (not only an empty string) in ``text``."""
    return any(match.end() > match.start() for match in regex.finditer(text))


def _value_start(raw: bytes, span: Span) -> bytes:
    index = span[0]
    while index < span[1] and raw[index] in b" \t\r\n":
        index += 1
    return raw[index : index + 1]


def _at_path(
    raw: bytes, span: Span, steps: Sequence[str], where: str
) -> Iterator[tuple[str, Span]]:
    """``(path, span)`` of every value at ``steps`` below the value at ``span``."""
    if not steps:
        yield where, span
        return
    step, rest = steps[0], steps[1:]
    if step.startswith("["):
        elements = array_elements(raw, span[0])
        chosen = range(len(elements)) if step == "[*]" else [int(step[1:-1])]
        for index in chosen:
            if index < len(elements):
                yield from _at_path(raw, elements[index], rest, f"{where}[{index}]")
        return
    found = members(raw, span[0])
    keys = list(found) if step == "*" else [step]
    for key in keys:
        for value in found.get(key, []):
            yield from _at_path(raw, value, rest, f"{where}.{key}" if where else key)


def _strings(raw: bytes, span: Span, where: str, depth: int) -> Iterator[tuple[str, Span]]:
    """``(path, span)`` of every string value below the value at ``span``; :class:`TooDeep`
    past :data:`MAX_DEPTH` levels."""
    first = _value_start(raw, span)
    if first == b'"':
        yield where, span
    elif depth >= MAX_DEPTH and first in (b"{", b"["):
        raise TooDeep(f"nested deeper than {MAX_DEPTH} levels at {where}: not searched")
    elif first == b"{":
        for key, values in members(raw, span[0]).items():
            for value in values:
                yield from _strings(raw, value, f"{where}.{key}" if where else key, depth + 1)
    elif first == b"[":
        for index, element in enumerate(array_elements(raw, span[0])):
            yield from _strings(raw, element, f"{where}[{index}]", depth + 1)
