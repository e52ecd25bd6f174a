"""stdio on both sides: the proxy's own stdin/stdout toward the Client, a spawned Agent upstream.

Framing is one JSON-RPC message per line (wire brief 1.1), read in chunks through
:class:`~proxy.framing.LineFramer` so that asyncio's 64 KiB ``readline`` limit never applies and
a message is bounded only by ``--max-message-bytes``. The Agent's stderr is the proxy's stderr
(inherited, never read), and nothing but protocol bytes is ever written to stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import threading
from collections import deque
from collections.abc import Mapping, Sequence

from proxy.endpoint import Received
from proxy.framing import LineFramer
from proxy.log import get_logger

__all__ = ["AgentProcess", "LineStream", "exit_status", "open_client_stdio", "spawn_agent"]

log = get_logger("proxy.stdio")

READ_CHUNK = 256 * 1024
"""Bytes asked of the OS per read: large enough that a 64 KiB prompt is one read."""


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
        self._read_transport = read_transport
        self._half_close = half_close
        self._framer = LineFramer(limit)
        self._ready: deque[Received] = deque()
        self._loop = asyncio.get_running_loop()
        self._gathered: list[bytes] = []
        """Messages sent since the last write: one ``write`` (one system call) takes them all."""
        self._gathered_size = 0
        self._eof = False
        self._closing = False
        self._severed = False
        self.flushed_by: threading.Thread | None = None
        """A thread copying what is written on to a file; closing waits for it to finish."""

    async def receive(self) -> Received | None:
        """The next line (or oversize marker), or ``None`` at EOF or once severed."""
        while not self._ready:
            if self._eof or self._severed:
                return None
            try:
                chunk = await self._reader.read(READ_CHUNK)
            except (ConnectionError, OSError) as exc:
                log.warning("read failed; treating as end of stream", error=str(exc))
                chunk = b""
            if self._severed:
                return None
            if chunk:
                self._ready.extend(self._framer.feed(chunk))
            else:
                self._eof = True
                self._ready.extend(self._framer.eof())
        return self._ready.popleft()

    def receive_ready(self) -> bool:
        """Whether lines of the last chunk read are still to be returned."""
        return bool(self._ready)

    def send(self, data: bytes) -> None:
        """Queue ``data`` and its newline; silently dropped once the stream is closing.

        A message from another transport may hold raw newlines (pretty-printed JSON, where they
        can only be whitespace); each becomes a space, so that the message stays one line.
        Messages are gathered and written together by :meth:`drain`, which the link calls once
        the burst of messages read from the other peer is relayed, or else once this turn of
        the event loop is over (a timer's message).
        """
        if self._closing or self._writer.transport.is_closing():
            return
        if b"\n" in data:
            data = data.replace(b"\n", b" ")
        if not self._gathered:
            self._loop.call_soon(self._write_gathered)
        self._gathered += (data, b"\n")
        self._gathered_size += len(data) + 1

    def _write_gathered(self) -> None:
        if self._gathered and not self._writer.transport.is_closing():
            self._writer.write(b"".join(self._gathered))
        self._gathered.clear()
        self._gathered_size = 0

    async def drain(self) -> None:
        """Write what is gathered; wait for the peer to read enough of what is queued."""
        self._write_gathered()
        if self._writer.transport.is_closing():
            return
        # A peer that went away is noticed by its reader (EOF), and the relay hears of it there.
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.drain()

    def buffered(self) -> int:
        """Bytes gathered or written and not yet taken by the pipe (its own 64 KiB not counted)."""
        return self._gathered_size + self._writer.transport.get_write_buffer_size()

    def close(self) -> None:
        """Flush what is queued and close the writing end (and reading, unless half-closing)."""
        if self._closing:
            return
        self._closing = True
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
        self._ready.clear()
        if flush or self._writer.transport.is_closing():
            self._write_gathered()
            self._writer.close()
        else:
            self._gathered.clear()
            self._gathered_size = 0
            self._writer.transport.abort()
        self._read_transport.close()

    def processed(self, status: int | None) -> None:
        """Nothing to settle: a line has no answer of its own."""

    async def wait_closed(self) -> None:
        """Wait for the writing end to be closed (and what was written to reach a file)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        if self.flushed_by is not None:
            await asyncio.to_thread(self.flushed_by.join, 10.0)


def _is_stream_fd(fd: int) -> bool:
    """Whether the event loop can poll ``fd`` (a pipe, socket or terminal; not /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _bridge(source: int, target: int) -> threading.Thread:
    """Copy ``source`` to ``target`` until EOF in a daemon thread (regular files, /dev/null)."""

    def copy() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(source, READ_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(target, view) :]
        with contextlib.suppress(OSError):
            os.close(target)

    thread = threading.Thread(target=copy, name=f"stdio-bridge-{source}", daemon=True)
    thread.start()
    return thread


class _WritePipeProtocol(asyncio.streams.FlowControlMixin):
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


async def open_client_stdio(*, limit: int, stdin: int = 0, stdout: int = 1) -> LineStream:
    """Wrap the proxy's stdin and stdout as the Client endpoint.

    A file or ``/dev/null`` on either fd is bridged through a pipe by a thread, because asyncio
    can only poll pipes, sockets and terminals.
    """
    loop = asyncio.get_running_loop()
    in_fd = os.dup(stdin)
    if not _is_stream_fd(in_fd):
        read_end, write_end = os.pipe()
        _bridge(in_fd, write_end)
        in_fd = read_end
    out_fd = os.dup(stdout)
    out_bridge = None
    if not _is_stream_fd(out_fd):
        read_end, write_end = os.pipe()
        out_bridge = _bridge(read_end, out_fd)
        out_fd = write_end
    reader = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(in_fd, "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        lambda: _WritePipeProtocol(loop), os.fdopen(out_fd, "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    stream = LineStream(reader, writer, read_transport, limit=limit, half_close=False)
    stream.flushed_by = out_bridge
    return stream


class AgentProcess(LineStream):
    """A spawned Agent: its stdin and stdout are the upstream connection, stderr is ours."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        stdout_transport: asyncio.BaseTransport,
        *,
        limit: int,
        grace: float,
    ) -> None:
        assert process.stdout is not None
        assert process.stdin is not None
        super().__init__(
            process.stdout, process.stdin, stdout_transport, limit=limit, half_close=True
        )
        self.process = process
        self._grace = grace
        self.stopped_by_proxy = False
        """True when the proxy had to signal the Agent because it did not exit by itself."""

    @property
    def pid(self) -> int:
        """The Agent's process id."""
        return self.process.pid

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the Agent if it is still running (``kill_agent``, signals)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    async def wait_closed(self) -> None:
        """Close stdin, give the Agent ``grace`` seconds to exit, then SIGTERM, then SIGKILL."""
        await super().wait_closed()
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            if signum is not None:
                log.info(
                    "agent did not exit in time; signalling it",
                    pid=self.pid,
                    signal=signal.Signals(signum).name,
                )
                self.stopped_by_proxy = True
                self.signal(signum)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), self._grace)
                return
        await self.process.wait()

    async def wait(self) -> int:
        """Wait for the Agent to exit; return its exit status as a shell reports it."""
        return exit_status(await self.process.wait())


async def spawn_agent(
    argv: Sequence[str],
    *,
    limit: int,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
) -> AgentProcess:
    """Start ``argv`` with piped stdin/stdout and the proxy's own stderr and environment.

    Raises ``FileNotFoundError`` or ``PermissionError`` when the command cannot be run.
    """
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=READ_CHUNK, loop=loop),
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=None,
        env=None if env is None else dict(env),
    )
    process = asyncio.subprocess.Process(transport, protocol, loop)
    stdout_transport = transport.get_pipe_transport(1)
    assert stdout_transport is not None
    log.info("agent started", pid=process.pid, argv=list(argv))
    return AgentProcess(process, stdout_transport, limit=limit, grace=grace)
