"""Redaction of secrets from recorded messages (``acp-proxy run --record FILE --redact PATTERN``).

A pattern is either a JSON path or a regular expression:

* a **path** names members from the message's top: keys joined by dots, ``[*]`` for every
  element of an array, ``[N]`` for one, ``*`` for every member of an object
  (``params.prompt[*].text``, ``params._meta.*``). The value there, whatever it is, becomes the
  string :data:`REDACTED`.
* a **regular expression** (Python's ``re``) is searched in every string value of the message
  (keys are names, not data: left alone); each match becomes :data:`REDACTED`.

A pattern made only of names, dots and brackets, with at least one dot or bracket, is a path;
anything else is a regular expression. ``path:`` or ``re:`` in front says which it is.

The message is changed in place in its bytes (:mod:`proxy.core.splice`): only the values
redacted are written again, every other byte stays as it came. :meth:`Redactor.redact` says
where it changed (``params.prompt[0].text``), which the recording writes beside the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson

from proxy.core.errors import OptionError
from proxy.core.splice import Span, array_elements, members, splice

__all__ = ["MAX_DEPTH", "REDACTED", "Pattern", "Redactor", "parse_pattern"]

REDACTED = "[redacted]"
"""What a redacted value (or a redacted match in a string) becomes."""
MAX_DEPTH = 64
"""Levels of nesting walked; deeper values are left as they are (and counted as not walked)."""

_STEP = re.compile(r"\.?([A-Za-z_$][\w$-]*|\*)|\[(\*|\d+)\]")
_LOOKS_LIKE_PATH = re.compile(r"[A-Za-z_$][\w$-]*(\.([A-Za-z_$][\w$-]*|\*)|\[(\*|\d+)\])+\Z")


@dataclass(frozen=True, slots=True)
class Pattern:
    """One ``--redact`` pattern: a path (its steps) or a regular expression."""

    text: str
    steps: tuple[str, ...] | None = None
    """The path's steps (a key, ``*``, ``[*]`` or ``[N]``); ``None`` for a regular expression."""
    regex: re.Pattern[str] | None = None


def parse_pattern(text: str) -> Pattern:
    """The pattern ``text`` (see the module); :class:`~proxy.core.errors.OptionError` naming
    ``--redact`` when it is neither a path nor a regular expression."""
    if text.startswith("path:") or (
        not text.startswith("re:") and _LOOKS_LIKE_PATH.match(text) is not None
    ):
        path = text.removeprefix("path:")
        steps: list[str] = []
        position = 0
        while position < len(path):
            match = _STEP.match(path, position)
            if match is None or (position == 0 and match.group(0).startswith(".")):
                where = f"character {position + 1}"
                raise OptionError(f"not a JSON path at {where}: {path!r}", "--redact")
            steps.append(match.group(1) if match.group(1) is not None else f"[{match.group(2)}]")
            position = match.end()
        if not steps:
            raise OptionError("an empty JSON path", "--redact")
        return Pattern(text, steps=tuple(steps))
    expression = text.removeprefix("re:")
    if not expression:
        raise OptionError("an empty regular expression", "--redact")
    try:
        return Pattern(text, regex=re.compile(expression))
    except re.error as exc:
        raise OptionError(f"not a regular expression ({exc}): {expression!r}", "--redact") from None


class Redactor:
    """Replaces what its patterns name in a message's JSON text."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = tuple(patterns)
        self._paths = [p.steps for p in self.patterns if p.steps is not None]
        self._regexes = [p.regex for p in self.patterns if p.regex is not None]

    @classmethod
    def of(cls, texts: Sequence[str]) -> Redactor:
        """A redactor of the patterns ``texts`` (:func:`parse_pattern` each)."""
        return cls([parse_pattern(text) for text in texts])

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def redact(self, raw: bytes) -> tuple[bytes, list[str]]:
        """``raw`` (one JSON object) with what the patterns name replaced, and the paths changed
        (empty, and ``raw`` itself, when nothing was)."""
        if not self.patterns:
            return raw, []
        edits: list[tuple[Span, bytes]] = []
        changed: list[str] = []
        taken: list[Span] = []
        for steps in self._paths:
            for where, span in _at_path(raw, (0, len(raw)), steps, ""):
                if not any(a <= span[0] and span[1] <= b for a, b in taken):
                    taken.append(span)
                    edits.append((span, orjson.dumps(REDACTED)))
                    changed.append(where)
        if self._regexes:
            for where, span in _strings(raw, (0, len(raw)), "", 0):
                if any(a <= span[0] and span[1] <= b for a, b in taken):
                    continue
                text = orjson.loads(raw[span[0] : span[1]])
                new = text
                for regex in self._regexes:
                    new = regex.sub(REDACTED, new)
                if new != text:
                    edits.append((span, orjson.dumps(new)))
                    changed.append(where)
        if not edits:
            return raw, []
        return splice(raw, edits), changed


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
    """``(path, span)`` of every string value below the value at ``span`` (to
    :data:`MAX_DEPTH`)."""
    first = _value_start(raw, span)
    if first == b'"':
        yield where, span
    elif depth >= MAX_DEPTH:
        return
    elif first == b"{":
        for key, values in members(raw, span[0]).items():
            for value in values:
                yield from _strings(raw, value, f"{where}.{key}" if where else key, depth + 1)
    elif first == b"[":
        for index, element in enumerate(array_elements(raw, span[0])):
            yield from _strings(raw, element, f"{where}[{index}]", depth + 1)
