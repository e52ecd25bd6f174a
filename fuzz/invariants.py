"""What the fuzzers hold the proxy's input handling to: one ``check_*`` function per surface.

Shared by the coverage-guided targets (``fuzz/fuzz_*.py``, atheris) and the property tests
(``tests/fuzz/test_fuzz_properties.py``, hypothesis). Each check runs the proxy's own code on one
input and raises ``AssertionError`` when a promise is broken; any other exception that escapes is a
crash. The promises:

* :func:`check_parse`: classifying never raises, keeps the bytes, and agrees with the standard
  library's reading of the JSON (kind by key presence, the id's exact bytes and identity).
* :func:`check_splice`: splicing a new id into a message changes nothing but the id: the bytes
  outside the id spans are identical and the result parses to the same message with that id.
* :func:`check_line_framer`, :func:`check_sse`: framing does not depend on how the stream is
  chunked, matches a reference reading of the format, and never buffers more than its limit.
* :func:`check_fault_text`, :func:`check_rules_data`: a fault file (any text) or a control-API
  rule list (any structure) either loads or raises :class:`~proxy.core.faultfile.FaultFileError`;
  what loads can be compiled by the engine, acted on, and dumped and loaded back unchanged.
* :class:`RelayLab` (:func:`check_relay`): the relay core and the observers of a real run (log
  lines, metrics, trace, event feed, idempotency ledger) take any sequence of messages, answers,
  cancels, oversize reports, timers and closes without raising; a forwarded message differs from
  what arrived only in its id; the proxy answers a peer only with errors; and afterwards a request
  and its answer still cross the link both ways.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import structlog

from proxy.core import acp
from proxy.core.actions.base import Subject
from proxy.core.actions.error import ErrorReply
from proxy.core.commands import (
    Close,
    Command,
    ForgetTimer,
    Send,
    SendCut,
    SendRun,
    Sever,
    StartTimer,
)
from proxy.core.engine import FaultEngine
from proxy.core.events import (
    BurstReceived,
    Direction,
    Event,
    MessageReceived,
    OversizedReceived,
    PeerClosed,
    Side,
    TimerFired,
)
from proxy.core.faultfile import (
    FaultFileError,
    Rule,
    dump_rules,
    parse_fault_file,
    validate_rules,
)
from proxy.core.framing import LineFramer, Oversized
from proxy.core.jsonrpc import (
    Batch,
    Invalid,
    InvalidReason,
    Kind,
    Message,
    error_response,
    parse,
)
from proxy.core.ledger import Ledger
from proxy.core.observations import Observation, Relayed, RelayedRun
from proxy.core.relay import Relay
from proxy.core.splice import splice
from proxy.core.sse import SseDecoder
from proxy.shell.metrics import Metrics
from proxy.shell.observers import LogObserver, Observer, Tally
from proxy.shell.trace import EventFeed, TraceWriter

CORPUS = Path(__file__).parent / "corpus"
"""Seed inputs, one file each, in a directory per surface (``messages``, ``sse``, ...)."""


def corpus(surface: str) -> dict[str, bytes]:
    """The seed inputs of ``surface`` by file name, in name order."""
    paths = sorted((CORPUS / surface).iterdir())
    return {path.name: path.read_bytes() for path in paths if path.is_file()}


# -- JSON-RPC messages -----------------------------------------------------------------------------

ID_TOKENS: tuple[bytes, ...] = (
    b"0",
    b"-0",
    b"1",
    b"-1",
    b"1.0",
    b"1e3",
    b"1e999",
    b"-1e999",
    b"9007199254740993",
    b"1" + b"0" * 400,
    b"9" * 5000,
    b'""',
    b'"1"',
    b'"\\u0031"',
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b'"\\"\\\\\\/\\b\\f\\n\\r\\t"',
    b'"\xc3\xa9\xf0\x9f\x98\x80"',
    b"null",
    b"true",
    b"false",
    b"{}",
    b'{"id":1}',
    b"[]",
    b"[1]",
)
"""Ids of every JSON type and spelling: huge, fractional, negative zero, escaped, surrogates."""

METHODS: tuple[bytes, ...] = (
    b'"session/prompt"',
    b'"session/new"',
    b'"session/update"',
    b'"initialize"',
    b'"$/cancel_request"',
    b'"elicitation/create"',
    b'"proxy/successor"',
    b'"x/y"',
    b'"\\ud800"',
    b'"\\u0073ession/prompt"',
    b'""',
    b"1",
    b"null",
)
"""Method tokens: ACP's, the ones the relay treats specially, odd spellings and non-strings."""


class _Unknown(Exception):
    """The standard library cannot read the value either (nesting deeper than its recursion)."""


def _int(token: str) -> int | Decimal:
    # int() refuses more than 4300 digits; Decimal reads any integer exactly
    return int(token) if len(token) < 4000 else Decimal(token)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def reference_load(data: bytes) -> tuple[bool, Any]:
    """The standard library's reading: ``(True, value)``, or ``(False, None)`` if not JSON.

    Raises :class:`_Unknown` when the nesting is too deep for it to tell.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False, None
    try:
        return True, json.loads(text, parse_constant=_no_constants, parse_int=_int)
    except RecursionError:
        raise _Unknown from None
    except ValueError:
        return False, None


def _valid_id(value: Any) -> bool:
    """A JSON-RPC id: a string, null, or a number written as an integer (read as int here)."""
    return value is None or type(value) in (str, int, Decimal)


def expected_kind(value: Any) -> Kind:
    """A message's kind by key presence (JSON-RPC 2.0 section 4 and 5), for one JSON value."""
    if not isinstance(value, dict):
        return Kind.INVALID
    if "method" in value:
        if not isinstance(value["method"], str):
            return Kind.INVALID
        if "id" not in value:
            return Kind.NOTIFICATION
        return Kind.REQUEST if _valid_id(value["id"]) else Kind.INVALID
    if "id" in value and ("result" in value) != ("error" in value) and _valid_id(value["id"]):
        return Kind.ERROR if "error" in value else Kind.RESPONSE
    return Kind.INVALID


def _check_single(parsed: Message | Invalid, value: Any) -> None:
    kind = expected_kind(value)
    assert parsed.kind is kind, (parsed.kind, kind, parsed.raw[:200])
    if isinstance(parsed, Invalid):
        # valid JSON: the scanner and the parser must agree on it
        assert parsed.reason not in (InvalidReason.NOT_UTF8, InvalidReason.INVALID_JSON), parsed
        return
    assert parsed.method == value.get("method")
    if kind is Kind.NOTIFICATION:
        assert parsed.id_token is None
        assert parsed.id_spans == ()
        return
    assert parsed.id_token is not None
    assert parsed.id_spans, parsed.raw[:200]
    for start, end in parsed.id_spans:
        assert reference_load(parsed.raw[start:end])[0]  # each span is a whole JSON value
    start, end = parsed.id_spans[-1]
    assert parsed.raw[start:end] == parsed.id_token
    ok, token_value = reference_load(parsed.id_token)
    assert ok
    assert token_value == value["id"]
    assert type(token_value) is type(value["id"])
    identity = value["id"]
    if isinstance(identity, str):
        assert parsed.id_key == ("s", identity)
    elif identity is None:
        assert parsed.id_key == ("null", None)
    else:
        assert parsed.id_key == ("n", parsed.id_token)
    params = value.get("params")
    session = params.get("sessionId") if isinstance(params, dict) else None
    assert parsed.session == (session if isinstance(session, str) else None)


def check_parse(data: bytes) -> Message | Batch | Invalid:
    """:func:`proxy.core.jsonrpc.parse` on any bytes: never raises, agrees with the standard
    library."""
    parsed = parse(data)
    assert parsed.raw == data
    try:
        ok, value = reference_load(data)
    except _Unknown:
        return parsed
    if not ok:
        assert isinstance(parsed, Invalid), parsed
        assert parsed.reason in (InvalidReason.NOT_UTF8, InvalidReason.INVALID_JSON), parsed
        return parsed
    if isinstance(value, list):
        if not value:
            assert isinstance(parsed, Invalid)
            assert parsed.reason is InvalidReason.EMPTY_BATCH
            return parsed
        assert isinstance(parsed, Batch), parsed
        assert len(parsed.elements) == len(value)
        for element, item in zip(parsed.elements, value, strict=True):
            assert element.raw in data
            assert reference_load(element.raw) == (True, item)
            _check_single(element, item)
        return parsed
    assert not isinstance(parsed, Batch)
    _check_single(parsed, value)
    return parsed


def check_splice(message: Message, new_id: bytes) -> bytes:
    """Put ``new_id`` (a valid id token) in every id span: nothing else changes."""
    assert message.id_spans
    out = splice(message.raw, [(span, new_id) for span in message.id_spans])
    raw = message.raw
    expected = bytearray()
    previous = 0
    for start, end in message.id_spans:
        expected += raw[previous:start] + new_id
        previous = end
    expected += raw[previous:]
    assert out == bytes(expected)  # the bytes outside the id spans are identical
    again = parse(out)
    if not isinstance(again, Message):  # the sender's own id was invalid (1.0, bad UTF-8):
        assert isinstance(again, Invalid), again  # it goes back as it came, readable as before
        assert again.id_token == new_id, again
        return out
    assert again.kind is message.kind
    assert again.method == message.method
    assert again.id_token == new_id
    assert len(again.id_spans) == len(message.id_spans)
    try:
        ok, before = reference_load(raw)
        ok_after, after = reference_load(out)
        _, id_value = reference_load(new_id)
    except _Unknown:
        return out
    assert ok
    assert ok_after
    assert after == {**before, "id": id_value}
    return out


def message_bytes(
    id_token: bytes | None,
    method: bytes | None,
    *,
    params: bytes | None = None,
    result: bytes | None = None,
    error: bytes | None = None,
    duplicate_id: bytes | None = None,
    spaced: bool = False,
) -> bytes:
    """A message built from raw tokens (any of which may be odd or invalid)."""
    members: list[tuple[bytes, bytes]] = [(b'"jsonrpc"', b'"2.0"')]
    if duplicate_id is not None:
        members.append((b'"\\u0069d"', duplicate_id))
    if method is not None:
        members.append((b'"method"', method))
    if params is not None:
        members.append((b'"params"', params))
    if result is not None:
        members.append((b'"result"', result))
    if error is not None:
        members.append((b'"error"', error))
    if id_token is not None:
        members.append((b'"id"', id_token))
    colon, comma = (b" : ", b" ,\t") if spaced else (b":", b",")
    return b"{" + comma.join(key + colon + value for key, value in members) + b"}"


# -- framing ---------------------------------------------------------------------------------------


def _chunks(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _mark(items: Sequence[bytes | Oversized]) -> list[bytes | str]:
    return ["<oversized>" if isinstance(item, Oversized) else item for item in items]


def line_framer_model(data: bytes, limit: int) -> list[bytes | Oversized]:
    """What newline framing must yield for ``data``, read at once."""
    lines = data.split(b"\n")
    last = lines.pop()
    if last:
        lines.append(last)  # delivered at EOF
    out: list[bytes | Oversized] = []
    for line in lines:
        if len(line) > limit:
            out.append(Oversized(len(line), limit))
        elif line and not line.isspace():
            out.append(line)
    return out


def check_line_framer(data: bytes, cuts: Iterable[int], limit: int) -> None:
    """:class:`~proxy.core.framing.LineFramer` on ``data`` cut at ``cuts``, with ``limit``."""
    framer = LineFramer(limit)
    out: list[bytes | Oversized] = []
    for chunk in _chunks(data, cuts):
        out += framer.feed(chunk)
        assert len(framer._buffer) <= limit  # an over-long line is never buffered whole
    out += framer.eof()
    assert out == line_framer_model(data, limit)


_SSE_LINE = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


def sse_model(data: bytes, limit: int) -> list[bytes | str]:
    """The data of each event in the stream ``data`` (``<oversized>`` above ``limit``).

    The WHATWG event-stream interpretation, restricted to ``data``: a leading BOM is dropped, a
    line ends at CRLF, CR or LF, an unfinished last line and an undispatched event are lost.
    """
    data = data.removeprefix(_BOM)
    lines = _SSE_LINE.split(data)
    lines.pop()  # what follows the last line end: an unfinished line
    out: list[bytes | str] = []
    values: list[bytes] = []
    for line in lines:
        if not line:
            if values:
                size = sum(len(value) + 1 for value in values)
                out.append("<oversized>" if size > limit else b"\n".join(values))
            values = []
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            values.append(value.removeprefix(b" "))
    return out


def check_sse(data: bytes, cuts: Iterable[int], limit: int) -> None:
    """:class:`~proxy.core.sse.SseDecoder` on ``data`` cut at ``cuts``, with ``limit``."""
    decoder = SseDecoder(limit)
    out: list[bytes | Oversized] = []
    for chunk in _chunks(data, cuts):
        out += decoder.feed(chunk)
        assert len(decoder._buffer) <= limit + 16 or decoder._buffer.endswith(b"\r")
    out += decoder.eof()
    for item in out:
        assert isinstance(item, Oversized) or len(item) <= limit
    assert _mark(out) == sse_model(data, limit)


# -- fault files -----------------------------------------------------------------------------------

_SUBJECTS = [
    Subject(direction, kind, method, session, keyed, params, downstream)
    for direction in Direction
    for kind, method, session, keyed, params, downstream in (
        (Kind.REQUEST, "session/prompt", "s-1", True, {"prompt": [{"text": "deploy"}]}, "http"),
        (Kind.RESPONSE, None, None, False, None, "stdio"),
        (Kind.NOTIFICATION, "x/\ud800", "\udc00", False, [1, 1e400], "ws"),
    )
]


def _check_loaded(rules: list[Rule]) -> None:
    """Rules that loaded can be used: compiled, matched, acted on, dumped and loaded back."""
    engine = FaultEngine(rules, random.Random(0))
    for subject in _SUBJECTS:
        engine.decide(subject, 1.0)
    for rule in rules:
        if isinstance(rule.do, ErrorReply):
            error_response(b"1", rule.do.code, rule.do.message, rule.do.data)
    dumped = dump_rules(rules)
    assert dump_rules(validate_rules(dumped)) == dumped


def check_fault_text(text: str) -> None:
    """A fault file's text either loads or raises FaultFileError with located errors."""
    try:
        loaded = parse_fault_file(text, "fuzz.yaml")
    except FaultFileError as exc:
        errors = exc.errors
    else:
        _check_loaded(loaded.rules)
        return
    assert errors
    assert all(error.file == "fuzz.yaml" and error.message for error in errors)


def check_rules_data(data: Any) -> None:
    """A control-API rule list (any structure) either loads or raises FaultFileError."""
    try:
        rules = validate_rules(data)
    except FaultFileError as exc:
        errors = exc.errors
    else:
        _check_loaded(rules)
        return
    assert errors


# -- the relay -------------------------------------------------------------------------------------

PROBE_METHOD = "_probe/live"

FUZZ_RULES: list[Rule] = validate_rules(
    [
        {
            "name": "drop-second-prompt",
            "when": {"method": "session/*"},
            "schedule": {"nth": [2]},
            "do": {"action": "drop"},
        },
        {
            "name": "delay",
            "when": {"method": "x*", "kind": "request"},
            "schedule": {"probability": 0.5},
            "do": {"action": "delay", "ms": 5, "jitter_ms": 5},
            "continue": True,
        },
        {
            "name": "duplicate",
            "when": {"method": "[a-z]*", "direction": "to_agent"},
            "schedule": {"every": 3},
            "do": {"action": "duplicate", "copies": 2, "gap_ms": 1},
            "continue": True,
        },
        {
            "name": "error",
            "when": {"method": "session/prompt", "idempotency_key": "present"},
            "schedule": {"every": 2},
            "do": {"action": "error", "code": -32000, "data": {"why": "fuzz"}},
        },
        {
            "name": "slow-s1",
            "when": {"method": "elicitation/*", "direction": "to_client", "session": "s1"},
            "do": {"action": "delay", "ms": 1},
            "continue": True,
        },
        {
            "name": "reorder",
            "when": {"method": "session/update", "direction": "to_client"},
            "schedule": {"bursts": {"p": 0.3, "r": 0.5}},
            "do": {"action": "reorder", "after": 2, "max_ms": 5},
            "continue": True,
        },
        {
            "name": "throttle",
            "when": {"method": "session/*", "direction": "to_agent"},
            "do": {"action": "bandwidth", "bytes_per_second": 20000, "burst_bytes": 300},
            "continue": True,
        },
        {
            "name": "corrupt",
            "when": {"method": "s*", "direction": "to_client"},
            "schedule": {"probability": 0.3},
            "do": {"action": "corrupt", "mode": "invalid_utf8"},
        },
        {
            "name": "truncate",
            "when": {"method": "session/update"},
            "schedule": {"probability": 0.3},
            "do": {"action": "corrupt", "mode": "truncate"},
        },
        {
            "name": "garbage",
            "when": {"method": "initialize"},
            "schedule": {"nth": [2]},
            "do": {"action": "corrupt", "mode": "garbage"},
        },
        {
            "name": "sever",
            "when": {"method": "x/sever"},
            "do": {"action": "sever", "side": "agent", "moment": "after"},
        },
        {
            "name": "kill",
            "when": {"method": "x/kill"},
            "do": {"action": "kill_agent", "after_ms": 3, "respawn": True},
        },
        {
            "name": "restart",
            "when": {"method": "x/restart"},
            "do": {"action": "restart_proxy", "downtime_ms": 1},
        },
        {
            "name": "http-status",
            "when": {"method": "x/post"},
            "do": {"action": "http_status", "status": 503},
        },
        {"name": "close-stream", "when": {"method": "x/*"}, "do": {"action": "close_stream"}},
        {
            "name": "cut-short",
            "when": {"method": "x/y", "direction": "to_client"},
            "schedule": {"probability": 0.2},
            "do": {"action": "truncate", "bytes": 12},
        },
        {
            "name": "stall-updates",
            "when": {"method": "session/update", "direction": "to_client"},
            "schedule": {"probability": 0.2},
            "do": {"action": "stall", "ms": 5},
        },
        {
            "name": "hang-up",
            "when": {"method": "session/new"},
            "schedule": {"probability": 0.3},
            "do": {"action": "timeout", "ms": 5, "side": "agent"},
        },
        {
            "name": "linger",
            "when": {"method": "initialize"},
            "do": {"action": "slow_close", "ms": 5},
        },
    ]
)
"""A rule of every action; none matches the liveness probe (``_probe/live``)."""


@dataclass(frozen=True, slots=True)
class Feed:
    """``side`` sends ``data`` (one framed message)."""

    side: Side
    data: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """``side`` answers the ``pick``-th request it has received, with ``body`` as the value."""

    side: Side
    pick: int
    body: bytes = b"{}"
    error: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    """``side`` sends ``$/cancel_request`` for the ``pick``-th request it sent."""

    side: Side
    pick: int


@dataclass(frozen=True, slots=True)
class TooLarge:
    """Framing discarded a message of ``size`` bytes from ``side``."""

    side: Side
    size: int


@dataclass(frozen=True, slots=True)
class Hangup:
    """The connection to ``side`` ends."""

    side: Side


@dataclass(frozen=True, slots=True)
class Fire:
    """The ``pick``-th pending timer fires."""

    pick: int


@dataclass(frozen=True, slots=True)
class Burst:
    """``side`` sends ``messages`` together (the lines of one read)."""

    side: Side
    messages: tuple[bytes, ...]


Step = Feed | Burst | Answer | Cancel | TooLarge | Hangup | Fire


class _Shared:
    """Observers a real run has once per process (their output goes nowhere)."""

    def __init__(self) -> None:
        nowhere = open(os.devnull, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        logger = structlog.wrap_logger(
            structlog.PrintLogger(nowhere),  # encoding as sys.stderr does
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        )
        self.log = LogObserver(logger)
        self.metrics = Metrics()
        self.trace = TraceWriter(os.devnull)
        self.feed = EventFeed()
        subscriber = self.feed.subscribe()
        assert subscriber is not None
        self.subscriber = subscriber


_shared: _Shared | None = None


def _shared_observers() -> _Shared:
    global _shared  # noqa: PLW0603 (one set per process, as in a run)
    if _shared is None:
        _shared = _Shared()
    return _shared


def _units(data: bytes) -> list[bytes]:
    parsed = parse(data)
    if isinstance(parsed, Batch):
        return [element.raw for element in parsed.elements]
    return [data]


def _without_id(parsed: Message | Batch | Invalid) -> bytes | None:
    """A message's bytes with its (readable) id blanked out; None for a batch. A forwarded
    invalid message may be valid once its id is the proxy's (``1e999`` was its only fault)."""
    if isinstance(parsed, Batch):
        return None
    return splice(parsed.raw, [(span, b"") for span in parsed.id_spans])


class RelayLab:
    """A relay core with every observer of a run, driven by :data:`Step` s, checked as it goes."""

    def __init__(
        self,
        *,
        strict: bool = False,
        faults: bool = False,
        downstream: str = "stdio",
        fast_path: bool = True,
        together: bool = True,
    ) -> None:
        """``together``: a :class:`Burst` is fed as the messages of one read (else each alone,
        at the same time)."""
        engine = FaultEngine(FUZZ_RULES, random.Random(0)) if faults else None
        self.faults = faults
        self.strict = strict
        self.relay = Relay(strict=strict, engine=engine, downstream=downstream, fast_path=fast_path)
        self.commands: list[Command] = []
        """Every command the relay returned, in order."""
        self.now = 0.0
        self.together = together
        self._still = False
        """The clock stands still (the messages of one burst arrive at the same time)."""
        shared = _shared_observers()
        self.tally = Tally()
        self.ledger = Ledger(lambda: self.now, emit=self._observe)
        self.observers: list[Observer] = [
            self.tally,
            shared.log,
            shared.metrics,
            shared.trace,
            shared.feed,
        ]
        self.timers: list[int] = []
        self.received: dict[Side, list[bytes]] = {Side.CLIENT: [], Side.AGENT: []}
        """The id of each request a side was sent (as the proxy wrote it)."""
        self.sent: dict[Side, list[bytes]] = {Side.CLIENT: [], Side.AGENT: []}
        """The id of each request a side sent."""
        self.gone: set[Side] = set()
        self.probes = 0

    def _observe(self, observation: Observation, link: int | None = None) -> None:
        for observer in self.observers:
            observer.observe(observation, link)
        events = _shared_observers().subscriber.events  # each record encoded as /api/events
        while not events.empty():  # writes it
            events.get_nowait()

    def handle_burst(self, event: BurstReceived) -> int:
        """Feed messages read together, as :meth:`handle` feeds one; how many were taken."""
        self._tick()
        commands, taken = self.relay.handle_burst(event)
        self._carry_out(event, commands)
        return taken

    def handle(self, event: Event) -> list[Command]:
        """Feed ``event``; carry out the commands as far as a link's bookkeeping goes."""
        self._tick()
        commands = self.relay.handle(event)
        self._carry_out(event, commands)
        return commands

    def _tick(self) -> None:
        if not self._still:
            self.now += 0.001

    def _carry_out(self, event: Event | BurstReceived, commands: list[Command]) -> None:
        self.commands.extend(commands)
        for command in commands:
            if isinstance(command, Observation):
                self._observe(command, 1)
                self.ledger.observe(command, 1)
            elif isinstance(command, Send):
                for unit in _units(command.data):
                    parsed = parse(unit)
                    if isinstance(parsed, Message) and parsed.kind is Kind.REQUEST:
                        assert parsed.id_token is not None
                        self.received[command.to].append(parsed.id_token)
            elif isinstance(command, SendRun):  # notifications as they came: no request
                assert all(isinstance(parse(unit), Message) for unit in command.data)
            elif isinstance(command, StartTimer):
                self.timers.append(command.token)
            elif isinstance(command, ForgetTimer):  # as the shell does: it never fires
                if command.token in self.timers:
                    self.timers.remove(command.token)
            elif isinstance(command, Close | Sever):
                self.gone.add(command.side)
            elif isinstance(command, SendCut):  # written cut short, then severed
                self.gone.add(command.to)
        if isinstance(event, MessageReceived):
            self._check_forwarded(event, commands)

    def _check_forwarded(self, event: MessageReceived, commands: list[Command]) -> None:
        """The proxy answers only with errors; a relayed message differs only in its id."""
        source = event.side
        for command in commands:
            if isinstance(command, Send) and command.to is source:
                answer = parse(command.data)
                assert isinstance(answer, Message), command.data
                assert answer.kind is Kind.ERROR, command.data
        if self.faults:
            return  # corrupt, duplicate and delay change what is sent, by design
        units = [
            unit
            for command in commands
            if isinstance(command, Send) and command.to is source.other
            for unit in _units(command.data)
        ]
        invalid = parse(event.data)
        if (
            isinstance(invalid, Invalid)
            and not invalid.response
            and not self.strict
            and source.other not in self.gone
        ):  # forwarded, still invalid, with only a readable request id rewritten
            assert any(_without_id(parse(unit)) == _without_id(invalid) for unit in units)
        for command in commands:
            if not isinstance(command, Relayed) or command.message is None:
                continue
            message = command.message
            if message.kind is Kind.REQUEST:
                if message.method == "elicitation/create" and source is Side.AGENT:
                    continue  # its params.requestId is translated too
                assert command.forwarded_id is not None
                new_id = command.forwarded_id
            elif message.kind is Kind.NOTIFICATION:
                inner = message.params.get("method") if isinstance(message.params, dict) else None
                if message.method == acp.CANCEL_REQUEST or (
                    message.method in acp.SUCCESSORS and inner == acp.CANCEL_REQUEST
                ):
                    continue  # its params.requestId is translated
                assert message.raw in units
                continue
            else:
                assert command.original_id is not None
                new_id = command.original_id
            assert check_splice(message, new_id) in units

    def step(self, step: Step) -> None:
        """Carry out one step of a script."""
        match step:
            case Feed(side=side, data=data):
                self.handle(MessageReceived(side, data, self.now))
                self._sent(side, data)
            case Burst(side=side, messages=messages):
                self._tick()
                at, self._still = self.now, True
                try:
                    left = list(messages)
                    while left and self.together:  # as a link feeds them: the rest again
                        taken = self.handle_burst(BurstReceived(side, left, at))
                        assert taken >= 1
                        left = left[taken:]
                    for data in left:
                        self.handle(MessageReceived(side, data, at))
                finally:
                    self._still = False
                for data in messages:
                    self._sent(side, data)
            case Answer(side=side, pick=pick, body=body, error=error):
                ids = self.received[side]
                token = ids[pick % len(ids)] if ids else b"0"
                if error:
                    data = message_bytes(token, None, error=b'{"code":-32800,"message":"x"}')
                else:
                    data = message_bytes(token, None, result=body)
                self.handle(MessageReceived(side, data, self.now))
            case Cancel(side=side, pick=pick):
                ids = self.sent[side]
                token = ids[pick % len(ids)] if ids else b"0"
                data = message_bytes(
                    None, b'"$/cancel_request"', params=b'{"requestId":' + token + b"}"
                )
                self.handle(MessageReceived(side, data, self.now))
            case TooLarge(side=side, size=size):
                self.handle(OversizedReceived(side, size, 1024, self.now))
            case Hangup(side=side):
                self.gone.add(side)
                self.handle(PeerClosed(side, self.now))
            case Fire(pick=pick):
                if self.timers:
                    timer = self.timers.pop(pick % len(self.timers))
                    self.handle(TimerFired(timer, self.now))

    def _sent(self, side: Side, data: bytes) -> None:
        """Note the ids of the requests ``side`` sent in ``data``."""
        parsed = parse(data)
        elements = parsed.elements if isinstance(parsed, Batch) else (parsed,)
        for element in elements:
            if isinstance(element, Message) and element.kind is Kind.REQUEST:
                assert element.id_token is not None
                self.sent[side].append(element.id_token)

    def finish(self) -> None:
        """Fire what is held, then prove the link still works both ways."""
        while self.timers:
            self.handle(TimerFired(self.timers.pop(0), self.now))
        json.dumps(self.ledger.snapshot())  # as --state and /api/ledger write it
        self.tally.summary()
        if not self.gone:
            self.probe(Side.CLIENT)
            self.probe(Side.AGENT)

    def probe(self, side: Side) -> None:
        """A request from ``side`` reaches the other peer; its answer comes back with our id."""
        self.probes += 1
        own_id = b'"probe-%d"' % self.probes
        request = message_bytes(own_id, b'"' + PROBE_METHOD.encode() + b'"', params=b"{}")
        commands = self.handle(MessageReceived(side, request, self.now))
        sent = [c for c in commands if isinstance(c, Send)]
        assert [c.to for c in sent] == [side.other], commands
        forwarded = parse(sent[0].data)
        assert isinstance(forwarded, Message), sent
        assert forwarded.method == PROBE_METHOD, sent
        assert forwarded.id_token is not None
        answer = message_bytes(forwarded.id_token, None, result=b'{"ok":true}')
        commands = self.handle(MessageReceived(side.other, answer, self.now))
        sent = [c for c in commands if isinstance(c, Send)]
        assert [(c.to, c.data) for c in sent] == [
            (side, message_bytes(own_id, None, result=b'{"ok":true}'))
        ], commands


@dataclass(frozen=True, slots=True)
class Script:
    """Steps of both peers on one link, and how the link is set up."""

    steps: tuple[Step, ...]
    strict: bool = False
    faults: bool = False
    downstream: str = "stdio"


def check_relay(script: Script, *, fast_path: bool = True, together: bool = True) -> RelayLab:
    """Run ``script`` through a :class:`RelayLab`, then check that the link still works."""
    lab = RelayLab(
        strict=script.strict,
        faults=script.faults,
        downstream=script.downstream,
        fast_path=fast_path,
        together=together,
    )
    for step in script.steps:
        lab.step(step)
    lab.finish()
    return lab


def check_fast_path(script: Script) -> None:
    """The relay's fast path changes nothing: ``script`` run with it and without it gives the
    same commands (the same bytes to the same sides, in the same order, the same timers) and the
    same observations, down to the message each one carries, the same counts and ledger."""
    fast = check_relay(script, fast_path=True)
    full = check_relay(script, fast_path=False)
    assert fast.commands == full.commands
    carried = [[c.message for c in lab.commands if isinstance(c, Relayed)] for lab in (fast, full)]
    assert carried[0] == carried[1]
    assert fast.tally.counts == full.tally.counts
    assert fast.ledger.snapshot() == full.ledger.snapshot()


def in_bursts(script: Script) -> Script:
    """``script`` with each series of messages one side sends in a row as one :class:`Burst`."""
    steps: list[Step] = []
    for step in script.steps:
        last = steps[-1] if steps else None
        if isinstance(step, Feed) and isinstance(last, Feed | Burst) and last.side is step.side:
            before = (last.data,) if isinstance(last, Feed) else last.messages
            steps[-1] = Burst(step.side, (*before, step.data))
        else:
            steps.append(step)
    return replace(script, steps=tuple(steps))


def one_by_one(commands: list[Command]) -> list[Command]:
    """``commands`` with each run of notifications as the commands of each, one by one: its
    :class:`Relayed` then its :class:`Send`."""
    out: list[Command] = []
    runs: list[Relayed] = []
    for command in commands:
        if isinstance(command, RelayedRun):
            runs = command.each()
        elif isinstance(command, SendRun):
            assert [r.message.raw for r in runs if r.message] == list(command.data)
            for relayed, data in zip(runs, command.data, strict=True):
                out += [relayed, Send(command.to, data)]
            runs = []
        else:
            out.append(command)
    return out


def check_bursts(script: Script) -> None:
    """Messages read together change nothing: ``script`` with the messages each side sends in a
    row fed as bursts, through the fast path, gives what each fed alone through the full path
    gives: the same commands (runs told one by one), the same messages observed, the same
    counts and ledger."""
    bursts = in_bursts(script)
    together = check_relay(bursts, fast_path=True)
    alone = check_relay(bursts, fast_path=False, together=False)
    assert one_by_one(together.commands) == alone.commands
    carried = [
        [c.message for c in one_by_one(lab.commands) if isinstance(c, Relayed)]
        for lab in (together, alone)
    ]
    assert carried[0] == carried[1]
    assert together.tally.counts == alone.tally.counts
    assert together.ledger.snapshot() == alone.ledger.snapshot()


def read_script(data: bytes) -> Script:
    """A script written one step per line (the relay target's inputs, ``corpus/relay``).

    A first line ``#`` with flags sets the link up: ``s`` strict, ``f`` the fault rules of every
    action (:data:`FUZZ_RULES`), ``h`` an HTTP Client, ``w`` a WebSocket Client. Then each line
    is, by its first byte (``n``: the value of the second byte):

    ``C``/``A`` + bytes: the Client/Agent sends the bytes (a stdio line or a WebSocket text frame);
    ``c``/``a`` + n + bytes: the Client/Agent answers the n-th request it got, with the bytes as
    result; ``r``/``R`` + n: the same with an error; ``x``/``X`` + n: the Client/Agent cancels the
    n-th request it sent; ``o``/``O`` + n: an oversized message from the Client/Agent; ``h``/``H``:
    the Client/Agent hangs up; ``t`` + n: a held timer fires. Any other line: the Client sends it.
    """
    lines = data.split(b"\n")
    flags = lines.pop(0) if lines[0].startswith(b"#") else b""
    steps: list[Step] = []
    for line in lines:
        if not line:
            continue  # framing skips blank lines
        op, n, rest = line[:1], line[1] if len(line) > 1 else 0, line[1:]
        side = Side.CLIENT if op.islower() else Side.AGENT
        if op in (b"C", b"A"):
            steps.append(Feed(Side.AGENT if op == b"A" else Side.CLIENT, rest))
        elif op in (b"c", b"a"):
            steps.append(Answer(Side.CLIENT if op == b"c" else Side.AGENT, n, rest[1:] or b"{}"))
        elif op in (b"r", b"R"):
            steps.append(Answer(side, n, error=True))
        elif op in (b"x", b"X"):
            steps.append(Cancel(side, n))
        elif op in (b"o", b"O"):
            steps.append(TooLarge(side, 1025 + n))
        elif op in (b"h", b"H"):
            steps.append(Hangup(side))
        elif op == b"t":
            steps.append(Fire(n))
        else:
            steps.append(Feed(Side.CLIENT, line))
    downstream = "http" if b"h" in flags else "ws" if b"w" in flags else "stdio"
    return Script(tuple(steps), b"s" in flags, b"f" in flags, downstream)


def nasty_messages() -> list[bytes]:
    """The seed messages, and a few too big to keep as files: 100,000 brackets, closed or not,
    and a string of 300,000 escaped quotes (600 kB: under 1 MB even in base64, as aiohttp wants)."""
    return [
        *corpus("messages").values(),
        b"[" * 100_000,
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"jsonrpc":"2.0","id":2,"method":"m","params":{"t":"' + b'\\"' * 300_000 + b'"}}',
    ]


def json_structure(data: bytes) -> Any:
    """Arbitrary structures for the control API: ``data`` read as JSON, else as text."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")
