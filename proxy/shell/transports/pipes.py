"""The asyncio pipe protocols and the reader the stdio transport builds on.

They subclass asyncio's own classes, and stay pure Python in the compiled build (mypyc compiles
:mod:`proxy.shell.transports.stdio`, whose classes would otherwise subclass them: a compiled
subclass of ``StreamReader`` lost its weak references' bookkeeping, and asyncio's protocol holds
its reader by one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import SupportsIndex, cast

__all__ = ["READ_CHUNK", "AgentProtocol", "ArrivingReader", "WritePipeProtocol"]

READ_CHUNK = 256 * 1024
"""Bytes asked of the OS per read: large enough that a 64 KiB prompt is one read."""


class ArrivingReader(asyncio.StreamReader):
    """A ``StreamReader`` that offers each chunk, as it arrives, to ``take`` first: a chunk it
    takes (relayed at once: :meth:`LineStream.relay_in_place`) never reaches the buffer. Only
    while the buffer is empty, so that nothing overtakes what is buffered already."""

    take: Callable[[bytes], bool] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        take = self.take
        if take is None or not data or self._buffer or not take(cast(bytes, data)):  # type: ignore[attr-defined]
            super().feed_data(data)

    def wake(self) -> None:
        """End a read waiting on the empty buffer: it returns ``b""`` (not at EOF)."""
        self._wakeup_waiter()  # type: ignore[attr-defined]


class WritePipeProtocol(asyncio.streams.FlowControlMixin):
    """Flow control for a write-only pipe, with the close waiter ``StreamWriter`` expects."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._closed: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


class AgentProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Tells when the Agent has exited, even while something else holds its pipes open. The
    pipes are not asyncio's (:func:`~proxy.shell.transports.stdio.spawn_agent`): this protocol
    only hears of the process."""

    def __init__(self, *, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()
