"""The idempotency ledger (DESIGN 7): what the proxy saw of keyed prompts, and the RFD's findings.

An observer of the relay, and itself pure: the clock is passed in, findings and attempts go out
through ``emit`` as observations (metrics, trace and logs take them from there). It judges what
crossed the proxy when it crossed: a held message (``delay``, a spaced copy) counts when it is
delivered (its :class:`~proxy.core.observations.Relayed`), not when it was held, so a keyed
prompt held while its retry overtook it is the second attempt the Agent saw.

For every ``session/prompt`` carrying ``idempotencyKey`` it records, per (session, key): the
attempts (link, ids, time, a hash of the prompt), their outcomes (``messageId`` or error code) and
the ``user_message`` inserts whose content is that prompt. Sessions are global: a retry on another
link (another connection, another proxy restart) meets the same entry. The checks:

``duplicate_insert``
    one (session, key) ends up with two different ``messageId`` s (answers, answers to injected
    copies, or ``user_message`` inserts of its prompt).
``invalid_key_accepted``
    a key that is not a 1-255 character string was answered with anything but ``-32602``.
``key_reused_other_prompt``
    the Client sent a recorded key with a different prompt (a Client fault).
``key_echoed``
    a key appears in an Agent-to-Client message.
``cancel_incomplete``
    after ``$/cancel_request`` of a pending keyed prompt, the requests pending with that key were
    not all answered alike (some ``-32800``, some a success).
``unkeyed_resend``
    the Client re-sent an identical ``session/prompt`` without a key after a fault cost the
    first one its answer (an unsafe retry; a warning).

Retries are measured: attempts per key, the time from the fault to the retry, and whether a
retry got the original ``messageId``.

A prompt without a key is digested only for ``unkeyed_resend``, which needs its digest once a
fault cost it its answer: the ledger holds its content while it is pending and digests it if a
fault costs it its answer, never once it is answered (a 64 KiB prompt's digest is 40 us of CPU,
most of it CRC-32). It holds :data:`UNDIGESTED_BYTES` of such prompts at most; past them, and in
a session that has lost such a prompt already (it may be the resend), a prompt is digested as it
is seen.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import orjson

from proxy.core import acp
from proxy.core.actions import ActionName
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import ErrorCode, Kind, Message, token_at
from proxy.core.observations import (
    Check,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    Finding,
    HeldEnded,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Relayed,
    RelayedRun,
    Restarted,
    Via,
)
from proxy.core.search import contains

__all__ = ["CHECKS", "Ledger"]

CHECKS: Final = tuple(Check)
"""Every check, in the order of DESIGN 7."""
_ANSWER_KINDS: Final = (Kind.RESPONSE, Kind.ERROR)
LOSING_ACTIONS: Final = frozenset(
    {
        ActionName.DROP,
        ActionName.SEVER,
        ActionName.KILL_AGENT,
        ActionName.RESTART_PROXY,
        ActionName.HTTP_STATUS,
        ActionName.CLOSE_STREAM,
        ActionName.CORRUPT,
        ActionName.TRUNCATE,
        ActionName.TIMEOUT,
    }
)
"""Fault actions after which a prompt's outcome is unknown to the Client."""
LOSING_HOLD_OUTCOMES: Final = frozenset({"drop", "timeout_drop", "link_end"})
"""How a ``hold`` rule's message may end that loses it, as a ``drop`` rule would (released or
edited, it goes on)."""


UNDIGESTED_BYTES: Final = 16 * 1024 * 1024
"""Bytes of pending prompts without a key (as they crossed the proxy) whose content the ledger
holds undigested, at most (see the module): a Client with hundreds of large prompts pending at
once gets them digested as they are seen, and the ledger never holds more than this of them."""

HASHED_WHOLE: Final = 4096
"""Bytes of a prompt's canonical JSON up to which :func:`prompt_hash` runs SHA-256 over all of
it; past them, over its length, its CRC-32 and its first :data:`HASHED_WHOLE` bytes. SHA-256
costs 31 us for a 64 KiB prompt, more than parsing it (12); CRC-32 costs 9."""


def prompt_hash(prompt: Any) -> str:
    """A short digest of a prompt (or of a message's content), insensitive to key order.

    Two prompts that differ get different digests but for a chance of 2^-64, or, past
    :data:`HASHED_WHOLE` bytes, of 2^-32 when they have the same length and the same start:
    enough to tell a retry's prompt from another one (the digest is never a commitment to
    the text: nothing here defends against a peer that forges a collision).
    """
    try:
        canonical = orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        canonical = repr(prompt).encode()
    if len(canonical) > HASHED_WHOLE:
        canonical = b"%d:%d:%b" % (
            len(canonical),
            zlib.crc32(canonical),
            canonical[:HASHED_WHOLE],
        )
    return hashlib.sha256(canonical).hexdigest()[:16]


def valid_key(key: object) -> bool:
    """The RFD's key: a string of 1 to 255 characters."""
    return isinstance(key, str) and 1 <= len(key) <= 255


@dataclass
class Attempt:
    """One keyed request as the Client sent it."""

    link: int | None
    id: Any
    at: float
    outcome: str | int | None = None
    """The ``messageId`` answered, an error code, or None while pending (or lost)."""


@dataclass(kw_only=True)
class Entry:
    """What the ledger knows of one (session, key)."""

    session: str
    key: str
    prompt: str
    attempts: list[Attempt] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    inserts: list[str] = field(default_factory=list)
    retry_delays_ms: list[float] = field(default_factory=list)
    original_returned: bool | None = None
    fault_at: float | None = None
    cancel_group: list[Attempt] | None = None

    def summary(self) -> dict[str, Any]:
        """The entry as ``/api/ledger`` shows it."""
        data = asdict(self)
        data.pop("cancel_group")
        data.pop("fault_at")
        data["retries"] = max(0, len(self.attempts) - 1)
        return data


@dataclass
class _Pending:
    entry: Entry | None
    attempt: Attempt
    session: str | None
    prompt: str | None
    """The prompt's digest; None while the ledger holds ``content`` instead."""
    invalid_key: Any = None
    keyed_invalid: bool = False
    content: Any = None
    """The prompt itself, while its digest is not taken (:meth:`Ledger._digest`)."""
    held: int = 0
    """Bytes of the prompt as it crossed, while ``content`` is held: its share of
    :data:`UNDIGESTED_BYTES`."""


class Ledger:
    """Keyed prompts across links, and the findings of DESIGN 7."""

    def __init__(
        self,
        clock: Callable[[], float],
        emit: Callable[[Observation, int | None], None] | None = None,
        undigested_bytes: int = UNDIGESTED_BYTES,
    ) -> None:
        self._clock = clock
        self._emit = emit or (lambda observation, link: None)
        self._undigested_bytes = undigested_bytes
        self.held_bytes = 0
        """Bytes of the pending prompts without a key held undigested (see the module)."""
        self.entries: dict[tuple[str, str], Entry] = {}
        self.findings: list[dict[str, Any]] = []
        self._found: set[tuple[str, str | None, str | None]] = set()
        self._pending: dict[tuple[int | None, bytes], _Pending] = {}
        self._by_client_id: dict[tuple[int | None, bytes], _Pending] = {}
        self._lost_unkeyed: dict[str | None, set[str]] = {}
        """The digests of the prompts without a key that a fault cost their answer, by session."""
        self._fault_at: dict[str, float] = {}
        self._keys: dict[str, list[str]] = {}
        self._needles: dict[str, bytes] = {}
        """Each key as it would appear inside a JSON string (searched for in what Agents send)."""

    # -- the observer ----------------------------------------------------------------------------

    def observe(self, observation: Observation, link: int | None = None) -> None:
        """Take one observation of the relay (or of a link)."""
        if isinstance(observation, Relayed):  # one per message: before the match's cases
            message = observation.message
            kind = observation.kind
            if observation.copy:
                if message is not None and kind == Kind.REQUEST:
                    self._copy(observation, message, link)
                # a copy of a notification or an answer: bytes the ledger has seen already
            elif message is not None:
                self._relayed(observation, message, link)
            elif (
                observation.direction is Direction.TO_CLIENT
                and kind in _ANSWER_KINDS
                and observation.method == acp.PROMPT
            ):  # an answer no parser reads, passed on
                self._unreadable_answer(observation, link)
            return
        if isinstance(observation, RelayedRun):  # notifications: they matter once keys are known
            if self._keys:
                for relayed in observation.each():
                    self.observe(relayed, link)
            return
        match observation:
            case DuplicateSwallowed(method=method, data=data) if method == acp.PROMPT:
                self._swallowed(observation.forwarded_id, data, link)
            case FaultInjected(method=method, action=action) if method == acp.PROMPT:
                if action in LOSING_ACTIONS:
                    self._loss(observation.session, observation.kind, observation.id, link)
            case HeldEnded(outcome=outcome, relayed=held) if held.method == acp.PROMPT:
                if outcome in LOSING_HOLD_OUTCOMES:
                    self._loss(held.session, held.kind, held.forwarded_id, link)
            case Restarted() | Disconnected(side=Side.AGENT):
                self._link_lost(link)
            case _:
                pass

    def _relayed(self, seen: Relayed, message: Message, link: int | None) -> None:
        if seen.direction is Direction.TO_AGENT:
            if seen.kind is Kind.REQUEST and seen.method == acp.PROMPT:
                self._prompt(message, seen, link)
            elif seen.kind is Kind.NOTIFICATION and message.method == acp.CANCEL_REQUEST:
                self._cancel(message, link)
            return
        self._echo(message, link)
        if seen.kind in (Kind.RESPONSE, Kind.ERROR) and seen.method == acp.PROMPT:
            self._answer(message, seen, link)
        elif seen.kind is Kind.NOTIFICATION and message.method == acp.SESSION_UPDATE:
            self._update(message, link)

    # -- attempts --------------------------------------------------------------------------------

    def _prompt(self, message: Message, seen: Relayed, link: int | None) -> None:
        params = message.params if isinstance(message.params, dict) else {}
        session = params.get("sessionId") if isinstance(params.get("sessionId"), str) else None
        now = self._clock()
        attempt = Attempt(link, _id_value(message.id_token), now)
        assert seen.forwarded_id is not None
        slot = (link, seen.forwarded_id)
        key = params.get("idempotencyKey")
        digest = message.content_digest
        if (
            key is None
            and digest is None
            and session not in self._lost_unkeyed
            and self.held_bytes + seen.size <= self._undigested_bytes
        ):
            self.held_bytes += seen.size
            self._pending[slot] = _Pending(
                None, attempt, session, None, content=params.get("prompt"), held=seen.size
            )
            return
        if digest is None:
            digest = prompt_hash(params.get("prompt"))
        if key is None:
            if digest in self._lost_unkeyed.get(session, ()):
                self._find(
                    Check.UNKEYED_RESEND,
                    session,
                    None,
                    "an identical prompt was resent without an idempotencyKey after its "
                    "answer was lost",
                    link,
                )
            self._pending[slot] = _Pending(None, attempt, session, digest)
            return
        if not valid_key(key) or session is None:
            self._pending[slot] = _Pending(None, attempt, session, digest, key, keyed_invalid=True)
            return
        entry = self.entries.get((session, key))
        retry = entry is not None
        if entry is None:
            entry = self.entries[(session, key)] = Entry(session=session, key=key, prompt=digest)
            self._remember(session, key)
        elif entry.prompt != digest:
            self._find(
                Check.KEY_REUSED_OTHER_PROMPT,
                session,
                key,
                "a recorded key came with a different prompt",
                link,
            )
        if retry:
            fault_at = max(entry.fault_at or 0.0, self._fault_at.get(session, 0.0))
            previous = entry.attempts[-1].at if entry.attempts else 0.0
            if fault_at and fault_at >= previous:
                entry.retry_delays_ms.append(round((now - fault_at) * 1000, 3))
        entry.attempts.append(attempt)
        pending = _Pending(entry, attempt, session, digest)
        self._pending[slot] = pending
        if message.id_token is not None:
            self._by_client_id[(link, message.id_token)] = pending
        self._emit(KeyedAttempt(session=session, retry=retry, key=key, prompt=digest), link)

    def _digest(self, pending: _Pending) -> str:
        """The digest of ``pending``'s prompt, taken now if it was held undigested."""
        digest = pending.prompt
        if digest is None:
            digest = pending.prompt = prompt_hash(pending.content)
            self._let_go(pending)
        return digest

    def _let_go(self, pending: _Pending) -> None:
        """``pending`` holds its prompt's content no longer."""
        self.held_bytes -= pending.held
        pending.held = 0
        pending.content = None

    def _copy(self, seen: Relayed, message: Message, link: int | None) -> None:
        """A copy the proxy injected of a keyed prompt: not an attempt, but its answer counts.

        Its key's entry is found by its own session and key: a copy spaced by ``gap_ms`` may
        leave after its original was answered (no longer pending)."""
        params = message.params if isinstance(message.params, dict) else {}
        session, key = params.get("sessionId"), params.get("idempotencyKey")
        if not isinstance(session, str) or not isinstance(key, str):
            return
        entry = self.entries.get((session, key))
        if entry is not None and seen.forwarded_id is not None:
            attempt = Attempt(link, _id_value(message.id_token), self._clock())
            self._pending[(link, seen.forwarded_id)] = _Pending(entry, attempt, None, "")

    def _answered(self, seen: Relayed, link: int | None) -> _Pending | None:
        """The prompt the answer ``seen`` is for, no longer pending (None: not one we track)."""
        pending = self._pending.pop((link, seen.forwarded_id or b""), None)
        if pending is not None:
            self._let_go(pending)
            self._by_client_id.pop((link, seen.original_id or b""), None)
        return pending

    def _unreadable_answer(self, seen: Relayed, link: int | None) -> None:
        """An answer the proxy could not parse went to the Client: the attempt is answered,
        with no messageId to judge."""
        pending = self._answered(seen, link)
        if pending is not None and pending.entry is not None and not pending.keyed_invalid:
            pending.attempt.outcome = "unreadable"
            self._cancel_settled(pending.entry, link)

    def _answer(self, message: Message, seen: Relayed, link: int | None) -> None:
        pending = self._answered(seen, link)
        if pending is None:
            return
        error = message.body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if pending.keyed_invalid:
            if code != ErrorCode.INVALID_PARAMS:
                outcome = "a success" if error is None else f"error {code}"
                self._find(
                    Check.INVALID_KEY_ACCEPTED,
                    pending.session,
                    repr(pending.invalid_key)[:80],
                    f"an invalid idempotencyKey was answered with {outcome}, not -32602",
                    link,
                )
            return
        entry = pending.entry
        if entry is None:
            return
        if error is not None:
            pending.attempt.outcome = code if isinstance(code, int) else "error"
        else:
            result = message.body.get("result")
            message_id = result.get("messageId") if isinstance(result, dict) else None
            pending.attempt.outcome = message_id if isinstance(message_id, str) else "success"
            if isinstance(message_id, str):
                self._message_id(entry, message_id, "answer", link)
                if pending.attempt is not entry.attempts[0]:
                    entry.original_returned = message_id == entry.message_ids[0]
        self._cancel_settled(entry, link)

    def _message_id(self, entry: Entry, message_id: str, via: Via, link: int | None) -> None:
        if message_id not in entry.message_ids:
            entry.message_ids.append(message_id)
            if message_id not in entry.inserts:
                self._emit(
                    KeyedMessage(
                        session=entry.session, key=entry.key, message_id=message_id, via=via
                    ),
                    link,
                )
        self._check_duplicates(entry, link)

    def _check_duplicates(self, entry: Entry, link: int | None) -> None:
        named = sorted(set(entry.message_ids) | set(entry.inserts))
        if len(named) > 1:
            self._find(
                Check.DUPLICATE_INSERT,
                entry.session,
                entry.key,
                f"one key, several messages: {named}",
                link,
            )

    def _swallowed(self, forwarded_id: bytes, data: bytes, link: int | None) -> None:
        """The answer to an injected copy of a keyed prompt: it must name the same message."""
        pending = self._pending.pop((link, forwarded_id), None)
        if pending is None or pending.entry is None:
            return  # (the answer to a copy: never a prompt held undigested, which has no key)
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        result = body.get("result") if isinstance(body, dict) else None
        message_id = result.get("messageId") if isinstance(result, dict) else None
        if isinstance(message_id, str):
            self._message_id(pending.entry, message_id, "copy", link)

    def _update(self, message: Message, link: int | None) -> None:
        if message.session not in self._keys:
            return  # no keyed prompt in this session: no insert of one to record
        params = message.params if isinstance(message.params, dict) else {}
        update = params.get("update")
        session = params.get("sessionId")
        if not isinstance(update, dict) or not isinstance(session, str):
            return
        if update.get("sessionUpdate") != "user_message":
            return
        message_id = update.get("messageId")
        if not isinstance(message_id, str):
            return
        digest = message.content_digest or prompt_hash(update.get("content"))
        entries = (self.entries[(session, key)] for key in self._keys.get(session, ()))
        entry = _inserted_for([e for e in entries if e.prompt == digest], message_id)
        if entry is None or message_id in entry.inserts:
            return
        entry.inserts.append(message_id)
        if message_id not in entry.message_ids:
            self._emit(
                KeyedMessage(session=session, key=entry.key, message_id=message_id, via="insert"),
                link,
            )
        self._check_duplicates(entry, link)

    # -- cancel, faults, echoes ------------------------------------------------------------------

    def _cancel(self, message: Message, link: int | None) -> None:
        found = token_at(message.raw, ("params", "requestId"))
        if found is None:
            return
        pending = self._by_client_id.get((link, found[1]))  # the id as the Client wrote it
        if pending is None or pending.entry is None:
            return
        entry = pending.entry
        entry.cancel_group = [
            p.attempt
            for p in self._pending.values()
            if p.entry is entry and p.attempt.outcome is None
        ]

    def _cancel_settled(self, entry: Entry, link: int | None) -> None:
        group = entry.cancel_group
        if group is None or any(attempt.outcome is None for attempt in group):
            return
        entry.cancel_group = None
        cancelled = [a for a in group if a.outcome == ErrorCode.REQUEST_CANCELLED]
        if cancelled and len(cancelled) != len(group):
            self._find(
                Check.CANCEL_INCOMPLETE,
                entry.session,
                entry.key,
                f"after $/cancel_request {len(cancelled)} of {len(group)} pending requests "
                "with the key got -32800",
                link,
            )

    def _loss(
        self, session: str | None, kind: Kind, wire_id: bytes | None, link: int | None
    ) -> None:
        """A fault lost a prompt or its answer (``wire_id``: the answer's id on the Agent's
        hop): the session had a fault now, and the answer's attempt is lost."""
        now = self._clock()
        if session is not None:
            self._fault_at[session] = now
        if kind in _ANSWER_KINDS and wire_id is not None:
            pending = self._pending.get((link, wire_id))
            if pending is not None:
                self._lost(pending, now)

    def _link_lost(self, link: int | None) -> None:
        now = self._clock()
        for (pending_link, _), pending in list(self._pending.items()):
            if pending_link == link and pending.attempt.outcome is None:
                self._lost(pending, now)

    def _lost(self, pending: _Pending, now: float) -> None:
        if pending.entry is not None:
            pending.entry.fault_at = now
        elif not pending.keyed_invalid:
            self._lost_unkeyed.setdefault(pending.session, set()).add(self._digest(pending))

    def _remember(self, session: str, key: str) -> None:
        self._keys.setdefault(session, []).append(key)
        self._needles[key] = _needle(key)

    def _echo(self, message: Message, link: int | None) -> None:
        """Keys are private: none may appear in what the Agent sends (its session's keys)."""
        raw = message.raw
        session = message.session
        sessions = [session] if session is not None else list(self._keys)
        for name in sessions:
            for key in self._keys.get(name, ()):
                if contains(raw, self._needles[key]):
                    detail = "the key appeared in an Agent-to-Client message"
                    self._find(Check.KEY_ECHOED, name, key, detail, link)

    def _find(
        self, check: Check, session: str | None, key: str | None, detail: str, link: int | None
    ) -> None:
        if (check, session, key) in self._found:
            return
        self._found.add((check, session, key))
        self.findings.append(
            {
                "check": check,
                "session": session,
                "key": key,
                "detail": detail,
                "link": link,
                "time": self._clock(),
            }
        )
        self._emit(Finding(check=check, session=session, key=key, detail=detail), link)

    # -- views and persistence -------------------------------------------------------------------

    def summary(self) -> list[dict[str, Any]]:
        """Every entry, as ``/api/ledger`` shows it."""
        return [entry.summary() for entry in self.entries.values()]

    def snapshot(self) -> dict[str, Any]:
        """Entries and findings as JSON-ready data (``--state``)."""
        return {"entries": self.summary(), "findings": list(self.findings)}

    def restore(self, data: dict[str, Any]) -> None:
        """Take entries and findings from a snapshot (pending requests are not carried over)."""
        for item in data.get("entries", []):
            entry = Entry(
                session=item["session"],
                key=item["key"],
                prompt=item["prompt"],
                attempts=[
                    Attempt(a["link"], a["id"], a["at"], a["outcome"]) for a in item["attempts"]
                ],
                message_ids=list(item["message_ids"]),
                inserts=list(item["inserts"]),
                retry_delays_ms=list(item["retry_delays_ms"]),
                original_returned=item["original_returned"],
            )
            self.entries[(entry.session, entry.key)] = entry
            self._remember(entry.session, entry.key)
        for finding in data.get("findings", []):
            self.findings.append(finding)
            self._found.add((finding["check"], finding["session"], finding["key"]))


def _inserted_for(candidates: list[Entry], message_id: str) -> Entry | None:
    """Which submission a ``user_message`` insert of their (one) prompt text belongs to.

    Two submissions may rightly carry the same text under two keys (the RFD: a new key for a
    new submission), so an insert is never counted for both. It belongs to the entry that
    already names its ``messageId`` (an answer, or the same insert replayed); else to the
    oldest entry not inserted yet (inserts come in the order prompts were submitted); else it is
    a second insert, of the entry tried last (the retry that made it).
    """
    for entry in candidates:
        if message_id in entry.inserts or message_id in entry.message_ids:
            return entry
    for entry in candidates:
        if not entry.inserts and not entry.message_ids:
            return entry
    tried = [entry for entry in candidates if entry.attempts]
    if tried:
        return max(tried, key=lambda entry: entry.attempts[-1].at)
    return candidates[-1] if candidates else None


def _needle(key: str) -> bytes:
    """``key`` as it appears inside a JSON string."""
    try:
        return orjson.dumps(key)[1:-1]
    except TypeError:  # a lone surrogate, which JSON can only carry as an escape (\ud800)
        return json.dumps(key, ensure_ascii=False)[1:-1].encode("utf-8", "backslashreplace")


def _id_value(token: bytes | None) -> Any:
    if token is None:
        return None
    try:
        return orjson.loads(token)
    except orjson.JSONDecodeError:
        return token.decode("utf-8", "replace")
