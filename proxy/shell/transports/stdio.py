"""stdio on both sides: the proxy's own stdin/stdout toward the Client, a spawned Agent upstream.

Framing is one JSON-RPC message per line (wire brief 1.1), read in chunks through
:class:`~proxy.core.framing.LineFramer` so that asyncio's 64 KiB ``readline`` limit never applies
and a message is bounded only by ``--max-message-bytes``. The Agent's stderr is the proxy's stderr
(inherited, never read), and nothing but protocol bytes is ever written to stdout.

Agents die with the proxy, even when it is killed with SIGKILL. On Linux each Agent is given a
parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` between fork and exec): the kernel
kills it when the thread that started it ends, the thread running the proxy's event loop (in the
embedded proxy, a thread that ends only after the proxy has stopped its Agents). What the Agent
started is out of that signal's reach; the :class:`OrphanGuard` process
(:mod:`proxy.shell.transports.orphans`), which outlives the proxy, stops the Agent's process group
instead, on every system (on those without a parent-death signal, the Agent too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import signal
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar, Final, cast

from proxy.core.commands import FailPost
from proxy.core.framing import LineFramer, Oversized
from proxy.core.search import NEWLINE
from proxy.shell import parent_death
from proxy.shell.defaults import AGENT_GRACE, WRITE_SLICE
from proxy.shell.descriptors import widen_pipe, write_all
from proxy.shell.endpoint import Received, pieces
from proxy.shell.log import get_logger
from proxy.shell.transports.pipes import (
    READ_CHUNK,
    AgentProtocol,
    ArrivingReader,
    WritePipeProtocol,
)

__all__ = [
    "IN_PLACE_LINES",
    "AgentProcess",
    "LineStream",
    "OrphanGuard",
    "exit_status",
    "in_child",
    "open_client_stdio",
    "send_signal",
    "spawn_agent",
    "widen_pipes",
]

log = get_logger("proxy.stdio")

IN_PLACE_LINES: Final = 8
"""A read with more lines than this is left to the link's pump, not relayed in the read's
callback: a stream's reads, which the pump takes together (what came while it relayed the last
ones, one write for them all), where relaying each read as it comes would write each apart."""
_COUNTED_READ: Final = 1024
"""Bytes of a read whose newlines are counted at once (cheaper than a search for each)."""

GROUP_POLL: Final = 0.05
"""Seconds between two checks whether an exited Agent's leftover processes are gone."""
ORPHANS_SCRIPT: Final = Path(__file__).with_name("orphans.py")


def in_child(proxy: int) -> None:
    """What an Agent (or another child the tools spawn as a process group of its own: a Client
    under test) runs between fork and exec: SIGINT and SIGTERM at their defaults, and, on
    Linux, killed (SIGKILL) when the proxy's thread that forks it ends.

    The proxy passes those signals on to the Agent itself (its process group is out of the
    terminal's reach): an Agent that inherited them ignored (a proxy started as a shell's
    background job, ``acp-proxy run ... &``, ignores SIGINT until it sets its handler) would
    let the signal passed on do nothing, and then exit 0 at the end of its stdin."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    if parent_death.AVAILABLE:
        parent_death.die_with_parent(proxy)


class OrphanGuard:
    """The proxy's side of :mod:`proxy.shell.transports.orphans`: started with the first Agent, told
    of each Agent's process group and of its end. One per process (:meth:`shared`).

    Its pipe is never closed by the proxy (the guard reads its end of file as the proxy's death,
    at exit). When it cannot be started or told (no Python executable to run it, a guard that
    died), that is logged once and Agents keep only their parent-death signal.
    """

    _shared: ClassVar[OrphanGuard | None] = None

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._fd: int | None = None
        self._failed = False
        self.pid: int | None = None
        """The guard's process id, once started."""

    @classmethod
    def shared(cls) -> OrphanGuard:
        """The guard of this process (a forked child of the proxy gets one of its own)."""
        if cls._shared is None or cls._shared._owner != os.getpid():
            cls._shared = cls()
        return cls._shared

    def watch(self, pgid: int, grace: float) -> None:
        """Stop process group ``pgid`` (``grace`` seconds between SIGTERM and SIGKILL) if the
        proxy dies before it has ended."""
        if self._fd is None and not self._failed:
            self._start()
        self._tell(f"+{pgid} {grace:.3f}\n")

    def forget(self, pgid: int) -> None:
        """Process group ``pgid`` has ended: leave it alone (its number may be used again)."""
        self._tell(f"-{pgid}\n")

    def _start(self) -> None:
        if not sys.executable:
            self._fail("no Python executable to run it")
            return
        read_end, write_end = os.pipe()  # neither is inherited by an Agent (close-on-exec)
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", str(ORPHANS_SCRIPT)],
                os.environ,
                file_actions=[  # the proxy's stderr is not held open by the guard
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
        except (OSError, NotImplementedError) as exc:
            os.close(write_end)
            self._fail(str(exc) or type(exc).__name__)
            return
        finally:
            os.close(read_end)
        self._fd = write_end

    def _tell(self, line: str) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line.encode())
        except OSError as exc:
            os.close(self._fd)
            self._fd = None
            self._fail(str(exc))

    def _fail(self, cause: str) -> None:
        self._failed = True
        log.warning(
            "the guard of agent process groups is not running; an agent's own children may "
            "outlive a proxy that is killed",
            error=cause,
        )


def _lines_over(data: bytes, most: int) -> bool:
    """Whether ``data`` holds more than ``most`` newlines: a short read's counted in one call, a
    longer one's looked for one by one (memchr), where counting them all steps through every
    byte (16 us for 64 KiB)."""
    if len(data) <= _COUNTED_READ:
        return data.count(NEWLINE) > most
    newline = -1
    for _ in range(most + 1):
        newline = data.find(b"\n", newline + 1)
        if newline < 0:
            return False
    return True


def exit_status(returncode: int) -> int:
    """A process return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class LineStream:
    """A newline-framed message stream over an asyncio reader/writer pair.

    ``half_close``: :meth:`close` only closes the writing end and reading goes on until the
    peer's EOF (an Agent told to stop by EOF on stdin may still answer). Otherwise closing also
    stops reading (the Client's stdin: once the Agent is gone nothing more is relayed).
    """

    transport = "stdio"

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        read_transport: asyncio.BaseTransport,
        *,
        limit: int,
        half_close: bool,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._write_transport = writer.transport
        self._read_transport = read_transport
        self._half_close = half_close
        self._framer = LineFramer(limit)
        self._ready: list[bytes | Oversized] = []
        """The messages of the last read; :meth:`receive` returns them from ``_next`` on."""
        self._next = 0
        self._awaiting = False
        """A :meth:`receive` waits on the reader (nothing read is left to return)."""
        self._whole = True
        """Whether every one of them is a message's bytes (no marker of one too large)."""
        self._loop = asyncio.get_running_loop()
        self._gathered: deque[bytes] = deque()
        """Messages sent since the last write: one ``write`` (one system call) takes them all,
        unless they are more than :data:`WRITE_SLICE` bytes (see :meth:`drain`)."""
        self._gathered_size = 0
        self._first_written = 0
        """Bytes of the first gathered that a slice wrote already (:meth:`_write_slice`)."""
        self._flush_coming = False
        """A :meth:`flush` comes before the loop's next turn (:meth:`will_flush`)."""
        self._draining = 0
        """Drains writing slice by slice now (the two pumps of a link may both drain a side)."""
        self._slicer: asyncio.Task[None] | None = None
        """Writes a message in pieces (``slice``), and what was sent behind it, in order."""
        self._behind: deque[tuple[bytes, float]] = deque()
        """What the slicer has still to write: bytes, and the pause before them."""
        self._behind_size = 0
        self._sliced = asyncio.Event()
        """Set while no slicer runs."""
        self._sliced.set()
        self._close_when_sliced = False
        self._eof = False
        self._closing = False
        self._severed = False
        self.flushed_by: threading.Thread | None = None
        """A thread copying what is written on to a file; closing waits for it to finish."""

    async def receive(self) -> Received | None:
        """The next line (or oversize marker), or ``None`` at EOF or once severed."""
        while self._next >= len(self._ready):
            if self._eof or self._severed:
                return None
            self._awaiting = True
            try:
                chunk = await self._reader.read(READ_CHUNK)
            except (ConnectionError, OSError) as exc:
                log.warning("read failed; treating as end of stream", error=str(exc))
                chunk = b""
            finally:
                self._awaiting = False
            if self._severed:
                return None
            if not chunk and not self._reader.at_eof():
                continue  # woken: lines were handed over (see hand_over)
            framer = self._framer
            markers = framer.oversized
            # Lines handed over while this read waited, not returned yet, come first (no list
            # made for the usual case, where there are none: one per read costs the stream).
            left = self._ready[self._next :] if self._next < len(self._ready) else None
            if chunk:
                self._ready = framer.feed(chunk)
            else:
                self._eof = True
                self._ready = framer.eof()
            if left:
                self._ready[:0] = left
            self._next = 0
            self._whole = framer.oversized == markers
        ready, taken = self._ready, self._next
        if taken + 1 == len(ready):  # the last: the list keeps no message alive once all are taken
            self._ready, self._next = [], 0
        else:
            self._next = taken + 1
        return ready[taken]

    def receive_ready(self) -> bool:
        """Whether lines of the last chunk read are still to be returned."""
        return self._next < len(self._ready)

    def receive_burst(self, below: int) -> list[bytes]:
        """The lines of the last chunk read still to be returned, all at once, when none is a
        marker of one too large nor ``below`` bytes or more long; else none."""
        ready, start = self._ready, self._next
        if start >= len(ready) or not self._whole:
            return []
        rest = cast("list[bytes]", ready[start:])
        if max(map(len, rest)) >= below:
            return []
        self._ready, self._next = [], 0
        return rest

    def give_back(self, messages: list[bytes]) -> None:
        """``messages``, the last :meth:`receive_burst` returned, are returned again first
        (unless the stream was severed meanwhile: they are gone with the rest)."""
        if not self._severed:
            self._ready, self._next, self._whole = [*messages, *self._ready], 0, True

    def relay_in_place(
        self,
        ready: Callable[[], bool],
        relay: Callable[[list[bytes]], None],
        large: Callable[[bytes], bool],
        small: int,
    ) -> None:
        """Relay what arrives as it arrives, in the reader's callback, when nothing waits (the
        link is ``ready``, nothing read is left to return, no message too large, a read of a
        few lines: not a stream): ``relay`` takes the messages it completes, and no task wakes
        for them. Those of a read where one is ``large`` (to be parsed elsewhere; none under
        ``small`` bytes is) are returned by :meth:`receive` instead, as is what arrives while
        the link is not ready; so are a stream's (a read of many lines, which the pump relays
        together), framed here all the same, so that they never pass through the reader's
        buffer."""
        reader = self._reader
        if isinstance(reader, ArrivingReader):
            reader.take = functools.partial(self._take, ready, relay, large, small)

    def _take(
        self,
        ready: Callable[[], bool],
        relay: Callable[[list[bytes]], None],
        large: Callable[[bytes], bool],
        small: int,
        data: bytes,
    ) -> bool:
        if not self._awaiting or self._next < len(self._ready) or self._severed or self._eof:
            return False
        if not self._framer.fits(len(data)):
            return False
        stream = _lines_over(data, IN_PLACE_LINES)
        if not stream and not ready():
            return False
        lines = cast("list[bytes]", self._framer.feed(data))  # none too large: see fits
        if not lines:
            return True
        if stream or (max(map(len, lines)) >= small and any(map(large, lines))):
            # To the waiting pump, framed: a stream's read (never through the reader's buffer,
            # which copies a chunk in and out again), or one the pump has parsed elsewhere.
            self.hand_over(lines)
        else:
            relay(lines)
        return True

    def hand_over(self, messages: list[bytes]) -> None:
        """Messages framed by :meth:`relay_in_place` that the link cannot relay now: the waiting
        :meth:`receive` returns them, in order (unless the stream was severed meanwhile)."""
        if not self._severed:
            self._ready, self._next, self._whole = [*messages, *self._ready], 0, True
            if isinstance(self._reader, ArrivingReader):
                self._reader.wake()

    def will_flush(self) -> None:
        """Until :meth:`flush`, gather what is sent without asking for a write at the end of
        this turn of the loop (a call and a turn of the loop a message saved)."""
        self._flush_coming = True

    def flush(self) -> None:
        """Write what is gathered now (it would be at the end of this turn of the loop)."""
        self._flush_coming = False
        if not self._draining:
            self._write_gathered()

    def send(self, data: bytes) -> None:
        """Queue ``data`` and its newline; silently dropped once the stream is closing.

        A message from another transport may hold raw newlines (pretty-printed JSON, where they
        can only be whitespace); each becomes a space, so that the message stays one line.
        Messages are gathered and written together by :meth:`drain`, which the link calls once
        the burst of messages read from the other peer is relayed, or else once this turn of
        the event loop is over (a timer's message).
        """
        if self._closing or self._write_transport.is_closing():
            return
        if NEWLINE in data:
            data = data.replace(b"\n", b" ")
        self._gather(data, ended=True)

    def send_run(self, messages: Sequence[bytes]) -> None:
        """Queue ``messages``, a line each, as :meth:`send` would (joined in one copy)."""
        if self._closing or self._write_transport.is_closing() or not messages:
            return
        lines = [*messages, b""]  # each with its line end, in the one copy the join makes
        data = b"\n".join(lines)
        if data.count(b"\n") != len(messages):  # one holds a raw newline of its own
            data = b"\n".join([message.replace(b"\n", b" ") for message in messages] + [b""])
        self._gather(data, ended=False)

    def send_cut(self, data: bytes, cut: int) -> None:
        """The start of a line, without its end (a writer that died mid-line)."""
        if self._closing or self._write_transport.is_closing():
            return
        self._gather(data[:cut].replace(b"\n", b" "), ended=False)

    def send_sliced(self, data: bytes, sizes: tuple[int, ...], gap: float) -> None:
        """The line in pieces, ``gap`` seconds apart, each its own write; later lines follow
        its last piece."""
        if self._closing or self._write_transport.is_closing():
            return
        line = data.replace(b"\n", b" ") + b"\n"
        if self._slicer is None:
            self._write_gathered()  # what was sent before it goes first
            self._sliced.clear()
            self._slicer = self._loop.create_task(self._write_pieces())
        for index, piece in enumerate(pieces(line, sizes)):
            self._behind.append((piece, gap if index else 0.0))
        self._behind_size += len(line)

    async def _write_pieces(self) -> None:
        """Write what is behind a sliced message, in order, pausing where it says."""
        writer = self._writer
        try:
            while self._behind:
                pause = self._behind[0][1]
                if pause > 0:
                    await asyncio.sleep(pause)  # the piece still counts as buffered meanwhile
                data, _ = self._behind.popleft()
                self._behind_size -= len(data)
                if writer.transport.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the peer went away: its reader hears of it
        finally:
            self._slicer = None
            self._behind.clear()
            self._behind_size = 0
            self._sliced.set()
            if self._close_when_sliced:
                self._close_now()

    def _gather(self, data: bytes, *, ended: bool) -> None:
        """Queue ``data`` (and a line end, if ``ended``) for the next write; the first queued
        since the last write asks for one at the end of this turn of the event loop (behind a
        message being written in pieces, it waits for its last piece)."""
        if self._slicer is not None:
            self._behind.append((data + b"\n" if ended else data, 0.0))
            self._behind_size += len(data) + ended
            return
        gathered = self._gathered
        if not gathered and not self._flush_coming:
            self._loop.call_soon(self._write_soon)
        gathered.append(data)
        if ended:
            gathered.append(b"\n")
        self._gathered_size += len(data) + ended

    def _write_soon(self) -> None:
        """At the end of the loop's turn that gathered a message: write what :meth:`drain` (which
        the link calls after a burst) did not take, or is not writing slice by slice."""
        if not self._draining:
            self._write_gathered()

    def _write_gathered(self) -> None:
        gathered = self._gathered
        if gathered and not self._writer.transport.is_closing():
            if self._first_written:
                gathered[0] = gathered[0][self._first_written :]
            self._writer.write(gathered[0] if len(gathered) == 1 else b"".join(gathered))
        self._drop_gathered()

    def _drop_gathered(self) -> None:
        self._gathered.clear()
        self._gathered_size = 0
        self._first_written = 0

    def _write_slice(self) -> None:
        """Write the first :data:`WRITE_SLICE` bytes gathered; the rest stays gathered (bytes
        sliced as they are written)."""
        gathered, room, parts = self._gathered, WRITE_SLICE, []
        while gathered and room:
            first, start = gathered[0], self._first_written
            left = len(first) - start
            if left <= room:
                parts.append(first[start:] if start else first)
                gathered.popleft()
                self._first_written = 0
                room -= left
            else:
                parts.append(first[start : start + room])
                self._first_written = start + room
                room = 0
        self._gathered_size -= WRITE_SLICE - room
        self._writer.write(b"".join(parts))

    async def drain(self) -> None:
        """Write what is gathered; wait for the peer to read enough of what is queued.

        More than :data:`WRITE_SLICE` bytes (a message of many MB) are written a slice at a
        time, each once the peer has read the one before: copying the whole into the pipe's
        buffer at once would hold the event loop, every other link with it, for tens of ms.
        """
        # A peer that went away is noticed by its reader (EOF), and the relay hears of it there.
        with contextlib.suppress(ConnectionError, OSError):
            self._draining += 1
            try:
                while self._gathered_size > WRITE_SLICE:
                    if self._writer.transport.is_closing():
                        break
                    self._write_slice()
                    await self._writer.drain()
            finally:
                self._draining -= 1
            self._write_gathered()
            if self._writer.transport.is_closing():
                return
            await self._writer.drain()
        while self._behind_size > WRITE_SLICE:  # a message in pieces holds much behind it
            await self._sliced.wait()

    def buffered(self) -> int:
        """Bytes gathered or written and not yet taken by the pipe (its own 64 KiB not counted)."""
        queued = self._gathered_size + self._behind_size
        return queued + self._writer.transport.get_write_buffer_size()

    def close(self) -> None:
        """Flush what is queued and close the writing end (and reading, unless half-closing);
        behind a message being written in pieces, once its last piece (and what follows) is."""
        if self._closing:
            return
        self._closing = True
        if self._slicer is not None:
            self._close_when_sliced = True
            return
        self._close_now()

    def _close_now(self) -> None:
        self._write_gathered()
        self._writer.close()
        if not self._half_close:
            self._read_transport.close()

    def sever(self, *, flush: bool, close_code: int = 1001) -> None:
        """Cut both pipes now (after writing what is queued, with ``flush``). Idempotent."""
        if self._severed:
            return
        self._severed = True
        self._closing = True
        self._ready, self._next = [], 0
        if self._slicer is not None:  # the pieces left go at once (flush) or never
            self._close_when_sliced = False
            self._slicer.cancel()
            if flush and not self._writer.transport.is_closing():
                self._writer.write(b"".join(data for data, _ in self._behind))
            self._behind.clear()
            self._behind_size = 0
        if flush or self._writer.transport.is_closing():
            self._write_gathered()
            self._writer.close()
        else:
            self._drop_gathered()
            self._writer.transport.abort()
        self._read_transport.close()

    def processed(self, failure: FailPost | None) -> None:
        """Nothing to settle: a line has no answer of its own."""

    async def wait_closed(self) -> None:
        """Wait for the writing end to be closed (and what was written to reach a file)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        if self.flushed_by is not None:
            await asyncio.to_thread(self.flushed_by.join, 10.0)


def send_signal(process: asyncio.subprocess.Process, signum: int) -> None:
    """Send ``signum`` to a child that has not been reaped yet, by its pid.

    Never ``Process.kill()``/``terminate()``: they go through ``Popen.send_signal``, which polls
    first and may reap a child that has just exited behind asyncio's back, whose watcher then
    reports the exit status 255.
    """
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


def widen_pipes(peer: str, size: int, *, reading: int, writing: int) -> None:
    """Ask that the pipes between the proxy and ``peer`` (the proxy's ends: ``reading`` from
    it, ``writing`` to it) hold ``size`` bytes each (0: as the system made them; never less
    than that). What each holds after is logged (None: not a pipe), at info when the system
    kept a pipe smaller than asked: it works as before, only with more wake-ups
    (:func:`~proxy.shell.descriptors.widen_pipe`)."""
    if size <= 0:
        return
    sizes = {
        "from_peer": widen_pipe(reading, size),
        "to_peer": widen_pipe(writing, size),
    }
    if all(held is None or held >= size for held in sizes.values()):
        log.debug("pipe sizes", peer=peer, asked=size, **sizes)
    else:
        log.info(
            "pipes kept smaller than --pipe-bytes asked: the system refused (past "
            "/proc/sys/fs/pipe-max-size, or the user's pipes past pipe-user-pages-soft)",
            peer=peer,
            asked=size,
            **sizes,
        )


async def _pipe_pair(
    reading: int, writing: int
) -> tuple[ArrivingReader, asyncio.StreamWriter, asyncio.BaseTransport]:
    """The reader of the pipe on ``reading``, the writer of the one on ``writing`` (each taken
    over, closed with its transport, or at once if this fails or is cancelled), and the
    transport reading: a peer's two pipes, the Client's or an Agent's, read and written alike."""
    loop = asyncio.get_running_loop()
    reader = ArrivingReader(limit=READ_CHUNK, loop=loop)
    read_end, write_end = os.fdopen(reading, "rb", 0), os.fdopen(writing, "wb", 0)
    try:
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), read_end
        )
    except BaseException:
        read_end.close()  # idempotent: the transport that failed may close it too
        write_end.close()
        raise
    try:
        transport, protocol = await loop.connect_write_pipe(
            lambda: WritePipeProtocol(loop), write_end
        )
    except BaseException:
        read_transport.close()
        write_end.close()
        raise
    return reader, asyncio.StreamWriter(transport, protocol, None, loop), read_transport


def _is_stream_fd(fd: int) -> bool:
    """Whether the event loop can poll ``fd`` (a pipe, socket or terminal; not /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _bridge(source: int, target: int) -> threading.Thread:
    """Copy ``source`` to ``target`` until EOF in a daemon thread (regular files, /dev/null)."""

    def copy() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(source, READ_CHUNK):
                write_all(target, chunk)
        with contextlib.suppress(OSError):
            os.close(target)

    thread = threading.Thread(target=copy, name=f"stdio-bridge-{source}", daemon=True)
    thread.start()
    return thread


async def open_client_stdio(
    *, limit: int, pipe_bytes: int = 0, stdin: int = 0, stdout: int = 1
) -> LineStream:
    """Wrap the proxy's stdin and stdout as the Client endpoint (``pipe_bytes``: the room asked
    of either when it is a pipe, :func:`widen_pipes`).

    A file or ``/dev/null`` on either fd is bridged through a pipe by a thread, because asyncio
    can only poll pipes, sockets and terminals. The endpoint takes the streams over (on
    descriptors no child inherits), and ``stdin`` and ``stdout`` are left on ``/dev/null``: a
    process the proxy starts (a parsing worker) never holds the Client's pipes open after the
    proxy is gone, and nothing written to ``sys.stdout`` by mistake reaches the protocol channel.
    """
    asyncio.get_running_loop()  # raises outside the event loop, before the descriptors move
    in_fd = os.dup(stdin)
    out_fd = os.dup(stdout)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, stdin)
    os.dup2(devnull, stdout)
    os.close(devnull)
    if not _is_stream_fd(in_fd):
        read_end, write_end = os.pipe()
        _bridge(in_fd, write_end)
        in_fd = read_end
    out_bridge = None
    if not _is_stream_fd(out_fd):
        read_end, write_end = os.pipe()
        out_bridge = _bridge(read_end, out_fd)
        out_fd = write_end
    widen_pipes("client", pipe_bytes, reading=in_fd, writing=out_fd)
    reader, writer, read_transport = await _pipe_pair(in_fd, out_fd)
    stream = LineStream(reader, writer, read_transport, limit=limit, half_close=False)
    stream.flushed_by = out_bridge
    return stream


class AgentProcess(LineStream):
    """A spawned Agent: its stdin and stdout are the upstream connection, stderr is ours.

    The Agent leads a process group of its own, and signals go to the whole group, so that what
    the Agent started (a wrapper's child, a helper) is stopped with it. Whatever is left in the
    group once the Agent has exited is sent SIGTERM, then SIGKILL after the grace period: an
    orphan that holds the Agent's stdout open would otherwise keep its link open for ever.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        pipes: tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.BaseTransport],
        exited: asyncio.Event,
        *,
        limit: int,
        grace: float,
        announce_exit: bool = True,
    ) -> None:
        """``pipes``: the reader of the Agent's stdout, the writer of its stdin, and the
        transport reading its stdout (:func:`spawn_agent`)."""
        reader, writer, read_transport = pipes
        super().__init__(reader, writer, read_transport, limit=limit, half_close=True)
        self.process = process
        self._exited = exited
        """Set once the Agent has exited (its pipes may still be open in a child of its)."""
        self._grace = grace
        self._group_gone = False
        self._flushed = False
        self.stopped_by_proxy = False
        """True when the proxy had to signal the Agent because it did not exit by itself."""
        self._signalled = False
        self._announce_exit = announce_exit
        self._guard = OrphanGuard.shared()
        self._guard.watch(self.pid, grace)
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    @property
    def pid(self) -> int:
        """The Agent's process id (also the id of its process group)."""
        return self.process.pid

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the Agent's process group while it has members (``kill_agent``).

        ``os.killpg`` and never ``Popen.send_signal``: the latter polls, and may reap the Agent
        behind asyncio's back (whose watcher then reports the exit status 255).
        """
        if self._group_gone:
            return
        self._signalled = self._signalled or signum != 0
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            self._group_gone = True
        except PermissionError:  # no member this process may signal (a setuid one)
            pass

    async def wait_closed(self) -> None:
        """Give the Agent ``grace`` seconds to read what is queued and exit after its stdin closed,
        then SIGTERM its process group, then SIGKILL; return once the group is gone."""
        if not await self._exited_within(self._grace, flush=True):
            if not self._flushed:
                self._writer.transport.abort()  # what the Agent did not read is dropped
            for signum in (signal.SIGTERM, signal.SIGKILL):
                log.info(
                    "agent did not exit in time; signalling it",
                    pid=self.pid,
                    signal=signal.Signals(signum).name,
                )
                self.stopped_by_proxy = True
                self.signal(signum)
                if await self._exited_within(self._grace, flush=False):
                    break
        await self._exited.wait()
        await asyncio.shield(self._reaper)  # the rest of the group is stopped: pipes close
        await self.process.wait()

    async def _exited_within(self, seconds: float, *, flush: bool) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                if flush:
                    await super().wait_closed()
                    self._flushed = True
                await self._exited.wait()
                return True
        return False

    async def _reap(self) -> None:
        """Once the Agent has exited, stop what it left in its group (TERM, grace, KILL); the
        :class:`OrphanGuard` forgets the group once it is gone."""
        await self._stop_leftovers()
        if self._group_gone:
            self._guard.forget(self.pid)

    async def _stop_leftovers(self) -> None:
        """An Agent that failed by itself (an exit status other than 0, no signal from the proxy)
        is logged as a warning: otherwise a Client would only see its connection end."""
        await self._exited.wait()
        code = self.process.returncode
        if code and not self._signalled and self._announce_exit:
            log.warning("the agent exited", pid=self.pid, exit_status=exit_status(code))
        for signum in (signal.SIGTERM, signal.SIGKILL):
            if not self._group_alive():
                return
            log.info(
                "the agent exited and left processes in its group; signalling them",
                pgid=self.pid,
                signal=signal.Signals(signum).name,
            )
            self.signal(signum)
            for _ in range(math.ceil(self._grace / GROUP_POLL)):  # no event tells of a grandchild
                if not self._group_alive():
                    return
                await asyncio.sleep(GROUP_POLL)

    def _group_alive(self) -> bool:
        self.signal(0)
        return not self._group_gone

    async def failure(self, within: float) -> str | None:
        """Why the Agent ended, when it failed: an exit status other than 0, or a signal (one the
        proxy sent too: ``kill_agent``); None for status 0, or while it still runs after
        ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._exited.wait()
        code = self.process.returncode
        if not code:
            return None
        if code > 0:
            return f"the agent exited with status {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the agent was killed by {name}"

    async def wait(self) -> int:
        """Wait for the Agent to exit; return its exit status as a shell reports it."""
        return exit_status(await self.process.wait())


async def spawn_agent(
    argv: Sequence[str],
    *,
    limit: int,
    grace: float = AGENT_GRACE,
    env: Mapping[str, str] | None = None,
    stderr: IO[bytes] | None = None,
    announce_exit: bool = True,
    pipe_bytes: int = 0,
) -> AgentProcess:
    """Start ``argv`` with piped stdin/stdout and the proxy's own stderr and environment, as the
    leader of a new process group (``stderr``: a file its stderr goes to instead), that dies
    with the proxy (see the module). An exit status
    other than 0 the proxy did not cause is logged, unless ``announce_exit`` is false.
    ``pipe_bytes``: the room asked of either pipe (:func:`widen_pipes`).

    The pipes are the proxy's own, read and written as the Client's stdio is (not asyncio's
    subprocess pipes, which hand each read on through one more turn of the event loop): an
    answer from the Agent is relayed in the callback of the read that brought it.

    Raises ``FileNotFoundError`` or ``PermissionError`` when the command cannot be run.
    """
    loop = asyncio.get_running_loop()
    agent_stdin, to_agent = os.pipe()
    try:
        from_agent, agent_stdout = os.pipe()
    except BaseException:
        os.close(agent_stdin)
        os.close(to_agent)
        raise
    try:
        try:
            widen_pipes("agent", pipe_bytes, reading=from_agent, writing=to_agent)
        except BaseException:
            os.close(from_agent)
            os.close(to_agent)
            raise
        # Connected before the Agent starts (taken over, closed if this fails): once it runs,
        # nothing is awaited that a cancel could cut short with no AgentProcess to stop it.
        pipes = await _pipe_pair(from_agent, to_agent)
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: AgentProtocol(limit=READ_CHUNK, loop=loop),
                *argv,
                stdin=agent_stdin,
                stdout=agent_stdout,
                stderr=stderr,
                env=None if env is None else dict(env),
                process_group=0,
                preexec_fn=functools.partial(in_child, os.getpid()),
            )
        except BaseException:
            _, writer, read_transport = pipes
            read_transport.close()
            writer.close()
            raise
    finally:
        os.close(agent_stdin)
        os.close(agent_stdout)
    process = asyncio.subprocess.Process(transport, protocol, loop)
    log.info("agent started", pid=process.pid, argv=list(argv))
    return AgentProcess(
        process,
        pipes,
        protocol.exited,
        limit=limit,
        grace=grace,
        announce_exit=announce_exit,
    )
