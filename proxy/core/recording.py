"""The recording format (``acp-proxy run --record FILE``): written line by line, read back checked.

A recording is JSON Lines (gzip-compressed when its name ends in ``.gz``: the shell's business).
Its first line is the header, ``{"format": "acp-recording", "version": 1, "time": T,
"redactions": [...]}`` (what the writer replaced secrets with, without a secret: a path, or a
regular expression's digest, :class:`~proxy.core.redact.Redaction`; an older writer listed the
patterns themselves, which are read too).
Each later line is one of the following (or the header of another run that appended to the
file: ``--record`` appends, as ``--trace`` does, so the runs of a respawned proxy share one file):

* ``{"time": T, "link": N, "event": "open", "side": "client"}``: a connection joined link ``N``
  (``close``: it left it);
* ``{"time": T, "link": N, "event": "message", "direction": "to_agent", "id": ..., "forwarded_id":
  ..., "body": {...}}``: a message that crossed the proxy, as its sender wrote it. ``id`` and
  ``forwarded_id`` are the trace's pair (:class:`~proxy.core.records.MessageRecord`): a request
  and its answer carry the same pair, which is how a reader joins them. ``redacted`` lists the
  places a redaction changed, when one did.

The body is the message's own JSON text, spliced into the line as it arrived (never parsed into
Python floats and written again), so big integers, key order and escapes survive. A body whose
text holds a line break (a pretty-printed HTTP body) cannot sit on a JSON line: it is written as
the string ``body_text`` instead, whose value is that text, byte for byte.

:class:`RecordingReader` reads lines back, strictly: every line that is not what this version
writes is a :class:`Problem` naming its line and what is wrong, and the reader keeps going so that
all of them are said at once; but a first line that is no header is one problem (the file is not a
recording: its other lines are not read). It bounds what it keeps
(:attr:`RecordingReader.max_bytes` of lines in all) and is told of lines cut by the caller's line
bound (:meth:`RecordingReader.too_long`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Message, load, parse
from proxy.core.redact import Redaction
from proxy.core.search import CARRIAGE_RETURN, NEWLINE
from proxy.core.splice import find_member

__all__ = [
    "FORMAT",
    "LINKS_PER_RUN",
    "MAX_PROBLEMS",
    "VERSION",
    "LinkEvent",
    "Problem",
    "Recorded",
    "Recording",
    "RecordingError",
    "RecordingReader",
    "header_line",
    "link_line",
    "message_line",
    "read_recording",
]

FORMAT = "acp-recording"
"""The header's ``format``: what says a file is a recording."""
VERSION = 1
"""The version this writer writes, and the newest this reader reads."""
OLDEST = 1
"""The oldest version this reader reads (there is no older one yet)."""
LINKS_PER_RUN = 10**9
"""Link numbers of one run; a run that appended to the file has its links numbered after those
of the runs before it (``link + LINKS_PER_RUN * runs before``), so that they stay apart."""
MAX_PROBLEMS = 20
"""Problems reported for one file; past them the reader says how many more it met."""


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with one line of a recording (``line`` 1-based; 0: the file as a whole)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


class RecordingError(ValueError):
    """A recording that cannot be used: every :class:`Problem` found, each naming its line."""

    def __init__(self, source: str, problems: Sequence[Problem], more: int = 0) -> None:
        self.source = source
        self.problems = tuple(problems)
        self.more = more
        lines = [f"{source}: {problem}" for problem in self.problems]
        if more:
            lines.append(f"{source}: and {more} more problems")
        super().__init__("\n".join(lines))


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """A connection of ``side`` joined (``open``) or left (``close``) link ``link``."""

    line: int
    time: float
    link: int
    event: Literal["open", "close"]
    side: Side


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded message: where it was in the file, when, on which link, which way, the pair
    of ids that joins a request to its answer, and the message itself (its :attr:`Message.raw`
    is the body as it crossed, byte for byte)."""

    line: int
    time: float
    link: int
    direction: Direction
    pair: tuple[bytes, bytes]
    """``id`` and ``forwarded_id`` as JSON text (``null`` for a notification)."""
    message: Message
    redacted: tuple[str, ...] = ()


@dataclass(slots=True)
class Recording:
    """A recording read back: its header's time, version and redactions, then what it holds in
    file order."""

    version: int = VERSION
    time: float = 0.0
    redactions: tuple[Redaction, ...] = ()
    messages: list[Recorded] = field(default_factory=list)
    links: list[LinkEvent] = field(default_factory=list)


# -- writing ---------------------------------------------------------------------------------


def header_line(time: float, redactions: Sequence[Redaction] = ()) -> bytes:
    """The first line of a recording (without its line break)."""
    said = [redaction.to_json() for redaction in redactions]
    return orjson.dumps({"format": FORMAT, "version": VERSION, "time": time, "redactions": said})


def link_line(time: float, link: int, event: Literal["open", "close"], side: Side) -> bytes:
    """The line of a connection joining or leaving a link."""
    return orjson.dumps({"time": time, "link": link, "event": event, "side": str(side)})


def message_line(
    time: float,
    link: int,
    direction: Direction,
    pair: tuple[bytes | None, bytes | None],
    raw: bytes,
    *,
    redacted: Sequence[str] = (),
) -> bytes:
    """The line of one message whose JSON text is ``raw`` (spliced in as it is; as the string
    ``body_text`` when it holds a line break), its ids ``pair`` as JSON text (``None``: null)."""
    head = orjson.dumps({"time": time, "link": link, "event": "message", "direction": direction})
    ids = b',"id":' + (pair[0] or b"null") + b',"forwarded_id":' + (pair[1] or b"null")
    if redacted:
        ids += b',"redacted":' + orjson.dumps(list(redacted))
    if NEWLINE in raw or CARRIAGE_RETURN in raw:
        body = b',"body_text":' + orjson.dumps(raw.decode("utf-8", "surrogateescape"))
    else:
        body = b',"body":' + raw
    return head[:-1] + ids + body + b"}"


# -- reading ---------------------------------------------------------------------------------


class RecordingReader:
    """Reads a recording's lines (:meth:`feed`, in order), then :meth:`finish` gives the
    :class:`Recording` or raises :class:`RecordingError` with every problem met."""

    def __init__(self, source: str, *, max_bytes: int) -> None:
        self.source = source
        self.max_bytes = max_bytes
        """Bytes of lines kept at most (the recording is held in memory to be replayed)."""
        self.recording = Recording()
        self._problems: list[Problem] = []
        self._more = 0
        self._bytes = 0
        self._lines = 0
        self._stopped = False
        self._segment = 0
        """Headers met after the first: runs that appended to the file."""

    def problem(self, line: int, message: str) -> None:
        """Note a problem of line ``line``."""
        if len(self._problems) < MAX_PROBLEMS:
            self._problems.append(Problem(line, message))
        else:
            self._more += 1

    def too_long(self, line: int, limit: int) -> bool:
        """Line ``line`` is longer than the caller's bound ``limit`` (it was not read); ``False``
        once the reader will read no more (it was the first line: no header, no recording)."""
        if self._stopped:
            return False
        self._lines = max(self._lines, line)
        if line == 1:
            return self._not_a_recording(f"its first line is longer than {limit} bytes")
        self.problem(line, f"longer than {limit} bytes; not read")
        return True

    def _not_a_recording(self, why: str) -> bool:
        """The first line is no header: one problem says so, and nothing more is read."""
        self.problem(1, f"not a recording: {why}")
        self._stopped = True
        return False

    def feed(self, line: int, text: bytes) -> bool:
        """Read line number ``line`` (1-based, its line break removed or not); ``False`` once the
        reader will read no more (:attr:`max_bytes` reached, or a header it cannot read)."""
        if self._stopped:
            return False
        self._lines = max(self._lines, line)
        text = text.rstrip(b"\r\n")
        self._bytes += len(text)
        if self._bytes > self.max_bytes:
            self.problem(
                line, f"the recording holds more than {self.max_bytes} bytes; not read further"
            )
            self._stopped = True
            return False
        if not text.strip():
            return True
        try:
            value = load(text)
        except ValueError as exc:
            if line == 1:
                return self._not_a_recording("its first line is not JSON")
            self.problem(line, f"not JSON ({exc})")
            return True
        if not isinstance(value, dict):
            if line == 1:
                return self._not_a_recording("its first line is not a JSON object")
            self.problem(line, "not a JSON object")
            return True
        if line == 1 or "format" in value:
            self._header(line, value)
            return not self._stopped
        try:
            self._line(line, text, value)
        except _Bad as exc:
            self.problem(line, str(exc))
        return True

    def finish(self) -> Recording:
        """The recording read; :class:`RecordingError` when any line had a problem (or there was
        no line at all)."""
        if self._lines == 0:
            self.problem(0, "empty: not a recording")
        if self._problems:
            raise RecordingError(self.source, self._problems, self._more)
        return self.recording

    def _header(self, line: int, value: dict[str, Any]) -> None:
        """The header of the file (line 1), or of a later run appending to it."""
        if value.get("format") != FORMAT:
            self._not_a_recording(f'the first line has no "format": "{FORMAT}"')
            return
        version = value.get("version")
        if type(version) is not int:
            self.problem(line, "the header's version is not an integer")
            self._stopped = True
            return
        if version > VERSION:
            self.problem(
                line,
                f"recorded by a newer acp-proxy (format version {version}; this one reads "
                f"versions {OLDEST} to {VERSION}): upgrade acp-proxy to replay it",
            )
            self._stopped = True
            return
        if version < OLDEST:
            self.problem(line, f"format version {version} is older than any this one reads")
            self._stopped = True
            return
        try:
            time = _time(value.get("time"), "the header's time")
            listed = value.get("redactions", [])
            if not isinstance(listed, list):
                raise _Bad("the header's redactions are not a list")
            redactions = [Redaction.of_json(entry) for entry in listed]
        except ValueError as exc:  # _Bad, or a redaction that is not one
            self.problem(line, str(exc))
            return
        if line == 1:
            self.recording.version = version
            self.recording.time = time
        else:  # another run appended to the file: its links are others
            self._segment += 1
        self.recording.redactions = tuple(dict.fromkeys((*self.recording.redactions, *redactions)))

    def _line(self, line: int, text: bytes, value: dict[str, Any]) -> None:
        event = value.get("event")
        time = _time(value.get("time"), "time")
        link = value.get("link")
        if type(link) is not int or not 0 <= link < LINKS_PER_RUN:
            raise _Bad(f"link is not an integer from 0 to {LINKS_PER_RUN - 1}")
        link += self._segment * LINKS_PER_RUN
        if event in ("open", "close"):
            try:
                side = Side(str(value.get("side")))
            except ValueError:
                raise _Bad('side is neither "client" nor "agent"') from None
            self.recording.links.append(LinkEvent(line, time, link, event, side))
            return
        if event != "message":
            raise _Bad(f"unknown event {event!r} (expected message, open or close)")
        try:
            direction = Direction(str(value.get("direction")))
        except ValueError:
            raise _Bad('direction is neither "to_agent" nor "to_client"') from None
        pair = (_token(text, "id"), _token(text, "forwarded_id"))
        redacted = value.get("redacted", [])
        if not isinstance(redacted, list) or not all(isinstance(r, str) for r in redacted):
            raise _Bad("redacted is not a list of strings")
        if "body" in value:
            span = find_member(text, ("body",))
            assert span is not None  # the line parsed, and has it
            raw = text[span[0] : span[1]]
        elif isinstance(value.get("body_text"), str):
            raw = value["body_text"].encode("utf-8", "surrogateescape")
        else:
            raise _Bad("a message line without its body")
        message = parse(raw)
        if not isinstance(message, Message):
            what = "a batch" if not hasattr(message, "reason") else f"{message.reason}"
            raise _Bad(f"the body is not one JSON-RPC message ({what})")
        if message.body.get("jsonrpc") != "2.0":
            raise _Bad('the body is not a JSON-RPC 2.0 message (its "jsonrpc" is not "2.0")')
        recorded = Recorded(line, time, link, direction, pair, message, tuple(redacted))
        self.recording.messages.append(recorded)


class _Bad(ValueError):
    """A line's problem (its message says what)."""


def _time(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _Bad(f"{name} is not a finite number")
    return float(value)


def _token(text: bytes, key: str) -> bytes:
    span = find_member(text, (key,))
    return b"null" if span is None else text[span[0] : span[1]]


def read_recording(source: str, lines: Iterable[bytes], *, max_bytes: int) -> Recording:
    """A recording from its ``lines`` (every one whole: a caller bounding line length uses
    :class:`RecordingReader` itself); :class:`RecordingError` naming every problem."""
    reader = RecordingReader(source, max_bytes=max_bytes)
    for number, text in enumerate(lines, 1):
        if not reader.feed(number, text):
            break
    return reader.finish()
