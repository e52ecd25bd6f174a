"""What the reference Client saw, and its verdict: the report's records (submissions and their
attempts, the user messages seen, the resumes) and :func:`judge`, which gives each user message
to its submission and counts the duplicates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "UNCHECKED",
    "Attempt",
    "ClientReport",
    "Outcome",
    "Resume",
    "SeenMessage",
    "Stop",
    "Submission",
    "judge",
]

Outcome = Literal["pending", "answered", "error", "connection_lost"]
Stop = Literal["unreachable", "not_v2", "session_lost", "reconnect_failed"]
"""Why a run stopped early: the Agent could not be started or reached (connect, ``initialize``,
``session/new``), is not a v2 Agent, no longer knows the session, or could not be reached again."""
UNCHECKED: frozenset[Stop] = frozenset({"unreachable", "not_v2"})
"""Stops that leave nothing checked: the run never had a v2 session to submit to."""


@dataclass(slots=True)
class Attempt:
    """One ``session/prompt`` request of a submission."""

    request_id: int
    connection: int
    """Which connection carried it (1 is the first)."""
    outcome: Outcome = "pending"
    """``pending`` until answered; still ``pending`` in the report means never answered."""
    timed_out: bool = False
    """The Client stopped waiting for it (``answer_timeout``, or the followed trace said its
    answer was dropped) and sent another attempt."""
    message_id: str | None = None
    error: dict[str, Any] | None = None
    """``code`` and ``message`` of an error answer."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "connection": self.connection,
            "outcome": self.outcome,
            "timedOut": self.timed_out,
            "messageId": self.message_id,
            "error": self.error,
        }


@dataclass(slots=True)
class Submission:
    """One input of the user: its key, made once, and every attempt to deliver it."""

    text: str
    key: str | None
    """None: no key (``--no-key``, breaking the RFD on purpose)."""
    attempts: list[Attempt] = field(default_factory=list)
    message_id: str | None = None
    """The ``messageId`` of the first success answer."""
    confirmed: bool = False
    """A success answer came: the Agent inserted the message (once, if it honours keys)."""
    answers: list[str] = field(default_factory=list)
    """Every distinct ``messageId`` answered to its attempts (two: the Agent ignores keys)."""
    message_ids: list[str] = field(default_factory=list)
    """Every distinct message of this submission: the user messages with its text seen live or
    replayed (on any connection), and the answers. One is the invariant; more is a duplicate."""
    history_ids: list[str] = field(default_factory=list)
    """Those of its messages the final replay holds (``[]`` when there was no verification)."""

    @property
    def inserted_twice(self) -> bool:
        """More than one message for this submission: the Agent inserted it again."""
        return len(self.message_ids) > 1

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "key": self.key,
            "confirmed": self.confirmed,
            "messageId": self.message_id,
            "answers": self.answers,
            "messageIds": self.message_ids,
            "historyIds": self.history_ids,
            "attempts": [attempt.to_json() for attempt in self.attempts],
        }


@dataclass(frozen=True, slots=True)
class SeenMessage:
    """A ``user_message`` (or chunk) update of the session, live or replayed."""

    message_id: str
    text: str
    """The text of this update (a chunk's: a part of the message)."""
    connection: int
    replay: int = 0
    """Which ``session/resume`` on its connection replayed it (1 is the first); 0: live."""
    submission: int | None = None
    """The latest submission sent when it arrived (0-based; ``None`` before the first)."""
    chunk: bool = False
    """A ``user_message_chunk``: the message's text is its chunks' in one stream (live, or
    one replay), never across two."""

    @property
    def replayed(self) -> bool:
        return self.replay > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "text": self.text,
            "connection": self.connection,
            "replayed": self.replayed,
            "submission": self.submission,
            "chunk": self.chunk,
        }


@dataclass(slots=True)
class Resume:
    """One ``session/resume`` with ``replayFrom: start``: the user messages it replayed."""

    connection: int
    user_message_ids: list[str] = field(default_factory=list)
    state: str | None = None
    """The ``state_update`` snapshot sent before the answer."""
    final: bool = False
    """The verification at the end of the run."""

    def to_json(self) -> dict[str, Any]:
        return {
            "connection": self.connection,
            "userMessageIds": self.user_message_ids,
            "state": self.state,
            "final": self.final,
        }


@dataclass(slots=True)
class ClientReport:
    """What happened: submissions and their attempts, reconnections, what history holds."""

    transport: str
    session_id: str | None = None
    submissions: list[Submission] = field(default_factory=list)
    connections: int = 0
    reconnects: int = 0
    """New connections after the first (stdio: the command was started again)."""
    resyncs: int = 0
    """``initialize`` and ``session/resume`` again on a connection whose Agent forgot it."""
    resumes: list[Resume] = field(default_factory=list)
    user_messages: list[SeenMessage] = field(default_factory=list)
    """Every user message update of the session, live and replayed, in arrival order."""
    history: list[str] | None = None
    """User message ids of the final replay, in order (``None``: no verification)."""
    duplicates: int = 0
    """Messages beyond one per submission (:attr:`Submission.message_ids`), seen anywhere."""
    error: str | None = None
    """Why the run stopped early (the session is gone, the Agent cannot be reached)."""
    stop: Stop | None = None
    """What kind of stop ``error`` is."""
    not_submitted: list[str] = field(default_factory=list)
    """Prompts never submitted because the run stopped early."""

    @property
    def ok(self) -> bool:
        """Every submission confirmed, none inserted twice, and no error."""
        return (
            self.error is None
            and self.duplicates == 0
            and all(submission.confirmed for submission in self.submissions)
        )

    @property
    def exit_status(self) -> int:
        """0: every submission confirmed, each inserted once. 1: a flaw seen (a submission
        inserted more than once or unconfirmed, the session lost, the Agent gone for good).
        2: nothing checked (the Agent could not be started or reached, or is not a v2 Agent)."""
        if self.ok:
            return 0
        if self.stop in UNCHECKED:
            return 2
        return 1

    def user_message_ids(self) -> list[str]:
        """Distinct user message ids seen, in order of first sight."""
        return list(dict.fromkeys(seen.message_id for seen in self.user_messages))

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "ok": self.ok,
            "exitStatus": self.exit_status,
            "transport": self.transport,
            "sessionId": self.session_id,
            "connections": self.connections,
            "reconnects": self.reconnects,
            "resyncs": self.resyncs,
            "submissions": [submission.to_json() for submission in self.submissions],
            "resumes": [resume.to_json() for resume in self.resumes],
            "userMessages": [seen.to_json() for seen in self.user_messages],
            "userMessageIds": self.user_message_ids(),
            "history": self.history,
            "duplicates": self.duplicates,
            "error": self.error,
            "stop": self.stop,
            "notSubmitted": self.not_submitted,
        }


def judge(report: ClientReport) -> None:
    """Give each user message seen to its submission; fill their messages and the duplicates.

    A message answered to an attempt is that submission's. Any other belongs to the latest
    submission sent before it was first seen whose text it has (in some stream: live, or one
    replay). So a copy seen only live counts though the final replay leaves it out, and a late
    copy of an earlier submission is not taken for the current one's. This is the ledger's
    ``duplicate_insert`` from the Client's side: one submission, several ``messageId`` s.
    """
    streams: dict[tuple[int, int, str], str] = {}
    for seen in report.user_messages:
        stream = (seen.connection, seen.replay, seen.message_id)
        streams[stream] = streams.get(stream, "") + seen.text if seen.chunk else seen.text
    texts: dict[str, set[str]] = {}
    for (_, _, message_id), text in streams.items():
        texts.setdefault(message_id, set()).add(text)
    owner: dict[str, int] = {}
    for number, submission in enumerate(report.submissions):
        for message_id in submission.answers:
            owner.setdefault(message_id, number)
    for seen in report.user_messages:
        if seen.message_id in owner or seen.submission is None:
            continue
        for number in range(min(seen.submission, len(report.submissions) - 1), -1, -1):
            if report.submissions[number].text in texts[seen.message_id]:
                owner[seen.message_id] = number
                break
    order = list(dict.fromkeys([*report.user_message_ids(), *owner]))  # answers unseen last
    for number, submission in enumerate(report.submissions):
        submission.message_ids = [m for m in order if owner.get(m) == number]
        submission.history_ids = [m for m in report.history or () if owner.get(m) == number]
    report.duplicates = sum(max(0, len(s.message_ids) - 1) for s in report.submissions)
