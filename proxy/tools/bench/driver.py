"""The bench's Client for the timed workloads: blocking reads and writes on a target's pipes, in a
thread of its own, so that the Client is never what the bench measures (DESIGN 11).

An asyncio Client pays an event-loop turn, a ``readline`` and a future per message: on a 2-core
machine it reads a ``session/update`` stream slower than the proxy relays it, and the bench then
measures its own consumer. :class:`BlockingPeer` writes each request with one ``os.write`` and
reads with ``os.read`` a MiB at a time, counting lines with ``bytes.count`` (C, not a Python
loop per line); a round trip is timed from just before the write to just after its answer's
line is complete. The run's event loop waits on the thread (:func:`asyncio.to_thread`), idle.

The ``direct`` target shows the headroom: a Client that is not the bottleneck reads the stream
from the bench Agent several times faster than through any relay (the "Client headroom" check).

The pipes are non-blocking and every wait goes through :func:`select.poll` with
:data:`~proxy.tools.bench.processes.ANSWER_TIMEOUT`, so a target that stops reading or answering
is a :class:`~proxy.tools.bench.processes.BenchError`, never a hung bench.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from proxy.tools.bench.messages import READ_LIMIT, STREAM_METHOD, UPDATE_MARK
from proxy.tools.bench.processes import ANSWER_TIMEOUT, BenchError, request_line

__all__ = ["BlockingPeer", "check_answer"]

READ_SIZE = 1 << 20
"""Bytes asked of one ``os.read``."""


class BlockingPeer:
    """One spawned process tree, driven as a Client with blocking I/O (see the module)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self._out = self.process.stdin.fileno()
        self._in = self.process.stdout.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        self._buffer = bytearray()
        self._next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        """A request with the next id, as the line to write; its id."""
        self._next_id += 1
        return self._next_id, request_line(self._next_id, method, params)

    def call(self, method: str, params: dict[str, Any]) -> float:
        """One round trip; its duration in seconds (the line encoded before the clock starts)."""
        request_id, data = self.request(method, params)
        start = time.perf_counter()
        self._write(data)
        line = self._line()
        elapsed = time.perf_counter() - start
        check_answer(line, request_id)
        return elapsed

    def send(self, data: bytes) -> None:
        """Write ``data`` (lines from :meth:`request`) whole."""
        self._write(data)

    def answer(self, request_id: int) -> None:
        """Read the next line: the answer to ``request_id``, else a :class:`BenchError`."""
        check_answer(self._line(), request_id)

    def stream(self, count: int) -> tuple[int, float]:
        """Ask for ``count`` notifications; the count received and the seconds until the answer
        that follows them was read (the lines are counted as they come, checked after)."""
        request_id, data = self.request(STREAM_METHOD, {"count": count})
        start = time.perf_counter()
        self._write(data)
        chunks = [bytes(self._buffer)]
        self._buffer.clear()
        lines = chunks[0].count(b"\n")
        while lines <= count:
            chunk = self._read()
            chunks.append(chunk)
            lines += chunk.count(b"\n")
        elapsed = time.perf_counter() - start
        stream = b"".join(chunks)
        if lines != count + 1 or not stream.endswith(b"\n"):
            raise BenchError(f"asked for {count} notifications and an answer, got {lines} lines")
        answer_at = stream.rfind(b"\n", 0, len(stream) - 1) + 1
        check_answer(stream[answer_at:], request_id)
        received = stream.count(UPDATE_MARK, 0, answer_at)
        if received != count:
            raise BenchError(f"asked for {count} notifications, got {received}")
        return received, elapsed

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._out, view) :]
            except BlockingIOError:
                self._wait(self._out, select.POLLOUT, "to read its input")
            except BrokenPipeError:
                raise BenchError(f"the target closed its stdin{self.stderr_tail()}") from None

    def _read(self) -> bytes:
        while True:
            try:
                chunk = os.read(self._in, READ_SIZE)
            except BlockingIOError:
                self._wait(self._in, select.POLLIN, "to answer")
                continue
            if not chunk:
                raise BenchError(f"the target closed its stdout{self.stderr_tail()}")
            return chunk

    def _line(self) -> bytes:
        """The next line, read as far as needed."""
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            if searched > READ_LIMIT:
                raise BenchError(f"a line longer than {READ_LIMIT} bytes from the target")
            self._buffer += self._read()
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        return line

    def _wait(self, fd: int, event: int, what: str) -> None:
        poller = select.poll()
        poller.register(fd, event)
        if not poller.poll(ANSWER_TIMEOUT * 1000):
            raise BenchError(f"the target took over {ANSWER_TIMEOUT} s {what}{self.stderr_tail()}")

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        return f"; its stderr ends: {tail}" if tail else ""

    def close(self) -> None:
        """Close its stdin and wait for it to exit (SIGKILL after 10 s)."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()
            self._stderr.close()


def check_answer(data: bytes, request_id: int) -> None:
    """``data`` (a line, or a WebSocket message) must be the result of ``request_id``."""
    message = json.loads(data)
    if not isinstance(message, dict) or message.get("id") != request_id:
        raise BenchError(f"expected the answer to {request_id}, got {data[:200]!r}")
    if "result" not in message:
        raise BenchError(f"request {request_id} failed: {data[:200]!r}")
