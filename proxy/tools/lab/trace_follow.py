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
from typing import Any

from proxy.tools.report import parse_record

__all__ = ["POLL", "TraceFollower", "TraceState"]

POLL = 0.01
"""Seconds between two looks at the trace file (it only delays what is read, never changes it)."""
CHUNK = 1 << 20
"""Bytes read from the trace at most per look."""
LINK_FAULTS = frozenset({"kill_agent", "restart_proxy", "sever", "close_stream"})
"""Actions that end the connection or replace the Agent. An answer dropped with one of them is
reported lost only once a new Agent is connected on the link: if the link ends instead, its end
tells the Client, and resending before that would race the proxy going down."""


class TraceState:
    """What a trace's records say so far: answers relayed and lost, requests outstanding.

    Records are fed in file order with :meth:`feed`. An answer is lost when the proxy dropped it
    or corrupted it and the connection goes on, or when the Agent that owed it was replaced
    (``kill_agent`` with ``respawn``, ``restart_proxy``) and the new Agent is connected. A
    ``trace`` record starts a new run of the proxy: the links of the one before are gone with it.
    """

    def __init__(self) -> None:
        self.lost: set[Any] = set()
        """Client request ids whose answer will not come on a connection that goes on."""
        self.answered: set[Any] = set()
        """Client request ids whose answer the proxy relayed."""
        self._faults: dict[tuple[Any, Any], set[str]] = {}
        """Actions of faults on answers, by (link, Agent-side id), until their message record."""
        self._outstanding: dict[tuple[Any, Any], Any] = {}
        """Requests held for the Agent or relayed to it and not answered yet, by (link,
        Agent-side id): the Client's id, or ``None`` for a copy the proxy made."""
        self._doomed: dict[Any, set[Any]] = {}
        """By link: Client ids whose answer is gone with an Agent being replaced (lost once the
        new one is connected) or with the link (never lost: the link's end says it)."""

    def quiet(self, answered: Collection[Any]) -> bool:
        """The answers to ``answered`` have left the proxy (so every record written before them
        has been fed), and it has no request held for the Agent or outstanding there."""
        return not self._outstanding and self.answered.issuperset(answered)

    def feed(self, record: dict[str, Any]) -> None:
        """Take one record into account."""
        event = record.get("event")
        link = record.get("link")
        if event == "trace":
            self._faults.clear()
            self._outstanding.clear()
            self._doomed.clear()
        elif event == "fault":
            if record.get("direction") == "to_client":
                self._faults.setdefault((link, record.get("id")), set()).add(
                    str(record.get("action"))
                )
        elif event == "held":
            if record.get("direction") == "to_agent" and record.get("kind") == "request":
                self._outstanding[(link, record.get("forwarded_id"))] = _client_id(record)
        elif event == "message":
            self._message(record, link)
        elif event == "restart":
            doomed = self._doomed.setdefault(link, set())
            for entry, client_id in list(self._outstanding.items()):
                if entry[0] == link:
                    del self._outstanding[entry]
                    if client_id is not None:
                        doomed.add(client_id)
            self._faults = {entry: a for entry, a in self._faults.items() if entry[0] != link}
        elif event == "connection" and record.get("side") == "agent":
            if record.get("state") == "open":
                self.lost |= self._doomed.pop(link, set())
        elif event == "connection" and record.get("state") == "closed":  # the Client's side
            self._doomed.pop(link, None)
            self._outstanding = {e: c for e, c in self._outstanding.items() if e[0] != link}
            self._faults = {entry: a for entry, a in self._faults.items() if entry[0] != link}

    def _message(self, record: dict[str, Any], link: Any) -> None:
        forwarded = (link, record.get("forwarded_id"))
        direction = record.get("direction")
        kind = record.get("kind")
        if direction == "to_agent" and kind == "request":
            if record.get("disposition") == "relayed" and forwarded[1] is not None:
                self._outstanding[forwarded] = _client_id(record)
            else:  # a held request that never left
                self._outstanding.pop(forwarded, None)
            return
        if direction != "to_client" or kind not in ("response", "error"):
            return
        self._outstanding.pop(forwarded, None)
        actions = self._faults.pop(forwarded, set())
        disposition = record.get("disposition")
        if disposition == "relayed" and "corrupt" in actions:
            self.lost.add(record.get("id"))  # sent as bytes no Client can take for an answer
        elif disposition == "relayed":
            self.answered.add(record.get("id"))
        elif disposition == "dropped":
            if actions & LINK_FAULTS:
                self._doomed.setdefault(link, set()).add(record.get("id"))
            else:
                self.lost.add(record.get("id"))


def _client_id(record: dict[str, Any]) -> Any:
    """The Client's id of a request record, ``None`` for the proxy's own copy."""
    return None if record.get("copy") else record.get("id")


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

    async def lost(self, request_ids: Collection[Any]) -> None:
        """Return once the trace says the answers to all of ``request_ids`` are lost."""
        await self._until(lambda: self.state.lost.issuperset(request_ids))

    async def quiet(self, answered: Collection[Any]) -> None:
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
            record = parse_record(line) if line.strip() else None
            if record is not None:
                self.state.feed(record)
        return bool(lines)
