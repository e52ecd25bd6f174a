"""The shell of one link: reads both endpoints, feeds the relay core, carries out its commands.

This is the only code that interprets :mod:`proxy.core.commands` (an exhaustive ``match``: a command
type that is not handled here fails mypy). One task per peer reads messages, stamps them with the
loop's clock and hands them to :class:`~proxy.core.relay.Relay`; sends are queued on the destination
endpoint in the order the core returned them, then the reading task waits for that endpoint to
drain, so a peer that stops reading slows down its writer instead of growing memory. A drain that
lasts :data:`STALL_SECONDS` or more is logged once (``peer stalled``, noticed by a watchdog that
looks every :data:`STALL_SECONDS` while a drain is pending), and again when the peer has taken
everything queued for it (``peer resumed``).

Every message read counts toward the bytes in flight the whole proxy shares
(:mod:`proxy.shell.inflight`, ``--max-inflight-bytes``) until its destinations have drained; past
the bound a reading task waits before it reads on, unless the proxy still has bytes queued toward
the peer it reads (that peer's reading is what lets the count fall). A message, once relayed, is
referenced no more by its reading task: an idle link keeps none of what it relayed alive.

Where an endpoint can (:class:`~proxy.shell.endpoint.RelaysInPlace`: stdio), what arrives is
relayed in the read's own callback while its reading task has nothing to wait for (no drain under
way, no bound reached, no peer stalled, nothing to parse elsewhere, a read of a few lines), and
written at once: no task wakes for a message that can go straight on. Anything else goes the way
above, in order. A link told that only the proxy's own observers listen (``observe_after_write``:
no trace, recording or state file, which a peer could read before the loop turns) hands what it
relays this way to the observers after the write, still in the same callback: a round trip does
not wait for them.

Timers are the core's ``StartTimer`` commands, fed back as ``TimerFired``. What they hold (delayed
messages, spaced copies) is bounded too: past :data:`HELD_HIGH_WATER` bytes the reading tasks wait
for timers to fire (but not for a peer the proxy has closed: its end must be seen), and each waits
for its far side to drain even when its message was held, since that message reaches the far side
later without a drain of its own. Replacing the Agent
(``kill_agent`` with ``respawn``, ``restart_proxy``) starts a new *generation*: a fresh relay with
empty id maps (the fault engine and the id counters carry over), a new Agent, and every timer and
message of the old generation is discarded at once (what they held no longer counts as in flight,
nor as faults in progress). The Client's messages wait while the Agent is down. A new Client in
conductor mode gets a fresh relay the same way: the old relay's timers are forgotten with it.

Every endpoint the link closes is waited for once (``wait_closed``: a spawned Agent is stopped,
an HTTP session released), and so is an Agent connection that ended by itself.

A link is :attr:`LinkState.NEW` until :meth:`Link.run` starts, :attr:`~LinkState.RUNNING` while any
of its tasks runs, then :attr:`~LinkState.ENDED`, at once when its last task is done (before
:meth:`Link.run` has returned). Every method that acts on a link (the control API's actions,
shutdown, restarts) is safe in each state: on a new link the work it starts waits for
:meth:`Link.run`; an ended link refuses new work quietly (logged at debug level), so that no task
is ever started on a finished task group and no coroutine is made that nobody awaits. A restart
of the Agent asked while one is under way, or while the link shuts down, is ignored (logged).

When the proxy shuts down (:meth:`Link.shutdown`) the Agent's connection is closed first, so
that what the Agent still writes reaches the Client; the relay then closes the Client's connection
(a WebSocket with 1001, going away). Nothing answers the requests still pending: the Client sees
its connection end. :meth:`Link.abort` cuts everything at once, for when that takes too long.
A spawned Agent that fails by itself (an exit status other than 0, a signal) closes a WebSocket
Client with 1011 and a reason that says how it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import heapq
import itertools
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, assert_never

from proxy.core.commands import (
    Close,
    Command,
    DropStream,
    FailPost,
    ForgetTimer,
    Restart,
    Send,
    SendCut,
    SendRun,
    Sever,
    SignalAgent,
    StartTimer,
)
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
from proxy.core.framing import Oversized
from proxy.core.held import HeldMessage
from proxy.core.jsonrpc import Batch, Invalid, Message
from proxy.core.observations import (
    Connected,
    Disconnected,
    Observation,
    Restarted,
    RestartWhat,
    StallEnded,
)
from proxy.core.relay import Relay
from proxy.shell.defaults import AGENT_EXIT_WAIT, HELD_HIGH_WATER, STALL_SECONDS
from proxy.shell.endpoint import (
    Admitting,
    Bursting,
    ClosesWithReason,
    Endpoint,
    ExitReporter,
    RelaysInPlace,
    Signalable,
    StreamOwner,
)
from proxy.shell.inflight import InflightBytes
from proxy.shell.log import get_logger
from proxy.shell.observers import Observer
from proxy.shell.parsing import Parser

__all__ = ["Link", "LinkState"]

log = get_logger("proxy.link")
_PARSED: Final = (Message, Batch, Invalid)
_TimerEntry = tuple[float, int, int, int, int, bool]
"""A pending timer: (deadline, sequence, token, generation, size, fault)."""
"""What an endpoint that parses (WebSocket, HTTP) hands over instead of bytes."""

_link_ids = itertools.count(1)

GOING_AWAY: Final = 1001
"""The WebSocket close code of a Client's connection closed because the proxy shuts down."""
INTERNAL_ERROR: Final = 1011
"""The WebSocket close code of a Client's connection whose spawned Agent failed (the reason says
how it ended)."""

AgentFactory = Callable[[], Awaitable[Endpoint]]
"""Connects (spawns) a new Agent for this link."""
RelayFactory = Callable[[bytes | None], Relay]
"""A fresh relay; its argument is the cached ``initialize`` answer (conductor mode) or None."""
Work = Callable[[], Coroutine[Any, Any, None]]
"""A task of the link, not started: its coroutine is made only once the link takes the task."""


class LinkState(enum.Enum):
    """Where a link is in its life (see the module)."""

    NEW = "new"
    """Made, :meth:`Link.run` not started: work it is given waits for it."""
    RUNNING = "running"
    ENDED = "ended"
    """Its last task is done: it refuses new work."""


class Link:
    """One Client connection joined to one Agent connection."""

    def __init__(
        self,
        new_relay: RelayFactory,
        endpoints: Mapping[Side, Endpoint],
        observer: Observer,
        *,
        connect_agent: AgentFactory | None = None,
        on_restart: Callable[[float], None] | None = None,
        on_client_gone: Callable[[Link], None] | None = None,
        on_ended: Callable[[Link], None] | None = None,
        inflight: InflightBytes | None = None,
        parser: Parser | None = None,
        observe_after_write: bool = False,
    ) -> None:
        """``connect_agent`` starts a new Agent (``kill_agent`` with ``respawn``, restarts).

        ``on_restart``: who carries out ``restart_proxy`` when it is more than this link (a
        listener with many links); without it the link restarts its own Agent side.
        ``on_client_gone`` (conductor mode): the Client left and the Agent stays; the link
        waits for :meth:`attach_client`. ``on_ended`` hears the link end, at once when its last
        task is done (its state is then :attr:`LinkState.ENDED`; :meth:`run` returns later).
        ``inflight``: the count of bytes in flight the whole proxy shares
        (``--max-inflight-bytes``): this link adds what it reads and holds; its readers wait for
        room. ``parser``: the proxy's parser, which parses large messages off the event loop
        (without it, every message is parsed in place). ``observe_after_write``: the messages
        relayed in a read's callback are observed once their bytes are written, not before (a
        round trip no longer waits for the observers); only for observers that nothing outside
        the process reads before the event loop turns again (a trace file would lag the wire).
        """
        self.id = next(_link_ids)
        """This link's number in the process (logs, trace, control API)."""
        self._new_relay = new_relay
        self.relay = new_relay(None)
        self.endpoints = dict(endpoints)
        self._observer = observer
        self._observe_after_write = observe_after_write
        self._unobserved: list[Observation] | None = None
        """While messages are relayed in a read's callback with ``observe_after_write``: their
        observations, handed to the observer once their bytes are written."""
        self._connect_agent = connect_agent
        self._on_restart = on_restart
        self._on_client_gone = on_client_gone
        self._on_ended = on_ended
        self._loop = asyncio.get_running_loop()
        self._clock = self._loop.time
        """The time of the events fed to the relay; a timer's deadline is counted from the
        time of the event that started it, as the relay counts it (so two holds end in the
        order the relay meant, however late the shell gets to them)."""
        self.state = LinkState.NEW
        self._tasks: asyncio.TaskGroup | None = None
        self._running = 0
        """Tasks of the link not done yet (those of its task group)."""
        self._deferred: list[Work] = []
        """Work given to a new link: started when :meth:`run` starts."""
        self._timers: list[_TimerEntry] = []
        """Pending timers as a heap of (deadline, sequence, token, generation, size, fault): equal
        deadlines fire in the order they were set, so equal delays keep a direction's order."""
        self._timer_sequence = itertools.count()
        self._timer_handle: asyncio.TimerHandle | None = None
        self._held = 0
        """Bytes of the messages the pending timers hold."""
        self._inflight = inflight or InflightBytes(None)
        self._parser = parser or Parser(large=None)
        self._held_room = asyncio.Event()
        self._held_room.set()
        self._held_logged = False
        self._closing: set[Side] = set()
        """Peers the proxy has closed: reading them waits for timers no more (to see their end)."""
        self._waiting: dict[Side, Side | None] = dict.fromkeys(Side)
        """Per reading task (by the side it reads): the peer it waits for to drain, if any."""
        self._drains: dict[Side, int] = dict.fromkeys(Side, 0)
        """Per reading task: how many drains it has waited for (tells one long wait apart)."""
        self._seen: dict[Side, int] = {}
        """The watchdog's last look: the drain each reading task was waiting for then."""
        self._stalled: set[Side] = set()
        """Peers logged as stalled and not yet caught up."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._generation = 0
        self._agent_up = asyncio.Event()
        self._agent_up.set()
        self._post_failure: FailPost | None = None
        self._released: set[Endpoint] = set()
        """Endpoints whose ``wait_closed`` runs (each is waited for once)."""
        self._stopping = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._aborted = False
        self.closed_first: Side | None = None
        """The peer whose connection ended first (who ended the link)."""
        for side in Side:
            self._connected(side)
        self._agent_failure: str | None = None
        """How the Agent failed, when it did (the reason of the Client's close)."""

    async def run(self) -> None:
        """Relay until both peers are gone and every close has finished (or :meth:`abort`)."""
        if self.state is not LinkState.NEW:
            raise RuntimeError(f"link {self.id} has already run")
        self._runner = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                self.state = LinkState.RUNNING
                for side in Side:  # the first generation's (a new Agent asked for already is not)
                    self._spawn(functools.partial(self._pump, side, self.endpoints[side], 0))
                deferred, self._deferred = self._deferred, []
                for work in deferred:
                    self._spawn(work)
        except asyncio.CancelledError:
            if not self._aborted or self._runner is None:
                raise
            self._runner.uncancel()
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
            self._forget_timers()
            self._runner = None  # the task may go on (a stdio run): an abort now cancels nothing

    def shutdown(self, *, after: float = 0.0) -> None:
        """End the link for a shutdown of the proxy: close the Agent's connection (a spawned
        Agent gets EOF, then SIGTERM and SIGKILL after its grace); the Client's is closed once
        the Agent's stream has ended (1001 on a WebSocket). No new Agent is started any more.

        ``after`` seconds leaves the Agent's connection open that long first: an Agent that was
        just passed a signal ends as it chooses to (dies of it, or exits with a status of its
        own), without an EOF racing the signal; the link ends when it leaves."""
        if self._stopping.is_set() or self._refused("shutdown"):
            return
        self._stopping.set()
        if after > 0:
            self._loop.call_later(after, self._close_agent)
        else:
            self._close_agent()

    def _close_agent(self) -> None:
        """Close the Agent's connection, if the link still has one up."""
        if self._refused("close the agent"):
            return
        if self._agent_up.is_set():
            self._execute([Close(Side.AGENT)])
        # else the Agent is being replaced: _connect_new_agent sees _stopping and ends the link

    def abort(self) -> None:
        """Cut the link now: the Agent's process group is killed, both connections are cut
        without flushing, and every task of the link is cancelled."""
        if self._refused("abort"):
            return
        self._stopping.set()
        agent = self.endpoints[Side.AGENT]
        if isinstance(agent, Signalable):
            agent.signal(signal.SIGKILL)
        for side in Side:
            self.endpoints[side].sever(flush=False)
        if self._runner is not None and not self._runner.done():
            self._aborted = True
            # One turn later: a read the cut has already ended (aiohttp's WebSocket feeds its
            # reader a closing message) must return first, or the close handshake waits on it.
            self._loop.call_soon(self._runner.cancel)

    def inject(self, commands: list[Command]) -> bool:
        """Carry out commands that come from outside the relay (the control API's actions);
        False when the link has ended (nothing is done)."""
        if self._refused("action"):
            return False
        self._execute(commands)
        return True

    def release_stalls(self) -> int:
        """End this link's stalls now (the control API): what they held goes on, and their
        timers are forgotten. How many stalls ended (0 when the link has ended: nothing is
        done)."""
        if self._refused("action"):
            return 0
        at = self._clock()
        commands = self.relay.release_stalls(at)
        self._execute(commands, at)
        return sum(1 for command in commands if isinstance(command, StallEnded))

    def held_messages(self) -> list[HeldMessage]:
        """The messages ``hold`` rules hold on this link now (:mod:`proxy.core.held`)."""
        return self.relay.held_messages()

    def release_held(self, held_id: int) -> bool:
        """Let the held message ``held_id`` go on now; False when this link does not hold it."""
        return self._settle_held(functools.partial(self.relay.release_held, held_id))

    def drop_held(self, held_id: int) -> bool:
        """Drop the held message ``held_id`` now; False when this link does not hold it."""
        return self._settle_held(functools.partial(self.relay.drop_held, held_id))

    def edit_held(self, held_id: int, data: bytes, limit: int) -> bool:
        """Let the held message ``held_id`` go on now as ``data``; False when this link does
        not hold it, :class:`~proxy.core.held.EditRefused` when ``data`` cannot replace it
        (``limit``: ``--max-message-bytes``)."""
        return self._settle_held(lambda at: self.relay.edit_held(held_id, data, at, limit))

    def _settle_held(self, settle: Callable[[float], list[Command] | None]) -> bool:
        """Carry out what ``settle`` asks (a relay's end of a hold: its release, drop or edit,
        given the time now, which the timers it starts count from); False when the link has
        ended or its relay holds no such message (``settle`` gave None)."""
        if self._refused("held message"):
            return False
        at = self._clock()
        commands = settle(at)
        if commands is None:
            return False
        self._execute(commands, at)
        return True

    def _lose_held(self) -> None:
        """The relay is replaced, or the link ends: what hold rules hold is lost (observed), and
        their timers are forgotten now (their bytes and faults in progress counted no more)."""
        self._execute(self.relay.discard_held())

    def _replace_relay(self, cached_initialize: bytes | None) -> None:
        """A fresh relay takes over (a new Client in conductor mode, a new Agent): what hold
        rules hold is lost, and every timer of the old relay is forgotten now. What they held
        went with it, and none may fire into the new relay, whose timers are numbered afresh
        (one would end a hold of the new Client's, or release its delayed message early)."""
        self._lose_held()
        self._drop_timers()
        self.relay = self._new_relay(cached_initialize)

    def attach_client(self, client: Endpoint) -> bool:
        """Conductor mode: a new Client takes over this link's Agent; False (nothing done) when
        the link has ended or is stopping, and the Client needs a link of its own.

        The new Client gets a fresh relay (its own id maps; the id counters carry on) whose
        ``initialize`` is answered from the Agent's first answer.
        """
        if self._stopping.is_set() or self._refused("attach a client"):
            return False
        self._replace_relay(self.relay.initialize_answer)
        self.endpoints[Side.CLIENT] = client
        self.closed_first = None
        self._closing.discard(Side.CLIENT)
        self._connected(Side.CLIENT)
        self._spawn(functools.partial(self._pump, Side.CLIENT, client, self._generation))
        return True

    def sever_all(self) -> None:
        """Cut both connections now (a restart of the whole proxy); a spawned Agent is stopped."""
        if self._refused("restart"):
            return
        abandoned = sum(self.relay.pending(direction) for direction in Direction)
        self._observer.observe(Restarted("proxy", abandoned), self.id)
        self._execute([Sever(Side.CLIENT, flush=False), Sever(Side.AGENT, flush=False)])
        agent = self.endpoints[Side.AGENT]
        if isinstance(agent, Signalable):
            agent.signal(signal.SIGTERM)

    def _connected(self, side: Side) -> None:
        self._observer.observe(Connected(side, self.endpoints[side].transport), self.id)

    async def _pump(self, side: Side, endpoint: Endpoint, generation: int) -> None:
        large = self._parser.large
        small = sys.maxsize if large is None else large  # a message under it is parsed here
        if isinstance(endpoint, RelaysInPlace):
            endpoint.relay_in_place(
                functools.partial(self._may_relay_now, side, endpoint, generation),
                functools.partial(self._relay_now, side, endpoint, generation),
                self._parser.is_large,
                small,
            )
        other = side.other
        unflushed: set[Side] = set()
        admitted = isinstance(endpoint, Admitting)  # counted before it was read
        bursting = endpoint if isinstance(endpoint, Bursting) else None
        charged = 0  # bytes of the burst being relayed: in flight until its destinations drained
        try:
            while True:
                if not admitted and not endpoint.receive_ready():
                    await self._inflight.room(lambda: self._must_read(side, endpoint))
                received = await endpoint.receive()
                parsed = None
                burst: list[bytes] | None = None
                if type(received) is not bytes and isinstance(received, _PARSED):  # by its endpoint
                    parsed, received = received, received.raw
                if isinstance(received, bytes):
                    size = len(received)
                    if bursting is not None and size < small and endpoint.receive_ready():
                        burst = bursting.receive_burst(small)  # the rest of this read, at once
                        if burst:
                            burst.insert(0, received)
                            size = sum(map(len, burst))
                    charged += size
                    self._inflight.add(size)
                    if burst is None and parsed is None and self._parser.is_large(received):
                        parsed = await self._parser.offload(received)
                if side is Side.AGENT and generation != self._generation:
                    return  # an Agent that was replaced: nothing it says counts any more
                if received is None and side is Side.AGENT:
                    failure = await self._failure(endpoint)
                    if generation != self._generation:
                        return
                    self._agent_failure = failure
                if side is Side.CLIENT and not self._agent_up.is_set():
                    await self._agent_up.wait()
                ended = received is None
                if burst:
                    written, taken = self._relay_burst(side, endpoint, burst)
                    unflushed |= written
                    if taken < len(burst):  # read again, after what the relay did with these
                        assert bursting is not None
                        rest = burst[taken:]
                        left = sum(map(len, rest))
                        bursting.give_back(rest)
                        del rest
                        charged -= left
                        self._inflight.remove(left)
                else:
                    unflushed |= self._relay_one(side, endpoint, received, parsed)
                # Relayed: what goes on is in the destinations' queues. While this task waits
                # (for a drain, for the next message) nothing here keeps the message alive.
                del received, parsed, burst
                if ended or not endpoint.receive_ready():
                    # A burst read together is relayed whole, then written and drained at once.
                    # The far side is drained too: a held message reaches it later, without a
                    # drain.
                    unflushed.add(other)
                    for destination in unflushed:
                        self._waiting[side] = destination
                        self._drains[side] += 1
                        if self._watchdog is None:
                            self._watchdog = self._loop.call_later(STALL_SECONDS, self._watch)
                        await self.endpoints[destination].drain()
                    unflushed.clear()
                    self._waiting[side] = None
                    self._inflight.remove(charged)
                    charged = 0
                    if self._stalled:
                        self._check_resumed()
                    if self._held > HELD_HIGH_WATER and side not in self._closing:
                        await self._wait_for_timers(side)
                if ended:
                    gone = self._on_client_gone
                    if side is Side.CLIENT and gone and not self.relay.has_ended(Side.AGENT):
                        gone(self)
                    if side is Side.AGENT:
                        endpoint.close()  # an Agent that closed its stdout is stopped all the same
                        self._release(endpoint)
                    return
        finally:
            self._inflight.remove(charged)

    def _may_relay_now(self, side: Side, endpoint: Endpoint, generation: int) -> bool:
        """Whether what ``side`` sends may be relayed as it arrives, in the read's callback (see
        :class:`~proxy.shell.endpoint.RelaysInPlace`): only when its pump would relay it at once
        and have nothing to wait for after (no drain, no bound reached, no peer stalled)."""
        if self.state is not LinkState.RUNNING or self._stopping.is_set() or self._stalled:
            return False
        if side is Side.AGENT and generation != self._generation:
            return False
        if side is Side.CLIENT and not self._agent_up.is_set():
            return False
        if self._waiting[side] is not None or side in self._closing or self.relay.has_ended(side):
            return False
        if self._held > HELD_HIGH_WATER or self._inflight.full():
            return False
        return endpoint.buffered() == 0 and self.endpoints[side.other].buffered() == 0

    def _relay_now(
        self, side: Side, endpoint: Endpoint, generation: int, messages: list[bytes]
    ) -> None:
        """Relay ``messages``, just read from ``side``, in the read's callback, and write them
        at once; what cannot be relayed now (a sever, a restart changed things) goes back to
        ``side``'s pump. Their bytes are in flight until written (the pump counts a read until
        its destinations drained: here that is at most one read of a few lines a direction)."""
        size = sum(map(len, messages))
        self._inflight.add(size)
        endpoints = list(self.endpoints.values())
        for each in endpoints:
            each.will_flush()  # written below, before the loop turns: no write scheduled
        unobserved = self._unobserved = [] if self._observe_after_write else None
        try:
            while messages:
                if len(messages) == 1:
                    written, taken = self._relay_one(side, endpoint, messages[0], None), 1
                else:
                    written, taken = self._relay_burst(side, endpoint, messages)
                written.add(side.other)
                for destination in written:
                    self.endpoints[destination].flush()
                if unobserved:
                    self._observe(unobserved)
                messages = messages[taken:]
                if messages and not self._may_relay_now(side, endpoint, generation):
                    assert isinstance(endpoint, RelaysInPlace)
                    endpoint.hand_over(messages)
                    return
        except Exception:  # a bug: the link ends, as when the reading task fails (never silent)
            log.exception("internal error while relaying; ending the link", link=self.id)
            self.abort()
        finally:
            for each in endpoints:
                each.flush()  # those not written to above: nothing gathered, the promise kept
            self._unobserved = None
            if unobserved:
                self._observe(unobserved)
            self._inflight.remove(size)

    def _must_read(self, side: Side, endpoint: Endpoint) -> bool:
        """Whether ``side`` is read even past the bound on bytes in flight: the proxy still has
        bytes queued toward it (it may be writing before it reads, and its reading is what lets
        the count fall), or the proxy closed it (its end must be seen)."""
        return endpoint.buffered() > 0 or side in self._closing

    def _relay_one(
        self,
        side: Side,
        endpoint: Endpoint,
        received: bytes | Oversized | None,
        parsed: Message | Batch | Invalid | None,
    ) -> set[Side]:
        """Feed what ``side`` sent (``None``: its end; ``parsed``: its parse when it was made
        already) to the relay; the sides written to."""
        at = self._clock()
        event: Event
        if received is None:
            event = PeerClosed(side, at)
            self._observer.observe(Disconnected(side, endpoint.transport), self.id)
            if self.closed_first is None:
                self.closed_first = side
        elif isinstance(received, bytes):
            event = MessageReceived(side, received, at, parsed)
        else:
            event = OversizedReceived(side, received.size, received.limit, at)
        self._take_post_failure()
        written, _ = self._feed(event)
        if received is not None:
            endpoint.processed(self._take_post_failure())
        return written

    def _relay_burst(
        self, side: Side, endpoint: Endpoint, burst: list[bytes]
    ) -> tuple[set[Side], int]:
        """Feed the messages ``side`` sent together to the relay, in one event; the sides
        written to, and how many messages it took (the rest are received again)."""
        self._take_post_failure()
        written, taken = self._feed(BurstReceived(side, burst, self._clock()))
        endpoint.processed(self._take_post_failure())
        return written, taken

    def _take_post_failure(self) -> FailPost | None:
        """The ``FailPost`` the last message fed asked for, if any; none is left behind (read
        through a call: a ``None`` assigned in the caller would be taken as its type when
        compiled, whatever ``_feed`` set in between)."""
        failure, self._post_failure = self._post_failure, None
        return failure

    async def _failure(self, agent: Endpoint) -> str | None:
        """How the Agent whose output ended failed, when its Client can still be told (a
        WebSocket's close reason, on a connection neither closed nor closing) and the proxy is
        not the one ending the link."""
        client = self.endpoints[Side.CLIENT]
        if not isinstance(client, ClosesWithReason) or self._stopping.is_set():
            return None
        if Side.CLIENT in self._closing or self.relay.has_ended(Side.CLIENT):
            return None  # cut (sever, restart_proxy) or gone: its close is decided already
        if not isinstance(agent, ExitReporter):
            return None
        return await agent.failure(AGENT_EXIT_WAIT)

    def _watch(self) -> None:
        """Look every :data:`STALL_SECONDS` while a reading task waits: one still in the drain it
        was in at the last look has waited that long at least, and its peer is stalled (logged
        once, until it has caught up)."""
        self._watchdog = None
        for reader, destination in self._waiting.items():
            drains = self._drains[reader]
            if destination is None:
                self._seen.pop(reader, None)
                continue
            if self._seen.get(reader) == drains and destination not in self._stalled:
                self._stalled.add(destination)
                endpoint = self.endpoints[destination]
                log.warning(
                    "peer stalled",
                    link=self.id,
                    side=destination,
                    transport=endpoint.transport,
                    buffered_bytes=endpoint.buffered(),
                    held_bytes=self._held,
                )
            self._seen[reader] = drains
        self._check_resumed()
        if self._seen or self._stalled:
            self._watchdog = self._loop.call_later(STALL_SECONDS, self._watch)

    def _check_resumed(self) -> None:
        """A stalled peer that nobody waits for and that has taken everything has caught up."""
        waited_for = set(self._waiting.values())
        for destination in list(self._stalled):
            if destination not in waited_for and self.endpoints[destination].buffered() == 0:
                self._stalled.discard(destination)
                log.info("peer resumed", link=self.id, side=destination)

    async def _wait_for_timers(self, side: Side) -> None:
        """Too much is held by timers: read ``side`` no more until some of it is released."""
        if not self._held_logged:
            self._held_logged = True
            log.warning(
                "delayed messages hold too much; reading waits for them",
                link=self.id,
                held_bytes=self._held,
                bound=HELD_HIGH_WATER,
            )
        while self._held > HELD_HIGH_WATER and side not in self._closing:
            self._held_room.clear()
            await self._held_room.wait()

    def _stop_holding(self, side: Side) -> None:
        """The proxy closed ``side``: its reading task must go on to see the end of it."""
        self._closing.add(side)
        self._held_room.set()
        self._inflight.wake()

    def _feed(self, event: Event | BurstReceived) -> tuple[set[Side], int]:
        """Feed ``event`` and carry out its commands: the sides written to, and how many of a
        burst's messages the relay took (the others are fed next)."""
        try:
            if isinstance(event, BurstReceived):
                commands, taken = self.relay.handle_burst(event)
            else:
                commands, taken = self.relay.handle(event), 1
        except Exception:
            if isinstance(event, BurstReceived):  # which message? each goes alone from here
                first = MessageReceived(event.side, event.messages[0], event.at)
                return self._feed(first)
            # A bug in the core must not take the link down; the message is lost, loudly.
            log.exception(
                "internal error while relaying; message dropped",
                link=self.id,
                event_type=type(event).__name__,
            )
            return set(), 1
        return self._execute(commands, event.at), taken

    def _execute(self, commands: list[Command], at: float | None = None) -> set[Side]:
        """Carry out ``commands`` in order; return the sides that were written to. ``at``: the
        time of the event they answer (timers count from it), else now."""
        written: set[Side] = set()
        forgotten: set[int] | None = None  # made when needed: one per call costs the stream
        for command in commands:
            # The commands of every relayed message first, before the match tries each case.
            if isinstance(command, Send):
                if command.pieces:
                    endpoint = self.endpoints[command.to]
                    endpoint.send_sliced(command.data, command.pieces, command.gap)
                else:
                    self.endpoints[command.to].send(command.data)
                written.add(command.to)
                continue
            if isinstance(command, Observation):
                if self._unobserved is not None:
                    self._unobserved.append(command)
                else:
                    self._observer.observe(command, self.id)
                continue
            if isinstance(command, SendRun):  # the notifications of a burst, in one write
                self.endpoints[command.to].send_run(command.data)
                written.add(command.to)
                continue
            if self._unobserved:  # what follows may observe too: in order
                self._observe(self._unobserved)
            match command:
                case SendCut(to=to, data=data, cut=cut):
                    endpoint = self.endpoints[to]
                    endpoint.send_cut(data, cut)
                    written.add(to)
                    endpoint.sever(flush=True)
                    self._release(endpoint)
                    self._stop_holding(to)
                case Close(side=side):
                    endpoint = self.endpoints[side]
                    failure = self._agent_failure if side is Side.CLIENT else None
                    if self._stopping.is_set() and side is Side.CLIENT:
                        endpoint.sever(flush=True, close_code=GOING_AWAY)
                    elif failure is not None and isinstance(endpoint, ClosesWithReason):
                        endpoint.close_with(INTERNAL_ERROR, failure)
                    else:
                        endpoint.close()
                    self._release(endpoint)
                    self._stop_holding(side)
                case Sever(side=side, flush=flush, close_code=close_code):
                    endpoint = self.endpoints[side]
                    endpoint.sever(flush=flush, close_code=close_code)
                    self._release(endpoint)
                    self._stop_holding(side)
                case ForgetTimer(token=token):
                    if forgotten is None:
                        forgotten = set()
                    forgotten.add(token)
                case StartTimer(delay=delay, token=token, size=size, fault=fault):
                    start = self._clock() if at is None else at
                    self._start_timer(start + delay, token, size, fault=fault)
                case SignalAgent(signal=signum, respawn=respawn):
                    self._signal_agent(signum, respawn)
                case Restart(downtime=downtime):
                    if self._on_restart is not None:
                        self._on_restart(downtime)
                    else:
                        self._replace_agent("proxy", downtime, stop=True)
                case FailPost():
                    self._post_failure = command
                case DropStream(to=to, data=data):
                    endpoint = self.endpoints[to]
                    if isinstance(endpoint, StreamOwner):
                        endpoint.drop_stream(data)
                case _:
                    assert_never(command)
        if forgotten is not None:
            self._forget(forgotten)
        return written

    def _observe(self, observations: list[Observation]) -> None:
        """Hand ``observations`` to the observer, in order, and empty the list."""
        for observation in observations:
            self._observer.observe(observation, self.id)
        observations.clear()

    def _forget(self, tokens: set[int]) -> None:
        """Timers ``tokens`` have nothing left to do: they hold nothing and are no fault in
        progress from now on (not when they would have fired)."""
        kept = []
        for entry in self._timers:
            if entry[2] in tokens:
                self._timer_gone(entry)
            else:
                kept.append(entry)
        if len(kept) < len(self._timers):
            heapq.heapify(kept)
            self._timers = kept
            self._held_fell()
            self._arm()

    def _refused(self, what: str) -> bool:
        """Whether the link has ended, and so refuses ``what`` (quietly: it is no error)."""
        if self.state is LinkState.ENDED:
            log.debug("the link has ended; nothing done", link=self.id, what=what)
            return True
        return False

    def _spawn(self, work: Work) -> None:
        """Run ``work`` as a task of the link: later on a new link, never on an ended one."""
        if self.state is LinkState.NEW:
            self._deferred.append(work)
            return
        if self.state is LinkState.ENDED or self._tasks is None:
            log.debug("the link has ended; no task started", link=self.id)
            return
        coroutine = work()
        try:
            task = self._tasks.create_task(coroutine)
        except RuntimeError:  # the group is cancelling its tasks after one of them failed
            coroutine.close()
            log.debug("the link is failing; no task started", link=self.id)
            return
        self._running += 1
        # After the task group's own callback: when the last one runs, the group is finished.
        task.add_done_callback(self._task_done)

    def _task_done(self, _task: asyncio.Task[None]) -> None:
        self._running -= 1
        if self._running == 0 and self.state is LinkState.RUNNING:
            self.state = LinkState.ENDED
            self._forget_timers()  # nothing is relayed any more: what they hold is lost
            if self._on_ended is not None:
                self._on_ended(self)

    def _release(self, endpoint: Endpoint) -> None:
        """Wait for ``endpoint`` to close, once, within the link (its resources are freed)."""
        if endpoint not in self._released:
            self._released.add(endpoint)
            self._spawn(functools.partial(self._wait_closed, endpoint))

    async def _wait_closed(self, endpoint: Endpoint) -> None:
        try:
            await endpoint.wait_closed()
        finally:
            self._released.discard(endpoint)

    def _forget_timers(self) -> None:
        """Drop the pending timers (the link has ended): the bytes they hold are in flight no
        more, the faults they are no longer in progress, the messages of hold rules lost."""
        self._lose_held()
        self._drop_timers()

    def _drop_timers(self) -> None:
        """Forget every pending timer: what they hold is in flight no more, their faults are
        no longer in progress, and none fires."""
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = None
        for entry in self._timers:
            self._timer_gone(entry)
        self._timers.clear()
        self._held_fell()

    def _timer_gone(self, entry: _TimerEntry) -> None:
        """A pending timer fired or was forgotten: the bytes it held are in flight no more, and
        its fault, if it is one, no longer in progress."""
        size, fault = entry[4], entry[5]
        self._held -= size
        self._inflight.remove(size)
        if fault:
            self.relay.active_faults.count -= 1

    def _held_fell(self) -> None:
        """What timers hold went down: a reader waiting for room may go on."""
        if self._held <= HELD_HIGH_WATER:
            self._held_room.set()
            if not self._held:
                self._held_logged = False

    def _start_timer(self, deadline: float, token: int, size: int, *, fault: bool) -> None:
        sequence = next(self._timer_sequence)
        entry = (deadline, sequence, token, self._generation, size, fault)
        self._held += size
        self._inflight.add(size)
        if fault:
            self.relay.active_faults.count += 1
        heapq.heappush(self._timers, entry)
        if self._timers[0][1] == sequence:  # the first due (by value: mypyc boxes tuples anew)
            self._arm()

    def _arm(self) -> None:
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = None
        if self._timers:
            self._timer_handle = self._loop.call_at(self._timers[0][0], self._fire_timers)

    def _fire_timers(self) -> None:
        self._timer_handle = None
        now = self._loop.time()
        while self._timers and self._timers[0][0] <= now:
            entry = heapq.heappop(self._timers)
            self._timer_gone(entry)
            _, _, token, generation, _, _ = entry
            if generation == self._generation:
                self._feed(TimerFired(token, self._clock()))
        self._held_fell()
        self._arm()

    def _signal_agent(self, signum: int, respawn: bool) -> None:
        agent = self.endpoints[Side.AGENT]
        if not isinstance(agent, Signalable):
            log.warning("kill_agent: the Agent is not a process of this proxy; nothing to signal")
            return
        log.info("signalling the agent", signal=signal.Signals(signum).name, respawn=respawn)
        agent.signal(signum)
        if respawn:
            self._replace_agent("agent", 0.0, stop=False)

    def _replace_agent(self, what: RestartWhat, downtime: float, *, stop: bool) -> None:
        """Start a new generation: forget the old Agent and relay now, connect a new Agent later.

        Not while the link shuts down (the Agent is ending) nor while a new Agent is on its way
        (that restart is under way): the request is logged and ignored."""
        if self._connect_agent is None:
            log.warning("cannot restart: this link cannot connect a new agent", what=what)
            return
        if self._stopping.is_set() or not self._agent_up.is_set():
            log.warning(
                "restart ignored: the link is shutting down or already restarting",
                link=self.id,
                what=what,
            )
            return
        old = self.endpoints[Side.AGENT]
        self._generation += 1
        self._agent_up.clear()
        abandoned = sum(self.relay.pending(direction) for direction in Direction)
        self._replace_relay(None)
        old.flush()  # what was sent to it before (the message that asked for this) goes first
        old.sever(flush=False)
        self._released.add(old)  # waited for below, before the new Agent starts
        if stop and isinstance(old, Signalable):
            old.signal(signal.SIGTERM)
        self._observer.observe(Disconnected(Side.AGENT, old.transport), self.id)
        self._observer.observe(Restarted(what, abandoned), self.id)
        log.warning("restarting", what=what, downtime_ms=downtime * 1000, abandoned=abandoned)
        self._spawn(functools.partial(self._connect_new_agent, old, downtime, self._generation))

    async def _connect_new_agent(self, old: Endpoint, downtime: float, generation: int) -> None:
        await self._wait_closed(old)
        if downtime:
            with contextlib.suppress(TimeoutError):  # a shutdown ends the downtime
                await asyncio.wait_for(self._stopping.wait(), downtime)
        assert self._connect_agent is not None
        if self._stopping.is_set():
            log.info("shutting down; no new agent is started")
            self._agent_up.set()
            self._execute([Close(Side.CLIENT)])
            return
        try:
            agent = await self._connect_agent()
        except Exception as exc:
            log.error("could not start a new agent; ending the link", error=str(exc))
            self._agent_up.set()
            self._execute([Close(Side.CLIENT)])
            return
        if generation != self._generation or self._stopping.is_set():  # replaced, or stopping
            agent.sever(flush=False)
            self._release(agent)
            if generation == self._generation:
                self._agent_up.set()
                self._execute([Close(Side.CLIENT)])
            return
        self.endpoints[Side.AGENT] = agent
        self._closing.discard(Side.AGENT)
        self._connected(Side.AGENT)
        self._spawn(functools.partial(self._pump, Side.AGENT, agent, generation))
        self._agent_up.set()
