"""A proxy a tool runs as a listener (``acp-proxy run --listen URL ...``): started, its URL read
from its ``listening`` log line, its stderr copied into a log file, stopped.

``check-agent`` runs one for the traces that reconnect, ``check-client`` for a network Client.
The proxy's log lines (JSON, on stderr) go to the file, never to the tool's user; a line can be
watched as it passes (``on_line``). The proxy is spawned as an Agent is (SIGINT and SIGTERM at
their defaults, dead with the tool's thread on Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
from collections.abc import Callable, Sequence
from typing import IO

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.shell.transports.stdio import in_child, send_signal

__all__ = ["PROXY_START_TIMEOUT", "PROXY_STOP_TIMEOUT", "ListeningProxy", "NotListening"]

PROXY_START_TIMEOUT = 30.0
"""Seconds a listening proxy has to say where it listens."""
PROXY_STOP_TIMEOUT = 10.0
"""Seconds a listening proxy has to finish (its trace, its state) and exit after SIGTERM."""


class NotListening(Exception):
    """The proxy exited, or did not listen in time (it was killed): the message says which."""


class ListeningProxy:
    """A proxy listening for a tool, and the copy of its stderr into a log file."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        url: str,
        log: IO[bytes],
        on_line: Callable[[bytes], None] | None,
    ) -> None:
        self.process = process
        self.url = url
        assert process.stderr is not None
        self._copying = asyncio.get_running_loop().create_task(
            self._copy(process.stderr, log, on_line)
        )

    @classmethod
    async def start(
        cls,
        command: Sequence[str],
        log: IO[bytes],
        on_line: Callable[[bytes], None] | None = None,
    ) -> ListeningProxy:
        """Start ``command`` (an ``acp-proxy run --listen ... --log-format json`` with at least
        ``info`` logs) and return once it said where it listens; :class:`NotListening` when it
        exits first or takes longer than :data:`PROXY_START_TIMEOUT` (then it is killed). ``log``
        gets every line of its stderr, and is closed with it."""
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, limit=DEFAULT_MAX_MESSAGE_BYTES,
            preexec_fn=functools.partial(in_child, os.getpid()),
        )  # fmt: skip
        assert process.stderr is not None
        last = ""  # its last words: why it did not start
        try:
            async with asyncio.timeout(PROXY_START_TIMEOUT):
                while True:
                    line = await process.stderr.readline()
                    log.write(line)
                    if not line:
                        why = f": {last}" if last else ""
                        raise NotListening(f"the proxy did not start{why}")
                    last = _said(line) or last
                    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                        record = json.loads(line)
                        if record.get("event") == "listening":
                            return cls(process, str(record["url"]), log, on_line)
        except (NotListening, TimeoutError) as exc:
            log.close()
            send_signal(process, signal.SIGKILL)
            await process.wait()
            what = str(exc) or f"the proxy did not listen within {PROXY_START_TIMEOUT:g} s"
            raise NotListening(what) from None

    @staticmethod
    async def _copy(
        stream: asyncio.StreamReader, into: IO[bytes], on_line: Callable[[bytes], None] | None
    ) -> None:
        """The rest of the proxy's stderr, into its log file."""
        with into:
            while line := await stream.readline():
                into.write(line)
                if on_line is not None:
                    on_line(line)

    async def stop(self) -> None:
        """SIGTERM (the proxy finishes its trace), SIGKILL after :data:`PROXY_STOP_TIMEOUT`;
        once it has exited, the rest of its stderr is copied."""
        if self.process.returncode is None:
            send_signal(self.process, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), PROXY_STOP_TIMEOUT)
            except TimeoutError:
                send_signal(self.process, signal.SIGKILL)
        await self.process.wait()
        await self._copying  # ends with the proxy's stderr


def _said(line: bytes) -> str:
    """What a line of the proxy's stderr says, for a reason: a JSON log line's event and error,
    else the text (cut to 300 characters)."""
    text = line.decode(errors="replace").strip()
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        record = json.loads(text)
        if isinstance(record, dict) and "event" in record:
            text = str(record["event"]) + (f" ({record['error']})" if "error" in record else "")
    return text.removeprefix("acp-proxy: ")[:300]
