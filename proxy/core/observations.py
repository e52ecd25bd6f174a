"""What the relay core saw: facts in the past tense, for logs, counters, metrics and the trace.

The relay returns them among its commands (:mod:`proxy.core.commands`), the ledger emits its own
(:class:`KeyedAttempt`, :class:`KeyedMessage`, :class:`Finding`), and the shell adds the few only
it can see (:class:`Connected`, :class:`Disconnected`, :class:`Restarted`, :class:`RulesReloaded`).
Each is declared once, here; the shell's observers consume them (:mod:`proxy.shell.observers`:
the tally the metrics read and the log lines) and :mod:`proxy.core.records` turns each into its
trace record.

The values a field can hold are closed where the proxy alone decides them (a disposition, a
restart's ``what``, a reload's ``result``, a finding's ``check``), so that a typo fails mypy; a
fault's ``action`` is a built-in action's :class:`~proxy.core.actions.ActionName` or the name of
another registered action (:data:`proxy.core.actions.actions`: other packages add theirs).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import InvalidReason, Kind, Message, notification
from proxy.core.values import value

if TYPE_CHECKING:  # the actions' package imports this module (an action's effects stop with it)
    from proxy.core.actions import ActionName

__all__ = [
    "CancelDropped",
    "Check",
    "Connected",
    "Disconnected",
    "DuplicateSwallowed",
    "FaultInjected",
    "FaultOverflowed",
    "Finding",
    "Handling",
    "Held",
    "HeldEnded",
    "HeldOutcome",
    "HeldThen",
    "IdReused",
    "InflightRefused",
    "InitializeCached",
    "InitializeTimedOut",
    "InvalidSeen",
    "KeyedAttempt",
    "KeyedMessage",
    "Observation",
    "Orphaned",
    "PeerGone",
    "Relayed",
    "RelayedRun",
    "ReloadResult",
    "RestartWhat",
    "Restarted",
    "RulesCounted",
    "RulesReloaded",
    "StallEnded",
    "Stopped",
    "Stopping",
    "TooManyPending",
    "Undeliverable",
    "Unroutable",
    "Via",
    "relayed_notification",
]

Stopping = Literal["dropped", "answered_by_proxy", "severed", "refused"]
"""How a fault stopped a message: ``dropped`` (``drop``), ``answered_by_proxy`` (``error``),
``severed`` (``sever`` before forwarding), ``refused`` (``http_status`` without ``forward``)."""

HeldOutcome = Literal["release", "drop", "edit", "timeout_release", "timeout_drop", "link_end"]
"""How a ``hold`` rule's hold ended: the control API released, dropped or edited the message,
its timeout released or dropped it, or its link ended (or a restart replaced its Agent) with it
held."""

HeldThen = Literal["release", "drop"]
"""What a ``hold`` rule's timeout does to the message it holds."""

RestartWhat = Literal["proxy", "agent"]
"""What was restarted: the data plane (``proxy``) or the Agent of one link (``agent``)."""

ReloadResult = Literal["success", "error"]
"""How a reload of the fault files ended (``error``: the last good rules kept)."""

Via = Literal["answer", "copy", "insert"]
"""Where the Agent named a ``messageId`` for a key: the prompt's answer, the answer to an
injected copy of it, or a ``user_message`` insert of that prompt."""


class Check(enum.StrEnum):
    """A rule of the idempotency RFD the ledger checks (DESIGN 7; :mod:`proxy.core.ledger`), and
    the one only ``report`` judges, over whole traces (:attr:`PROMPT_NOT_RESENT`)."""

    DUPLICATE_INSERT = "duplicate_insert"
    INVALID_KEY_ACCEPTED = "invalid_key_accepted"
    KEY_REUSED_OTHER_PROMPT = "key_reused_other_prompt"
    KEY_ECHOED = "key_echoed"
    CANCEL_INCOMPLETE = "cancel_incomplete"
    UNKEYED_RESEND = "unkeyed_resend"
    PROMPT_NOT_RESENT = "prompt_not_resent"
    """A prompt whose answer was lost and that the Client never sent again: "the user's input is
    dropped without an error" (the RFD; Clients SHOULD resend a pending prompt)."""


class Handling(enum.StrEnum):
    """What the proxy did with an invalid message."""

    FORWARDED = "forwarded"
    """As it came, but for a request id a lenient peer could read (rewritten as any)."""
    ANSWERED = "answered by the proxy"
    DROPPED = "dropped"


@value
class Observation:
    """Base of everything the core records."""


@value(kw_only=True)
class Relayed(Observation):
    """A message was forwarded (its id rewritten where it had one): it left the proxy now.

    A held message (:class:`Held`) is observed so when its timer fires and it is sent.
    """

    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    size: int
    original_id: bytes | None = None
    forwarded_id: bytes | None = None
    duration: float | None = None
    """For an answer: seconds from its request's arrival at the proxy to this answer's
    delivery (injected delays on either leg included)."""
    message: Message | None = field(default=None, compare=False, repr=False)
    """The message as it arrived (its body parsed), for observers that judge content."""
    copy: bool = False
    """An extra copy the proxy injected (``duplicate``), not a message of the sender's."""
    hold: int | None = None
    """The :class:`Held` this message was released from, if it was held."""


@value(kw_only=True)
class RelayedRun(Observation):
    """Notifications of one method, read together, were forwarded as they came: what a
    :class:`Relayed` each would tell, told once (the relay's fast path for a burst).

    An observer that counts takes ``len(raws)`` messages and ``size`` bytes at once; one that
    judges each message asks for :meth:`each`, the :class:`Relayed` of every one, in order.
    """

    direction: Direction
    method: str
    size: int
    """Bytes of all of them."""
    raws: Sequence[bytes] = field(repr=False)
    bodies: Sequence[dict[str, Any]] = field(compare=False, repr=False)
    """Their JSON, parsed (one object each)."""

    def each(self) -> list[Relayed]:
        """The :class:`Relayed` of each message, as the relay observes one forwarded alone."""
        direction, method = self.direction, self.method
        return [
            relayed_notification(direction, notification(raw, body, method))
            for raw, body in zip(self.raws, self.bodies, strict=True)
        ]


def relayed_notification(direction: Direction, message: Message) -> Relayed:
    """The observation of the notification ``message``, forwarded as it came."""
    return Relayed(
        direction=direction,
        kind=Kind.NOTIFICATION,
        method=message.method,
        session=message.session,
        size=len(message.raw),
        message=message,
    )


@value(kw_only=True)
class Held(Observation):
    """A message was held behind a timer (a ``delay``, a ``duplicate`` copy spaced by
    ``gap_ms``): nothing of it has left the proxy yet.

    When the timer fires the message leaves, observed then as ``relayed`` with ``hold`` set to
    this ``hold``, or it cannot (its peer is gone), observed as an :class:`Undeliverable` with
    this ``hold``.
    """

    hold: int
    """Names this hold on its link (the delivery carries it too)."""
    rules: tuple[str, ...]
    """The rules whose ``delay`` or ``gap_ms`` hold it."""
    delay: float
    """Seconds it is held."""
    relayed: Relayed
    """What will be observed when it leaves (a ``duration`` not yet counting the wait)."""
    held_id: int | None = None
    """A ``hold`` rule's message (a breakpoint): its proxy-wide id, by which the control API
    acts on it (:mod:`proxy.core.held`); ``delay`` is then its timeout."""
    then: HeldThen | None = None
    """A ``hold`` rule's message: what its timeout does to it."""


@value(kw_only=True)
class HeldEnded(Observation):
    """A message a ``hold`` rule held (``held_id``) is held no more: ``outcome`` says how. What
    happens to it next is observed as for any held message: its :class:`Relayed` (released,
    edited, released at its timeout) or its :class:`Stopped` (dropped); one its link discarded
    (``link_end``) has neither. An ``edit`` names the message as it arrived and as edited by
    their digests (:func:`proxy.core.held.digest`), never their text."""

    held_id: int
    hold: int
    """The ``hold`` of its :class:`Held` (its timer on its link)."""
    outcome: HeldOutcome
    rule: str
    relayed: Relayed
    """The message as it was held (its :class:`Held`'s)."""
    digest: str | None = None
    """``edit``: the digest of the message as it arrived."""
    edited_digest: str | None = None
    """``edit``: the digest of the edited message (what is relayed, its id not yet rewritten)."""


@value(kw_only=True)
class Stopped(Observation):
    """A fault stopped a message: it did not go on (the rule's :class:`FaultInjected` came
    first). Ids as on :class:`Relayed`: an answer's ``original_id`` is its requester's."""

    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    size: int
    original_id: bytes | None
    forwarded_id: bytes | None
    rule: str
    disposition: Stopping
    message: Message | None = field(default=None, compare=False, repr=False)
    """The message as it arrived, for observers that judge content."""


@value(kw_only=True)
class InvalidSeen(Observation):
    """A message that is not usable JSON-RPC arrived, and what was done with it."""

    direction: Direction
    reason: InvalidReason
    size: int
    detail: str
    handling: Handling


@value
class Orphaned(Observation):
    """A response whose id matches no pending request was dropped."""

    direction: Direction
    id: bytes
    kind: Kind


@value
class Unroutable(Observation):
    """An error with ``"id": null`` (a parse error answer) was forwarded as it was."""

    direction: Direction
    size: int


@value(kw_only=True)
class TooManyPending(Observation):
    """A request was refused, not forwarded: its sender already had ``limit`` requests pending
    in that direction (``--max-pending``); the sender got an error under its own id.

    ``first``: the first refusal of this link and direction (it is logged; the others are only
    counted and traced).
    """

    direction: Direction
    method: str | None
    session: str | None
    original_id: bytes | None
    limit: int
    first: bool


@value
class InflightRefused(Observation):
    """A message of ``size`` bytes was refused before it was read (a POST answered 503): the
    proxy held ``in_flight`` bytes, too many to take it (``--max-inflight-bytes``)."""

    direction: Direction
    size: int
    in_flight: int


@value
class CancelDropped(Observation):
    """A ``$/cancel_request`` named no pending request (unknown or answered); it was dropped."""

    direction: Direction
    request_id: bytes | None


@value
class IdReused(Observation):
    """A peer sent a request whose id it still has pending; both are relayed."""

    direction: Direction
    id: bytes
    method: str


@value(kw_only=True)
class Undeliverable(Observation):
    """A message arrived for a peer whose connection is already closed, or was held until after
    it closed (``hold``: the :class:`Held` it was released from); it was dropped.

    A held message is named (method, session, ids as on :class:`Relayed`).
    """

    direction: Direction
    kind: Kind
    size: int
    method: str | None = None
    session: str | None = None
    original_id: bytes | None = None
    forwarded_id: bytes | None = None
    hold: int | None = None


@value
class PeerGone(Observation):
    """The stream from ``side`` ended; ``abandoned`` requests sent to it stay unanswered."""

    side: Side
    abandoned: int


@value(kw_only=True)
class FaultOverflowed(Observation):
    """A rule fired on a message, but its fault would have started more faults in progress
    than ``--max-active-faults`` allows, or held more messages than ``--max-held`` (``bound``):
    the rule did not act (Envoy's ``faults_overflow``)."""

    rule: str
    action: ActionName | str
    direction: Direction
    method: str | None
    bound: Literal["max_active_faults", "max_held"] = "max_active_faults"
    first: bool = False
    """The first refusal of the run for ``max_held`` (logged; the others are counted only)."""


@value(kw_only=True)
class StallEnded(Observation):
    """The ``stall`` (or ``timeout``) of ``rule`` in ``direction`` ended: its time was up, or
    the control API ``released`` it; ``held`` messages went on, or, where it ``cut`` sides (a
    timeout), were lost."""

    rule: str
    direction: Direction
    held: int
    released: bool = False
    cut: tuple[Side, ...] = ()


@value(kw_only=True)
class FaultInjected(Observation):
    """A rule fired on a message."""

    rule: str
    action: ActionName | str
    """The name of the rule's action, as the registry knows it (:data:`proxy.core.actions.actions`;
    the built-in ones are :class:`proxy.core.actions.ActionName`)."""
    direction: Direction
    kind: Kind
    method: str | None
    session: str | None
    id: bytes | None
    """The id as it is on the wire where the fault strikes."""
    request_id: bytes | None = None
    """For an answer, its request's id as the requester wrote it (the proxy rewrites ids hop by
    hop: an Agent answers the id the proxy gave, the Client knows its own)."""
    message: Message | None = field(default=None, compare=False, repr=False)
    """The message as it arrived, for observers that judge content."""


@value(kw_only=True)
class DuplicateSwallowed(Observation):
    """An answer to an injected copy of a request, recorded and not forwarded."""

    direction: Direction
    method: str
    session: str | None
    original_id: bytes
    forwarded_id: bytes
    data: bytes


@value
class Restarted(Observation):
    """The data plane was restarted (``what``: ``proxy`` or ``agent``); maps were forgotten.

    ``abandoned``: requests that were pending either way and will never be answered.
    """

    what: RestartWhat
    abandoned: int


@value
class RulesReloaded(Observation):
    """The fault files were reloaded (``result``: ``success`` or ``error``, rules kept)."""

    result: ReloadResult
    rules: int


@value
class InitializeCached(Observation):
    """Conductor mode: a Client's ``initialize`` was answered from the first Client's answer."""

    id: bytes


@value(kw_only=True)
class InitializeTimedOut(Observation):
    """The Agent did not answer ``initialize`` within ``timeout`` seconds; the proxy answered
    the Client (id ``id``) with an error, and forgot the request (forwarded as ``forwarded_id``)."""

    id: bytes
    forwarded_id: bytes
    timeout: float


@value
class Connected(Observation):
    """A connection to ``side`` over ``transport`` joined a link (recorded by the shell)."""

    side: Side
    transport: str


@value
class Disconnected(Observation):
    """A connection to ``side`` over ``transport`` left its link (recorded by the shell)."""

    side: Side
    transport: str


@value(kw_only=True)
class KeyedAttempt(Observation):
    """The ledger saw a keyed ``session/prompt``: the first attempt of its key, or a retry."""

    session: str
    retry: bool
    key: str
    prompt: str
    """A digest of the prompt (:func:`proxy.core.ledger.prompt_hash`): a retry resends the same."""


@value(kw_only=True)
class KeyedMessage(Observation):
    """A message of the Agent's named for a keyed prompt, seen for the first time: the
    ``messageId`` of an answer (``via`` ``answer``), of the answer to an injected copy
    (``copy``) or of a ``user_message`` insert of that prompt (``insert``). One key naming two
    messages is a duplicate insert, within one proxy or across several (``report``)."""

    session: str
    key: str
    message_id: str
    via: Via


@value(kw_only=True)
class Finding(Observation):
    """The ledger saw a rule of the idempotency RFD broken (DESIGN 7)."""

    check: Check
    session: str | None
    key: str | None
    detail: str


@value
class RulesCounted(Observation):
    """Rule counters changed (a rule matched); persistent state is due for saving."""
