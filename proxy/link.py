"""The shell of one link: reads both endpoints, feeds the relay core, carries out its commands.

This is the only code that interprets :mod:`proxy.commands` (an exhaustive ``match``: a new
command type that is not handled here fails mypy). One task per peer reads messages, stamps them
with the loop's clock and hands them to :class:`~proxy.relay.Relay`; sends are queued on the
destination endpoint in the order the core returned them, then the reading task waits for that
endpoint to drain, so a peer that stops reading slows down its writer instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import assert_never

from proxy.commands import Close, Command, Observation, Send
from proxy.endpoint import Endpoint
from proxy.events import Event, MessageReceived, OversizedReceived, PeerClosed, Side
from proxy.log import get_logger
from proxy.observers import Observer
from proxy.relay import Relay

__all__ = ["Link"]

log = get_logger("proxy.link")


class Link:
    """One Client connection joined to one Agent connection."""

    def __init__(
        self,
        relay: Relay,
        endpoints: Mapping[Side, Endpoint],
        observer: Observer,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.relay = relay
        self.endpoints = dict(endpoints)
        self._observer = observer
        self._clock = clock or asyncio.get_running_loop().time
        self._closers: set[asyncio.Task[None]] = set()
        self.closed_first: Side | None = None
        """The peer whose connection ended first (who ended the link)."""

    async def run(self) -> None:
        """Relay until both peers are gone and every close has finished."""
        async with asyncio.TaskGroup() as tasks:
            for side in Side:
                tasks.create_task(self._pump(side), name=f"pump-{side}")
        if self._closers:
            await asyncio.gather(*self._closers)

    def close(self, side: Side) -> None:
        """Close the connection to ``side`` from outside the relay (a signal, an operator)."""
        self._execute([Close(side)])

    async def _pump(self, side: Side) -> None:
        endpoint = self.endpoints[side]
        while True:
            received = await endpoint.receive()
            at = self._clock()
            event: Event
            if received is None:
                event = PeerClosed(side, at)
                if self.closed_first is None:
                    self.closed_first = side
            elif isinstance(received, bytes):
                event = MessageReceived(side, received, at)
            else:
                event = OversizedReceived(side, received.size, received.limit, at)
            try:
                commands = self.relay.handle(event)
            except Exception:
                # A bug in the core must not take the link down; the message is lost, loudly.
                log.exception("internal error while relaying; message dropped", side=side)
                commands = []
            for destination in self._execute(commands):
                await self.endpoints[destination].drain()
            if received is None:
                return

    def _execute(self, commands: list[Command]) -> set[Side]:
        """Carry out ``commands`` in order; return the sides that were written to."""
        written: set[Side] = set()
        for command in commands:
            match command:
                case Send(to=to, data=data):
                    self.endpoints[to].send(data)
                    written.add(to)
                case Close(side=side):
                    endpoint = self.endpoints[side]
                    endpoint.close()
                    closer = asyncio.get_running_loop().create_task(endpoint.wait_closed())
                    self._closers.add(closer)
                case Observation():
                    self._observer.observe(command)
                case _:
                    assert_never(command)
        return written
