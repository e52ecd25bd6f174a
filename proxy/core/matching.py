"""Matching a live message to a recorded one, and saying how two messages differ.

What changes between two runs of the same session is never a difference: ids of every kind
(:data:`VOLATILE_KEYS`: request ids, session ids, message ids, idempotency keys, tool call ids),
times and the working directory, wherever they sit, and the paths the user names (``--ignore``,
in the path syntax of :mod:`proxy.core.redact`). :func:`differences` walks two JSON values
side by side and lists the rest as :class:`Difference` (path, recorded value, new value);
:func:`nearest` picks, among recorded candidates, the one with the fewest.

A value the recording redacted (:mod:`proxy.core.redact`; the message's ``redacted`` paths say
where) stands for what this run sends there: one that is exactly :data:`REDACTED` (a path
redaction, or a whole string a regular expression took) matches any value, and a string holding
the marker matches a string in which each marker stands for any text (``"key [redacted] ok"``
matches ``"key sk-123 ok"``). Elsewhere the marker is text like any other.

Rules: values only (no bytes, no I/O); the walk is bounded (:data:`MAX_DEPTH` levels,
:data:`MAX_DIFFERENCES` listed: a count past it says "more").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.core.errors import OptionError
from proxy.core.redact import REDACTED, parse_pattern

__all__ = [
    "MAX_DEPTH",
    "MAX_DIFFERENCES",
    "MISSING",
    "VOLATILE_KEYS",
    "Difference",
    "Ignore",
    "differences",
    "nearest",
    "stands_for",
]

VOLATILE_KEYS = frozenset(
    {
        "id",
        "sessionId",
        "messageId",
        "userMessageId",
        "idempotencyKey",
        "requestId",
        "toolCallId",
        "terminalId",
        "elicitationId",
        "timestamp",
        "time",
        "createdAt",
        "updatedAt",
        "cwd",
    }
)
"""Members whose values change from one run to the next: never compared, at any depth."""
MAX_DEPTH = 64
"""Levels compared; below, two values are equal if their text is."""
MAX_DIFFERENCES = 20
"""Differences listed for one pair of messages."""


class _Missing:
    """The value of a member one side does not have."""

    def __repr__(self) -> str:
        return "<absent>"


MISSING: Any = _Missing()
"""Stands for a member one of the two values lacks."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Difference:
    """At ``path`` the recording had ``recorded`` and this run ``got`` (:data:`MISSING` for a
    member one side lacks)."""

    path: str
    recorded: Any
    got: Any

    def to_json(self) -> dict[str, Any]:
        """As JSON (an absent side left out)."""
        out: dict[str, Any] = {"path": self.path}
        if self.recorded is not MISSING:
            out["recorded"] = self.recorded
        if self.got is not MISSING:
            out["got"] = self.got
        return out


class Ignore:
    """The paths not compared (besides :data:`VOLATILE_KEYS`): ``--ignore`` patterns."""

    def __init__(self, paths: Sequence[str] = ()) -> None:
        steps = []
        for path in paths:
            pattern = parse_pattern(
                path if path.startswith("path:") else f"path:{path}", "--ignore"
            )
            if pattern.steps is None:  # pragma: no cover - forced to a path above
                raise OptionError(f"not a path: {path!r}", "--ignore")
            steps.append(pattern.steps)
        self.paths = tuple(steps)

    def covers(self, steps: Sequence[str]) -> bool:
        """Whether the member at ``steps`` (keys and ``[N]``) is not compared."""
        if steps and steps[-1] in VOLATILE_KEYS:
            return True
        return any(_matches(path, steps) for path in self.paths)


def _matches(pattern: Sequence[str], steps: Sequence[str]) -> bool:
    if len(pattern) > len(steps):
        return False
    for want, step in zip(pattern, steps, strict=False):
        if want == step or (want == "*" and not step.startswith("[")):
            continue
        if want == "[*]" and step.startswith("["):
            continue
        return False
    return True  # a prefix: everything below it is ignored too


def _text(steps: Sequence[str]) -> str:
    out = ""
    for step in steps:
        out += step if step.startswith("[") or not out else f".{step}"
    return out


def differences(
    recorded: Any,
    got: Any,
    ignore: Ignore | None = None,
    *,
    under: Sequence[str] = (),
    redacted: Collection[str] = (),
) -> tuple[list[Difference], int]:
    """The differences between ``recorded`` and ``got`` (at most :data:`MAX_DIFFERENCES`) and
    how many there are in all; ``under`` is where both values sit (their path's steps), and
    ``redacted`` the paths (from the message's top) where the recording redacted a value."""
    found: list[Difference] = []
    walk = _Walk(ignore or Ignore(), frozenset(redacted), found)
    count = _walk(recorded, got, list(under), walk, depth=0)
    return found, count


def stands_for(recorded: str, got: Any) -> bool:
    """Whether the redacted ``recorded`` stands for ``got``: the marker alone for any value (not for
    a member this run left out), a string holding it for a string where each marker is any text
    (matched left to right, in linear time: no backtracking)."""
    if got is MISSING:
        return False
    if recorded == REDACTED:
        return True
    if not isinstance(got, str):
        return False
    first, *middle, last = recorded.split(REDACTED)
    if len(got) < len(first) + len(last) or not got.startswith(first) or not got.endswith(last):
        return False
    position, end = len(first), len(got) - len(last)
    for part in middle:
        position = got.find(part, position, end)
        if position < 0:
            return False
        position += len(part)
    return True


@dataclass(frozen=True, slots=True)
class _Walk:
    """What a walk keeps to the end: what is not compared, where values were redacted, and
    the differences found."""

    ignore: Ignore
    redacted: frozenset[str]
    found: list[Difference]


def _walk(recorded: Any, got: Any, steps: list[str], walk: _Walk, *, depth: int) -> int:
    if walk.ignore.covers(steps):
        return 0
    if (
        walk.redacted
        and isinstance(recorded, str)
        and REDACTED in recorded
        and _text(steps) in walk.redacted
        and stands_for(recorded, got)
    ):
        return 0
    if isinstance(recorded, dict) and isinstance(got, dict) and depth < MAX_DEPTH:
        count = 0
        for key in [*recorded, *(k for k in got if k not in recorded)]:
            steps.append(key)
            left, right = recorded.get(key, MISSING), got.get(key, MISSING)
            count += _walk(left, right, steps, walk, depth=depth + 1)
            steps.pop()
        return count
    if isinstance(recorded, list) and isinstance(got, list) and depth < MAX_DEPTH:
        count = 0
        for index in range(max(len(recorded), len(got))):
            steps.append(f"[{index}]")
            left = recorded[index] if index < len(recorded) else MISSING
            right = got[index] if index < len(got) else MISSING
            count += _walk(left, right, steps, walk, depth=depth + 1)
            steps.pop()
        return count
    if type(recorded) is type(got) and recorded == got:
        return 0
    if len(walk.found) < MAX_DIFFERENCES:
        walk.found.append(Difference(_text(steps), recorded, got))
    return 1


def nearest(
    got: Any,
    candidates: Iterable[tuple[T, Any, Collection[str]]],
    ignore: Ignore | None = None,
    *,
    under: Sequence[str] = (),
) -> tuple[T, list[Difference], int] | None:
    """Among ``candidates`` (a thing, its recorded value and the paths redacted in it), the
    first with the fewest differences from ``got``: it, its differences and their count;
    ``None`` when there are none."""
    best: tuple[T, list[Difference], int] | None = None
    for thing, value, redacted in candidates:
        found, count = differences(value, got, ignore, under=under, redacted=redacted)
        if best is None or count < best[2]:
            best = (thing, found, count)
            if count == 0:
                break
    return best
