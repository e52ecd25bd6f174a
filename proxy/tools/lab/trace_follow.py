"""Follow a proxy's trace as it is written: the proxy's word instead of a Client's clock.

A Client in front of a fault-injecting proxy learns that an answer is lost from a timeout: when
the answer is merely slow (a busy machine), the Client resends anyway, and what the run shows
depends on the machine's speed. The proxy knows better: its trace (``--trace``) records every
answer it drops, the moment it drops it. :class:`TraceFollower` reads the trace as the proxy
appends to it, so that the reference Client (``ClientOptions.follow_trace``, what ``acp-proxy
demo`` uses) can

* treat an answer as timed out the moment the trace says it will not come on a connection that
  goes on (:meth:`TraceFollower.lost`): the proxy dropped or corrupted it, or the Agent that
  owed it was replaced and the new one is up. No slow answer is taken for a lost one, and a
  lost one costs no waiting (an answer lost with its connection: the Client sees the end);
* wait until the proxy has no request held for the Agent or outstanding there
  (:meth:`TraceFollower.quiet`), e.g. a copy it injected (``duplicate``), before the Client
  reads the session's final history.

:class:`TraceState` is the sans-I/O part (records in, what they say out); the follower reads
what was appended every :data:`POLL` seconds (as ``--watch`` polls its files) and feeds it. It
starts at the end the file had when it was created: records of earlier runs appended to the same
file are not its Client's. It suits a trace that only its Client's connections write to (a
stdio proxy, or one spawned per connection): request ids are the Client's, unique in its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType

from proxy.core.actions import ActionName
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind
from proxy.core.records import (
    ConnectionRecord,
    Disposition,
    FaultRecord,
    HeldRecord,
    JsonValue,
    MessageRecord,
    Record,
    RestartRecord,
    TraceHeader,
    decode,
)

__all__ = ["POLL", "TraceFollower", "TraceState"]

POLL = 0.01
"""Seconds between two looks at the trace file (it only delays what is read, never changes it)."""
CHUNK = 1 << 20
"""Bytes read from the trace at most per look."""
LINK_FAULTS = frozenset(
    {
        ActionName.KILL_AGENT,
        ActionName.RESTART_PROXY,
        ActionName.SEVER,
        ActionName.CLOSE_STREAM,
        ActionName.TIMEOUT,
    }
)
"""Actions that end the connection or replace the Agent. An answer dropped with one of them is
reported lost only once a new Agent is connected on the link: if the link ends instead, its end
tells the Client, and resending before that would race the proxy going down."""
UNREADABLE_FAULTS = frozenset({ActionName.CORRUPT, ActionName.TRUNCATE})
"""Actions after which a relayed answer is bytes no Client can read."""


class TraceState:
    """What a trace's records say so far: answers relayed and lost, requests outstanding.

    Records are fed in file order with :meth:`feed`. An answer is lost when the proxy dropped it
    or corrupted it and the connection goes on, or when the Agent that owed it was replaced
    (``kill_agent`` with ``respawn``, ``restart_proxy``) and the new Agent is connected. A
    ``trace`` record starts a new run of the proxy: the links of the one before are gone with it.
    """

    def __init__(self) -> None:
        self.lost: set[JsonValue] = set()
        """Client request ids whose answer will not come on a connection that goes on."""
        self.answered: set[JsonValue] = set()
        """Client request ids whose answer the proxy relayed."""
        self._faults: dict[_Entry, set[str]] = {}
        """Actions of faults on answers, by (link, Agent-side id), until their message record."""
        self._outstanding: dict[_Entry, JsonValue] = {}
        """Requests held for the Agent or relayed to it and not answered yet, by (link,
        Agent-side id): the Client's id, or ``None`` for a copy the proxy made."""
        self._doomed: dict[int | None, set[JsonValue]] = {}
        """By link: Client ids whose answer is gone with an Agent being replaced (lost once the
        new one is connected) or with the link (never lost: the link's end says it)."""

    def quiet(self, answered: Collection[JsonValue]) -> bool:
        """The answers to ``answered`` have left the proxy (so every record written before them
        has been fed), and it has no request held for the Agent or outstanding there."""
        return not self._outstanding and self.answered.issuperset(answered)

    def feed(self, record: Record) -> None:
        """Take one record into account."""
        match record:
            case TraceHeader():
                self._faults.clear()
                self._outstanding.clear()
                self._doomed.clear()
            case FaultRecord(direction=Direction.TO_CLIENT, link=link, id=answer_id):
                self._faults.setdefault((link, _hashable(answer_id)), set()).add(record.action)
            case HeldRecord(direction=Direction.TO_AGENT, kind=Kind.REQUEST, link=link):
                self._outstanding[(link, _hashable(record.forwarded_id))] = _client_id(record)
            case MessageRecord():
                self._message(record)
            case RestartRecord(link=link):
                doomed = self._doomed.setdefault(link, set())
                for entry, client_id in list(self._outstanding.items()):
                    if entry[0] == link:
                        del self._outstanding[entry]
                        if client_id is not None:
                            doomed.add(client_id)
                self._forget_faults(link)
            case ConnectionRecord(side=Side.AGENT, state="open", link=link):
                self.lost |= self._doomed.pop(link, set())
            case ConnectionRecord(side=Side.CLIENT, state="closed", link=link):
                self._doomed.pop(link, None)
                self._outstanding = {e: c for e, c in self._outstanding.items() if e[0] != link}
                self._forget_faults(link)

    def _forget_faults(self, link: int | None) -> None:
        self._faults = {entry: a for entry, a in self._faults.items() if entry[0] != link}

    def _message(self, record: MessageRecord) -> None:
        link = record.link
        forwarded = (link, _hashable(record.forwarded_id))
        client_id = _hashable(record.id)
        if record.direction is Direction.TO_AGENT and record.kind is Kind.REQUEST:
            if record.disposition is Disposition.RELAYED and forwarded[1] is not None:
                self._outstanding[forwarded] = _client_id(record)
            else:  # a held request that never left
                self._outstanding.pop(forwarded, None)
            return
        if record.direction is not Direction.TO_CLIENT or record.kind not in _ANSWERS:
            return
        self._outstanding.pop(forwarded, None)
        actions = self._faults.pop(forwarded, set())
        disposition = record.disposition
        if disposition is Disposition.RELAYED and actions & UNREADABLE_FAULTS:
            self.lost.add(client_id)  # sent as bytes no Client can take for an answer
        elif disposition is Disposition.RELAYED:
            self.answered.add(client_id)
        elif disposition is Disposition.DROPPED:
            if actions & LINK_FAULTS:
                self._doomed.setdefault(link, set()).add(client_id)
            else:
                self.lost.add(client_id)


_Entry = tuple[int | None, JsonValue]
"""A request on the Agent's side of a link: (link, the id the proxy wrote on it)."""
_ANSWERS = (Kind.RESPONSE, Kind.ERROR)


def _hashable(value: JsonValue) -> JsonValue:
    """An id as a set member or key (a JSON id is a string or a number; anything else, its
    text)."""
    return value if value is None or isinstance(value, str | int | float) else repr(value)


def _client_id(record: MessageRecord | HeldRecord) -> JsonValue:
    """The Client's id of a request record, ``None`` for the proxy's own copy."""
    return None if record.copy else _hashable(record.id)


class TraceFollower:
    """Reads a trace file as it grows (an async context manager) and says what it holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = TraceState()
        try:
            self._offset = os.stat(path).st_size
        except OSError:
            self._offset = 0  # not written yet: the proxy creates it
        self._partial = b""
        self._news = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TraceFollower:
        self._task = asyncio.get_running_loop().create_task(self._follow())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def lost(self, request_ids: Collection[JsonValue]) -> None:
        """Return once the trace says the answers to all of ``request_ids`` are lost."""
        await self._until(lambda: self.state.lost.issuperset(request_ids))

    async def quiet(self, answered: Collection[JsonValue]) -> None:
        """Return once the proxy relayed the answers to ``answered`` (the Client's latest) and
        has no request held for the Agent or outstanding there (the caller bounds the wait)."""
        await self._until(lambda: self.state.quiet(answered))

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._news.clear()
            await self._news.wait()

    async def _follow(self) -> None:
        while True:
            if self._read():
                self._news.set()
            await asyncio.sleep(POLL)

    def _read(self) -> bool:
        """Feed the complete lines written since the last look; whether there were any."""
        try:
            with self.path.open("rb") as trace:
                trace.seek(self._offset)
                data = trace.read(CHUNK)
        except OSError:
            return False
        if not data:
            return False
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            record = decode(line) if line.strip() else None
            if record is not None:
                self.state.feed(record)
        return bool(lines)
