"""The replayed Agent's mind (``acp-proxy replay agent FILE``): a message in, what to send back out.

The recording (:mod:`proxy.core.recording`) is cut into exchanges: each message the Client sent
is followed by what the Agent sent on the same link before the Client's next message (its
answer, the notifications and the Agent's own requests), each at its offset in seconds from the
Client's message. A live connection asks :meth:`ReplayConnection.receive` what to do with each
message it reads:

* a **request** is matched (:mod:`proxy.core.matching`) to a recorded request of the same
  method whose ``params`` equal its own, what changes between runs aside: first an unused one of
  the recorded link this connection follows, then any unused one, then one already served (served
  again: its message ids get a suffix, ``~2``, as a new turn of a real Agent would mint new ones).
  ``strict_order`` requires the next recorded request instead. A value the recording redacted
  matches what this run sends there (:func:`proxy.core.matching.stands_for`). A request that
  matches none is answered :data:`NO_MATCH` naming the nearest recorded request and the
  differences (:data:`UNKNOWN_METHOD` when no recorded request has its method: to the Client, a
  method this Agent does not have).
* a **notification** is matched the same way; one that matches nothing is ignored (noted).
* an **answer** to a request of the replayed Agent leads to what followed the recorded answer.

What goes out is the recorded text with the ids of this run spliced in: an answer takes the id
of the live request it answers, a request of the Agent a new id of this connection, and the
recorded session ids become the live ones (a session the replay creates is its recorded id, or
that id with a suffix when it was handed out already; a recorded session id is replaced wherever
it stands as a JSON string). Delays are data: each :class:`Outgoing`
says how long after the message received it is due (its recorded offset over ``speed``; 0 with
speed 0); the shell keeps the time.

With ``dedupe`` the replay honours ``idempotencyKey`` as the RFD asks: a ``session/prompt`` whose
(session, key) was answered already gets that answer (its ``messageId``) under its own id and
nothing else; one whose original is still unanswered waits for it, then gets the same answer.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core import acp
from proxy.core.events import Direction
from proxy.core.jsonrpc import ErrorCode, Kind, Message, error_response
from proxy.core.matching import Difference, Ignore, differences, nearest
from proxy.core.recording import Recorded, Recording
from proxy.core.splice import find_member, splice

__all__ = [
    "NO_MATCH",
    "UNKNOWN_METHOD",
    "Exchange",
    "Note",
    "Outgoing",
    "ReplayAgent",
    "ReplayConnection",
    "exchanges_of",
]

NO_MATCH = ErrorCode.INTERNAL_ERROR
"""The error code of a request that matches no recorded request of its method."""
UNKNOWN_METHOD = ErrorCode.METHOD_NOT_FOUND
"""The error code of a request whose method no recorded request has (method not found)."""
MESSAGE_ID_KEYS = frozenset({"messageId", "userMessageId"})
"""Members holding a message id the Agent minted (suffixed when an exchange is served again)."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Send ``raw`` ``delay`` seconds after the message that caused it was received."""

    delay: float
    raw: bytes


@dataclass(frozen=True, slots=True)
class Note:
    """Something the replay did that its log should say: ``what`` happened to ``method``, with the
    recorded line it concerns (0: none) and the differences that decided it."""

    what: str
    method: str | None
    line: int = 0
    differences: tuple[Difference, ...] = ()


@dataclass(slots=True)
class Exchange:
    """A message of the Client and what the Agent sent after it, before the Client's next."""

    trigger: Recorded
    followers: list[tuple[float, Recorded]] = field(default_factory=list)
    message_ids: tuple[str, ...] = ()
    """The message ids the followers carry."""
    served: int = 0
    """Times it was served in this run."""


def exchanges_of(recording: Recording) -> list[Exchange]:
    """The recording's exchanges, in file order (see the module)."""
    exchanges: list[Exchange] = []
    latest: dict[int, Exchange] = {}
    for recorded in recording.messages:
        if recorded.direction is Direction.TO_AGENT:
            latest[recorded.link] = Exchange(recorded)
            exchanges.append(latest[recorded.link])
        elif (current := latest.get(recorded.link)) is not None:
            offset = max(0.0, recorded.time - current.trigger.time)
            current.followers.append((offset, recorded))
    for exchange in exchanges:
        found: list[str] = []
        for _, follower in exchange.followers:
            found.extend(_message_ids(follower.message.body, 0))
        exchange.message_ids = tuple(dict.fromkeys(found))
    return exchanges


def _message_ids(value: Any, depth: int) -> Iterator[str]:
    if depth > 32:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key in MESSAGE_ID_KEYS and isinstance(item, str):
                yield item
            else:
                yield from _message_ids(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _message_ids(item, depth + 1)


@dataclass(slots=True)
class _Keyed:
    """A keyed prompt's state under ``dedupe``: its answer's result once sent, and who waits."""

    result: bytes | None = None
    waiting: list[tuple[ReplayConnection, bytes]] = field(default_factory=list)


class ReplayAgent:
    """The replayed Agent of one recording: what every connection of this run shares."""

    def __init__(
        self,
        recording: Recording,
        *,
        ignore: Ignore | None = None,
        strict_order: bool = False,
        dedupe: bool = False,
        speed: float = 1.0,
    ) -> None:
        self.exchanges = exchanges_of(recording)
        self.ignore = ignore or Ignore()
        self.strict_order = strict_order
        self.dedupe = dedupe
        self.speed = speed
        self._requests = [e for e in self.exchanges if e.trigger.message.kind is Kind.REQUEST]
        self._by_method: dict[tuple[Kind, str | None], list[Exchange]] = {}
        """The exchanges of each kind and method of the Client's message, in file order."""
        for exchange in self.exchanges:
            sent = exchange.trigger.message
            self._by_method.setdefault((sent.kind, sent.method), []).append(exchange)
        self._next_in_order = 0
        self._answers: dict[tuple[int, bytes, bytes], Exchange] = {}
        """The Client's recorded answers to the Agent's requests, by link and the request's pair."""
        for exchange in self.exchanges:
            trigger = exchange.trigger
            if trigger.message.kind in (Kind.RESPONSE, Kind.ERROR):
                self._answers[(trigger.link, *trigger.pair)] = exchange
        self.sessions: dict[str, str] = {}
        """Live session id -> the recorded one it stands for."""
        self._handed: set[str] = set()
        self._keyed: dict[tuple[str, str], _Keyed] = {}

    def connection(self) -> ReplayConnection:
        """The state of one new live connection."""
        return ReplayConnection(self)

    def _live_session(self, recorded: str) -> str:
        """A new live session id for the recorded ``recorded`` (itself the first time)."""
        live = recorded
        for n in itertools.count(2):
            if live not in self._handed:
                break
            live = f"{recorded}~{n}"
        self._handed.add(live)
        self.sessions[live] = recorded
        return live

    def matches(self, exchange: Exchange, params: Any) -> bool:
        """Whether ``params`` are the recorded ``exchange``'s, what changes between runs, the
        ignored paths and what the recording redacted aside."""
        trigger = exchange.trigger
        _, count = differences(
            trigger.message.params,
            params,
            self.ignore,
            under=("params",),
            redacted=trigger.redacted,
        )
        return count == 0

    def _candidates(self, connection: ReplayConnection, message: Message) -> list[Exchange]:
        """Recorded exchanges of ``message``'s method and kind, in the order they are preferred."""
        kind, method = message.kind, message.method
        same = self._by_method.get((kind, method), [])
        link = connection.link

        def rank(exchange: Exchange) -> tuple[int, int]:
            unused = 0 if exchange.served == 0 else 2
            other = 0 if link is None or exchange.trigger.link == link else 1
            return (unused + other, exchange.trigger.line)

        return sorted(same, key=rank)


class ReplayConnection:
    """One live connection to the replayed Agent (see the module)."""

    def __init__(self, agent: ReplayAgent) -> None:
        self.agent = agent
        self.link: int | None = None
        """The recorded link this connection follows (that of its first match)."""
        self.sessions: dict[str, str] = {}
        """Recorded session id -> the live one, on this connection."""
        self._served: dict[tuple[int, bytes, bytes], tuple[bytes, Exchange]] = {}
        """A recorded request's link and pair -> the live id it was served under, and its
        exchange."""
        self._asked: dict[bytes, Recorded] = {}
        """The live id of a request of the replayed Agent -> the recorded request."""
        self._ids = itertools.count(1)
        self._pending_key: dict[bytes, _Keyed] = {}
        """Live ids of keyed prompts being served (``dedupe``) -> their key's state."""
        self.notes: list[Note] = []
        """What the replay did, for the log (the shell empties it)."""
        self.on_later: Callable[[Outgoing], None] | None = None
        """Told of what to send that no message of this connection caused (the answer to a
        retry that waited for its original, served on another connection)."""

    def receive(self, message: Message) -> list[Outgoing]:
        """What to send for ``message`` (see the module); :attr:`notes` says what was done."""
        self._learn_sessions(message)
        if message.kind in (Kind.RESPONSE, Kind.ERROR):
            return self._answered(message)
        exchange = self._match(message)
        if message.kind is Kind.REQUEST and self.agent.dedupe and message.method == acp.PROMPT:
            # A retry the recording has (unused) is served as recorded: the recorded Agent
            # answered it; one it does not have is answered here, as the RFD asks.
            fresh = exchange is not None and exchange.served == 0
            outgoing = self._deduped(message, recorded=fresh)
            if outgoing is not None:
                return outgoing
        if exchange is None:
            return self._refused(message) if message.kind is Kind.REQUEST else []
        return self._serve(exchange, message)

    # -- matching --------------------------------------------------------------------------

    def _match(self, message: Message) -> Exchange | None:
        agent = self.agent
        params = message.params
        if agent.strict_order and message.kind is Kind.REQUEST:
            if agent._next_in_order >= len(agent._requests):
                self.notes.append(Note("past the end of the recording", message.method))
                return None
            expected = agent._requests[agent._next_in_order]
            same = expected.trigger.message.method == message.method
            if not same or not agent.matches(expected, params):
                return None
            agent._next_in_order += 1
            return expected
        for exchange in agent._candidates(self, message):
            if agent.matches(exchange, params):
                return exchange
        return None

    def _refused(self, message: Message) -> list[Outgoing]:
        agent = self.agent
        assert message.id_token is not None
        if agent.strict_order and agent._next_in_order < len(agent._requests):
            expected = agent._requests[agent._next_in_order].trigger
            candidates: Sequence[Exchange] = [agent._requests[agent._next_in_order]]
        else:
            candidates = agent._candidates(self, message) or agent._requests
            expected = None
        best = nearest(
            message.body,
            ((e.trigger, e.trigger.message.body, e.trigger.redacted) for e in candidates),
            agent.ignore,
        )
        text = f"no recorded request matches this {message.method}"
        data: dict[str, Any] = {"method": message.method}
        if best is not None:
            recorded, found, count = best
            what = "the next recorded request" if expected is not None else "the nearest"
            text += f"; {what} is line {recorded.line} ({recorded.message.method})"
            if found:
                first = found[0]
                text += f", which differs at {first.path or 'the top'}: recorded "
                text += f"{_short(first.recorded)}, got {_short(first.got)}"
            data["nearest"] = {"line": recorded.line, "method": recorded.message.method}
            data["differences"] = [d.to_json() for d in found]
            data["count"] = count
            self.notes.append(Note("no match", message.method, recorded.line, tuple(found)))
        else:
            text += "; the recording holds no request"
            self.notes.append(Note("no match", message.method))
        known = (Kind.REQUEST, message.method) in agent._by_method
        code = NO_MATCH if known else UNKNOWN_METHOD
        return [Outgoing(0.0, error_response(message.id_token, code, text, data))]

    # -- serving ---------------------------------------------------------------------------

    def _serve(self, exchange: Exchange, message: Message) -> list[Outgoing]:
        agent = self.agent
        trigger = exchange.trigger
        if self.link is None:
            self.link = trigger.link
        exchange.served += 1
        generation = exchange.served
        if message.kind is Kind.REQUEST:
            assert message.id_token is not None
            self._served[(trigger.link, *trigger.pair)] = (message.id_token, exchange)
        self.notes.append(
            Note("served" if generation == 1 else "served again", message.method, trigger.line)
        )
        outgoing: list[Outgoing] = []
        speed = agent.speed
        for offset, follower in exchange.followers:
            delay = offset / speed if speed > 0 else 0.0
            raw = self._mapped(follower, exchange, generation, delay)
            if raw is not None:
                outgoing.append(Outgoing(delay, raw))
        return outgoing

    def _mapped(
        self, follower: Recorded, exchange: Exchange, generation: int, delay: float
    ) -> bytes | None:
        """The recorded ``follower`` with this run's ids; ``None`` when it answers a request this
        connection was not asked."""
        message = follower.message
        raw = message.raw
        edits = []
        keyed: _Keyed | None = None
        if message.kind in (Kind.RESPONSE, Kind.ERROR):
            served = self._served.get((follower.link, *follower.pair))
            if served is None:
                self.notes.append(Note("answer to a request not asked here", None, follower.line))
                return None
            live_id, answered = served
            request = answered.trigger.message
            keyed = self._pending_key.pop(live_id, None)
            edits = [(span, live_id) for span in message.id_spans]
            if request.method == acp.NEW_SESSION:
                raw = self._new_session(raw, message)
        elif message.kind is Kind.REQUEST:
            live = str(next(self._ids)).encode()
            self._asked[live] = follower
            edits = [(span, live) for span in message.id_spans]
        raw = splice(raw, edits)
        raw = self._replace_sessions(raw)
        if generation > 1:
            for message_id in exchange.message_ids:
                old = orjson.dumps(message_id)
                raw = raw.replace(old, orjson.dumps(f"{message_id}~{generation}"))
        if keyed is not None:
            self._settle_key(keyed, raw, delay)
        return raw

    def _new_session(self, raw: bytes, message: Message) -> bytes:
        result = message.body.get("result")
        recorded = result.get("sessionId") if isinstance(result, dict) else None
        if not isinstance(recorded, str):
            return raw
        live = self.agent._live_session(recorded)
        self.sessions[recorded] = live
        return raw

    def _replace_sessions(self, raw: bytes) -> bytes:
        for recorded, live in self.sessions.items():
            if recorded != live:
                raw = raw.replace(orjson.dumps(recorded), orjson.dumps(live))
        return raw

    def _learn_sessions(self, message: Message) -> None:
        """A live session id this connection did not make (a resume): the recorded one it
        stands for is that of the connection that made it."""
        live = message.session
        if live is not None and live in self.agent.sessions:
            self.sessions.setdefault(self.agent.sessions[live], live)

    def _answered(self, message: Message) -> list[Outgoing]:
        if message.id_token is None:
            return []
        asked = self._asked.pop(message.id_token, None)
        if asked is None:
            self.notes.append(Note("answer to no request of the replay", None))
            return []
        exchange = self.agent._answers.get((asked.link, *asked.pair))
        if exchange is None:
            self.notes.append(Note("answer never recorded", asked.message.method, asked.line))
            return []
        return self._serve(exchange, message)

    # -- dedupe ----------------------------------------------------------------------------

    def _deduped(self, message: Message, *, recorded: bool) -> list[Outgoing] | None:
        """A keyed prompt seen before (and not ``recorded`` as a retry): its original answer, now
        or when it comes; ``None`` for a prompt to serve."""
        params = message.params if isinstance(message.params, dict) else {}
        key, session = params.get("idempotencyKey"), message.session
        if not isinstance(key, str) or session is None:
            return None
        assert message.id_token is not None
        keyed = self.agent._keyed.get((session, key))
        if keyed is None:
            keyed = self.agent._keyed[(session, key)] = _Keyed()
            self._pending_key[message.id_token] = keyed
            return None
        if recorded:
            return None
        self.notes.append(Note("retry answered as the original", message.method))
        if keyed.result is None:
            keyed.waiting.append((self, message.id_token))
            return []
        return [Outgoing(0.0, _answer(message.id_token, keyed.result))]

    def _settle_key(self, keyed: _Keyed, raw: bytes, delay: float) -> None:
        """The original of a key was answered (``raw``): its retries waiting get the same
        answer; an error leaves the key unused."""
        span = find_member(raw, ("result",))
        if span is None:  # an error: the key stays unused
            for key, state in list(self.agent._keyed.items()):
                if state is keyed:
                    del self.agent._keyed[key]
            answer = functools.partial(_re_id, raw)
        else:
            keyed.result = raw[span[0] : span[1]]
            answer = functools.partial(_answer, result=keyed.result)
        for connection, live_id in keyed.waiting:
            if connection.on_later is not None:
                connection.on_later(Outgoing(delay, answer(live_id)))
        keyed.waiting.clear()


def _answer(id_token: bytes, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_token + b',"result":' + result + b"}"


def _re_id(raw: bytes, id_token: bytes) -> bytes:
    """The answer ``raw`` under another id."""
    span = find_member(raw, ("id",))
    return raw if span is None else splice(raw, [(span, id_token)])


def _short(value: Any) -> str:
    text = orjson.dumps(value, default=repr).decode() if value is not None else "null"
    return text if len(text) <= 60 else text[:57] + "..."
