"""Parsing messages without stalling the event loop: large ones go to a worker process.

Parsing a message holds the interpreter while it builds one object per JSON value: a large
message would hold every other link, the control API and the timers for as long (seconds, for
60 MB of tiny containers). A message of :data:`~proxy.shell.defaults.WORKER_MESSAGE_BYTES` or
more, or of :data:`~proxy.shell.defaults.LARGE_MESSAGE_BYTES` or more with
:data:`~proxy.shell.defaults.WORKER_MESSAGE_VALUES` values or more (told from its bytes, no
parse: :mod:`proxy.core.parse_cost`), is parsed in a worker process instead, which sends back a
compacted parse (:mod:`proxy.core.compact`): the relay reads it as it reads any message, and
the loop spends on it only what copying its bytes costs. The message reaches the worker in a
memory file a thread writes (on Linux), not pickled: pickling copies it while holding the
interpreter. Other messages are parsed in place: for a 64 KiB prompt of one long text that
costs a tenth of the worker's round trip.

The workers start on the first large message, not before (most runs never see one), as fresh
interpreters (forked, they would copy the proxy's threads' locks in whatever state they are). A
worker that dies on a message (the system's out-of-memory killer, a message of a few GB of
objects) costs that message only: it is refused as too complex to relay (the relay answers it
like one too large), ``parsing worker lost`` is logged, and new workers take the next one.

Workers start without the program's ``__main__``: a spawned worker would otherwise run the
program's script again (multiprocessing's rule for spawned children), and a script that embeds
the proxy without an ``if __name__ == "__main__":`` guard would start a proxy in each worker.

Workers die with the proxy, however it ends: on Linux by the parent-death signal
(:mod:`proxy.shell.parent_death`), elsewhere by a thread of theirs that sees the proxy gone
within a second. They ignore SIGINT (a Ctrl-C reaches the whole foreground process group: the
proxy decides how its workers end), and they never hold the Client's stdio (the proxy moved it
away before they start: :func:`~proxy.shell.transports.stdio.open_client_stdio`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
import signal
import stat
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from proxy.core.compact import Compacted, parse_compacted, restore
from proxy.core.jsonrpc import Batch, Invalid, InvalidReason, Message, parse
from proxy.core.parse_cost import few_values, value_count
from proxy.shell import parent_death
from proxy.shell.defaults import (
    LARGE_MESSAGE_BYTES,
    PARSING_WORKERS,
    WORKER_MESSAGE_BYTES,
    WORKER_MESSAGE_VALUES,
)
from proxy.shell.descriptors import write_all
from proxy.shell.log import get_logger

__all__ = ["Parser"]

log = get_logger("proxy.parsing")

Result = TypeVar("Result")


class Parser:
    """Parses messages for the whole proxy: large ones in worker processes."""

    def __init__(
        self,
        large: int | None = LARGE_MESSAGE_BYTES,
        workers: int = PARSING_WORKERS,
        *,
        always: int = WORKER_MESSAGE_BYTES,
        values: int = WORKER_MESSAGE_VALUES,
    ) -> None:
        self.large = large
        """Messages of this many bytes or more are parsed by a worker when they hold ``values``
        values or more, or are ``always`` bytes or more (``None``: none is)."""
        self._always = always
        self._values = values
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self.offloaded = 0
        """Messages given to a worker so far."""
        self.parsing = 0
        """Messages a worker is parsing (or that wait for one) now."""
        self.lost = 0
        """Workers lost (each with the message it parsed)."""
        self.by_file = BY_FILE
        """Whether messages reach the workers in memory files (false once a worker could not
        open one: they are then pickled)."""

    def is_large(self, data: bytes) -> bool:
        """Whether ``data`` is parsed by a worker: ``large`` bytes or more, and ``always`` bytes
        or more or ``values`` values or more (:mod:`proxy.core.parse_cost`: a long text is
        proven light by its strings, other messages are counted)."""
        if self.large is None or len(data) < self.large:
            return False
        if len(data) >= self._always:
            return True
        if few_values(data, self._values):
            return False
        return value_count(data) >= self._values

    async def parse(self, data: bytes) -> Message | Batch | Invalid:
        """The parse of ``data`` (:func:`proxy.core.jsonrpc.parse`), a large one by a worker."""
        if not self.is_large(data):
            return parse(data)
        return await self.offload(data)

    async def offload(self, data: bytes) -> Message | Batch | Invalid:
        """The parse of ``data`` by a worker (for a message :meth:`is_large` found large)."""
        pool = self._pool
        if pool is None:
            pool = self._pool = ProcessPoolExecutor(
                self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started,
                initargs=(os.getpid(),),
            )
        self.offloaded += 1
        self.parsing += 1
        try:
            compacted = await self._hand_over(pool, data)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                self.lost += 1
                log.warning("parsing worker lost; the message it parsed is refused", size=len(data))
            pool.shutdown(wait=False, cancel_futures=True)
            detail = "too complex to relay: the worker parsing it was lost"
            return Invalid(data, InvalidReason.TOO_COMPLEX, detail)
        finally:
            self.parsing -= 1
        return restore(compacted, data)

    async def _hand_over(self, pool: ProcessPoolExecutor, data: bytes) -> Compacted:
        """The compacted parse of ``data`` by a worker of ``pool``, the message handed over in a
        memory file where the system has them: a thread writes it there (the kernel copies it
        while the interpreter runs the loop) and the worker opens it by its path. Pickled
        instead, the message would be copied while holding the interpreter: tens of ms for
        60 MB, during which every link, the control API and the timers wait."""
        if self.by_file:
            descriptor = await _memory_file(data)
            status = os.fstat(descriptor)
            path = f"/proc/{os.getpid()}/fd/{descriptor}"
            try:
                parsing = _submit(pool, _parse_file, path, (status.st_dev, status.st_ino))
            except BaseException:
                _close_memory_file(descriptor)
                raise
            # The file stays open until the worker is done with it, even when this is cancelled
            # (a worker that has the call cannot be stopped): closed earlier, its number could be
            # another file's by the time the worker opens it.
            loop = asyncio.get_running_loop()
            parsing.add_done_callback(functools.partial(_close_when_parsed, loop, descriptor))
            compacted = await asyncio.wrap_future(parsing)
            if compacted is not None:
                return compacted
            self.by_file = False
            log.info("parsing workers cannot open the proxy's memory files; messages are copied")
        compacted = await _call(pool, parse_compacted, data)
        # The pool's feeder thread keeps the last call it sent, pickled (the whole message),
        # until it sends another: a trivial call lets the message go at once.
        await _call(pool, int)
        return compacted

    def close(self) -> None:
        """Stop the workers, at the end of a run: waiting parses are cancelled, and this waits
        for the workers to exit (one still parsing finishes first; one still starting starts
        first). Not waiting left them to race the interpreter's exit: a worker still starting
        found its queues gone, and the pool's exit hook wrote to a closed pipe (two tracebacks
        on stderr)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


BY_FILE = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
"""Whether messages reach the workers in memory files (Linux), not pickled."""


async def _memory_file(data: bytes) -> int:
    """A descriptor of a memory file holding ``data``, written by a thread. Cancelled while
    the thread writes, the file is closed once it has written."""
    writing = asyncio.get_running_loop().run_in_executor(None, _write_memory_file, data)
    try:
        return await asyncio.shield(writing)
    except asyncio.CancelledError:
        writing.add_done_callback(_close_written)
        raise


def _write_memory_file(data: bytes) -> int:
    """In a thread: a new memory file holding ``data`` (``os.write`` lets the interpreter go
    while the kernel copies)."""
    descriptor = os.memfd_create("acp-proxy-message", os.MFD_CLOEXEC)
    try:
        write_all(descriptor, data)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _close_memory_file(descriptor: int) -> None:
    """Close a memory file, in a thread of the loop's: freeing 60 MB of its pages takes the
    kernel about 10 ms, which the event loop would otherwise wait for (where the loop no longer
    runs threads, it is ending: here and now)."""
    try:
        asyncio.get_running_loop().run_in_executor(None, os.close, descriptor)
    except RuntimeError:
        os.close(descriptor)


def _close_written(writing: asyncio.Future[int]) -> None:
    """Close the memory file a cancelled hand-over had a thread write."""
    if not writing.cancelled() and writing.exception() is None:
        _close_memory_file(writing.result())


def _close_when_parsed(
    loop: asyncio.AbstractEventLoop, descriptor: int, _parsing: Future[Compacted | None]
) -> None:
    """Once the worker is done with the memory file (or the call was cancelled before one had
    it), in whichever thread says so: close the file from the loop's thread."""
    try:
        loop.call_soon_threadsafe(_close_memory_file, descriptor)
    except RuntimeError:  # the loop is closed: the proxy is ending
        os.close(descriptor)


def _parse_file(path: str, identity: tuple[int, int]) -> Compacted | None:
    """In a worker: the compacted parse of the message in the proxy's memory file at ``path``,
    whose ``(st_dev, st_ino)`` is ``identity`` (``None``: this worker may not open it). What
    it opened is checked before it is read, and opened so that a pipe would not block."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with open(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or (status.st_dev, status.st_ino) != identity:
            return None
        raw = file.read()
    return parse_compacted(raw)


def _call(
    pool: ProcessPoolExecutor, function: Callable[..., Result], *arguments: object
) -> asyncio.Future[Result]:
    """``function(*arguments)`` in a worker of ``pool``, awaitable (:func:`_submit`)."""
    return asyncio.wrap_future(_submit(pool, function, *arguments))


def _submit(
    pool: ProcessPoolExecutor, function: Callable[..., Result], *arguments: object
) -> Future[Result]:
    """``function(*arguments)`` submitted to ``pool``. Any call may start a worker (the pool
    starts one on submitting when none is idle, and the last one becomes idle only after its
    result is delivered), so every call is submitted with the program's ``__main__`` hidden."""
    with _main_hidden():
        return pool.submit(function, *arguments)


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While workers may start (synchronously, in ``submit``): a ``__main__`` with no script,
    which they do not run again."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _worker_started(proxy: int) -> None:
    """In each worker as it starts: die with ``proxy``, leave SIGINT to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_death.AVAILABLE:
        parent_death.die_with_parent(proxy)
    else:
        threading.Thread(target=_watch_parent, args=(proxy,), daemon=True).start()


def _watch_parent(proxy: int) -> None:
    """End this worker once ``proxy`` is gone (its parent is then another process)."""
    while os.getppid() == proxy:
        time.sleep(1.0)
    os._exit(0)
