"""``acp-proxy replay client FILE -- AGENT_CMD`` (or ``--connect URL``): the recorded Client
against a live Agent, and where the Agent's answers differ from the recording.

Each recorded link is played on a connection of its own (a new Agent process over stdio), in
order. The Client's messages go out as recorded (their own ids, byte for byte), but for the ids
and session ids this Agent chose: an answer to a request of the Agent takes the id this Agent
gave that request, a recorded session id becomes the one this Agent answered ``session/new``
with. Before each, what the Agent sent before it in the recording is waited for
(``--timeout`` each): an answer by its id, a notification or a request of the Agent as the next
unread one of its method. An Agent that ends or stays silent before answering ``initialize`` is
not replayed against (exit 2, why in one line); once it is gone nothing more is waited for, and
after a timeout the next messages are not waited for either until the Agent sends something or
is asked something new (a silent Agent costs one ``--timeout`` per unanswered request, not per
message). Each is compared with its recorded counterpart
(:func:`proxy.core.matching.differences`: ids, session and message ids, keys, times, cwd and the
``--ignore`` paths aside; a value the recording redacted matches what comes there); one that
never comes, and one the Agent sent that the recording does not have, are differences too. At
the recorded pace (``--speed``; 0: as soon as what comes first has come).

Exit 0 when nothing differs, 1 when something does (each difference on a line of stdout: the
recorded line, the method, the path, the recorded value, the new one; ``--json``: one object),
2 when the recording cannot be used or the Agent cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.core import acp
from proxy.core.errors import at_least
from proxy.core.events import Direction
from proxy.core.jsonrpc import Kind, Message, parse
from proxy.core.matching import MISSING, Difference, Ignore, differences
from proxy.core.recording import Recorded, RecordingError
from proxy.core.splice import splice
from proxy.shell.defaults import AGENT_EXIT_WAIT, DEFAULT_MAX_MESSAGE_BYTES, MIN_TIMEOUT
from proxy.shell.endpoint import Endpoint, ExitReporter, Signalable
from proxy.shell.log import get_logger
from proxy.tools.lab.client.connection import Failure, open_endpoint
from proxy.tools.lab.client.options import check_reach
from proxy.tools.replay.agent import EXIT_BAD_RECORDING
from proxy.tools.replay.files import load_replayable

__all__ = ["Found", "ReplayClientOptions", "replay_client", "replay_client_main"]

log = get_logger("proxy.replay")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayClientOptions:
    """What ``acp-proxy replay client`` replays, against which Agent."""

    recording: Path
    agent_argv: tuple[str, ...] = ()
    connect: str | None = None
    ignore: tuple[str, ...] = ()
    speed: float = 0.0
    timeout: float = 10.0
    """Seconds to wait for each message the recording says the Agent sent."""
    grace: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls: ssl.SSLContext | None = None
    """How a ``wss://`` or ``https://`` Agent is verified (``--tls-ca``; None: the system's
    trust store)."""

    def __post_init__(self) -> None:
        check_reach(self.agent_argv, self.connect, self.tls)
        at_least("--speed", self.speed, 0)
        at_least("--timeout", self.timeout, MIN_TIMEOUT)
        Ignore(self.ignore)


@dataclass(frozen=True, slots=True)
class Found:
    """A difference between the recording and this run, at a recorded ``line`` (0: a message
    the recording does not have) of ``method`` (its request's, for an answer)."""

    line: int
    method: str | None
    difference: Difference

    def to_json(self) -> dict[str, Any]:
        """As JSON (``line`` null for a message the recording does not have)."""
        return {"line": self.line or None, "method": self.method, **self.difference.to_json()}

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "not recorded"
        path = self.difference.path or "(the message)"
        recorded, got = self.difference.recorded, self.difference.got
        return f"{where}: {self.method or '?'} {path}: recorded {_text(recorded)}, new {_text(got)}"


@dataclass(slots=True)
class _Report:
    compared: int = 0
    found: list[Found] = field(default_factory=list)


def _text(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = orjson.dumps(value, default=repr).decode()
    return text if len(text) <= 200 else text[:197] + "..."


def replay_client_main(options: ReplayClientOptions, *, as_json: bool = False) -> int:
    """``acp-proxy replay client``: the exit status (see the module)."""
    try:
        recording = load_replayable(options.recording)
    except RecordingError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_BAD_RECORDING
    try:
        report = asyncio.run(replay_client(options, recording.messages))
    except Failure as exc:
        sys.stderr.write(f"acp-proxy replay client: {exc}\n")
        return 2
    if as_json:
        out = {
            "compared": report.compared,
            "differences": [found.to_json() for found in report.found],
        }
        sys.stdout.write(orjson.dumps(out, default=repr).decode() + "\n")
    else:
        for found in report.found:
            sys.stdout.write(f"{found}\n")
        verdict = "same as recorded" if not report.found else f"{len(report.found)} differences"
        sys.stdout.write(f"{report.compared} messages of the Agent compared: {verdict}\n")
    return 1 if report.found else 0


async def replay_client(options: ReplayClientOptions, messages: list[Recorded]) -> _Report:
    """Play every recorded link against the Agent, one after the other."""
    report = _Report()
    links: dict[int, list[Recorded]] = {}
    for recorded in messages:
        links.setdefault(recorded.link, []).append(recorded)
    sessions: dict[str, str] = {}
    for link, played in links.items():
        if not any(r.direction is Direction.TO_AGENT for r in played):
            continue
        log.info("replaying a link", link=link, messages=len(played))
        endpoint = await open_endpoint(options, announce_exit=False)  # said here
        try:
            await _Link(options, endpoint, report, sessions).play(played)
        except Failure:
            if isinstance(endpoint, Signalable):
                endpoint.signal(signal.SIGTERM)  # it failed already: no grace for it
            raise
        finally:
            endpoint.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(endpoint.wait_closed(), options.grace + 1)
    return report


class _Link:
    """One recorded link played on one connection."""

    def __init__(
        self,
        options: ReplayClientOptions,
        endpoint: Endpoint,
        report: _Report,
        sessions: dict[str, str],
    ) -> None:
        self.options = options
        self.endpoint = endpoint
        self.report = report
        self.ignore = Ignore(options.ignore)
        self.sessions = sessions
        """Recorded session id -> this Agent's."""
        self.asked: dict[tuple[bytes, bytes], bytes] = {}
        """A recorded request of the Agent's pair -> the id this Agent gave it."""
        self.methods: dict[tuple[bytes, bytes], str | None] = {}
        """A recorded request of the Client's pair -> its method (for its answer's report)."""
        self.unread: list[Message] = []
        self.arrived = asyncio.Event()
        self.ended = False
        self.heard = False
        """The Agent sent something on this connection."""
        self.silent = False
        """A wait timed out, and the Agent has sent nothing since, nor been asked anything: the
        messages expected next are not waited for (one timeout per unanswered request)."""

    async def play(self, recorded: list[Recorded]) -> None:
        reader = asyncio.get_running_loop().create_task(self._read())
        try:
            await self._play(recorded)
        finally:
            gone = self.ended  # before the reader is stopped (which ends it too)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if gone:
            log.warning(f"{await self._why_ended()} during the replay of its link")
        for extra in self.unread:
            self.report.found.append(Found(0, extra.method, Difference("", MISSING, extra.body)))

    async def _play(self, recorded: list[Recorded]) -> None:
        loop = asyncio.get_running_loop()
        start, first = loop.time(), recorded[0].time
        speed = self.options.speed
        for message in recorded:
            if message.direction is Direction.TO_AGENT:
                if speed > 0:
                    wait = start + (message.time - first) / speed - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                self._send(message)
            else:
                await self._expect(message)

    def _send(self, recorded: Recorded) -> None:
        message = recorded.message
        raw = message.raw
        if message.kind is Kind.REQUEST:
            self.methods[recorded.pair] = message.method
            self.silent = False  # a new question: worth a wait again
        elif message.kind in (Kind.RESPONSE, Kind.ERROR):
            live = self.asked.get(recorded.pair)
            if live is not None:
                raw = splice(raw, [(span, live) for span in message.id_spans])
        for old, new in self.sessions.items():
            if old != new:
                raw = raw.replace(orjson.dumps(old), orjson.dumps(new))
        self.endpoint.send(raw)

    async def _expect(self, recorded: Recorded) -> None:
        message = recorded.message
        method = message.method
        if message.kind in (Kind.RESPONSE, Kind.ERROR):
            method = self.methods.get(recorded.pair)
        live = await self._wait_for(recorded)
        if live is None and method == acp.INITIALIZE and not self.heard:
            if not self.ended:
                timeout = self.options.timeout
                raise Failure(f"the agent did not answer {method} within {timeout:g} s")
            raise Failure(f"{await self._why_ended()} before answering {method}")
        self.report.compared += 1
        if live is None:
            self.report.found.append(
                Found(recorded.line, method, Difference("", message.body, MISSING))
            )
            return
        found, _ = differences(message.body, live.body, self.ignore, redacted=recorded.redacted)
        self.report.found.extend(Found(recorded.line, method, d) for d in found)
        if message.kind is Kind.REQUEST and live.id_token is not None:
            self.asked[recorded.pair] = live.id_token
        self._learn_session(message, live)

    def _learn_session(self, recorded: Message, live: Message) -> None:
        before, after = recorded.body.get("result"), live.body.get("result")
        if isinstance(before, dict) and isinstance(after, dict):
            old, new = before.get("sessionId"), after.get("sessionId")
            if isinstance(old, str) and isinstance(new, str):
                self.sessions[old] = new

    async def _why_ended(self) -> str:
        """Why the connection ended: the Agent exited (with what status), or closed it."""
        if isinstance(self.endpoint, ExitReporter):
            failure = await self.endpoint.failure(AGENT_EXIT_WAIT)
            if failure is not None:
                return failure
        return "the agent closed the connection"

    async def _wait_for(self, recorded: Recorded) -> Message | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0.0 if self.silent else self.options.timeout)
        while True:
            for index, live in enumerate(self.unread):
                if _corresponds(recorded, live):
                    del self.unread[index]
                    return live
            if self.ended:
                return None
            self.arrived.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self.arrived.wait()
            except TimeoutError:
                self.silent = True
                return None

    async def _read(self) -> None:
        try:
            while (received := await self.endpoint.receive()) is not None:
                raw = received if isinstance(received, bytes) else getattr(received, "raw", None)
                if not isinstance(raw, bytes):
                    continue
                message = parse(raw)
                if isinstance(message, Message):
                    self.unread.append(message)
                    self.heard = True
                    self.silent = False
                    self.arrived.set()
        except Exception as exc:  # a transport failing in any way ends the connection
            log.warning("reading from the agent failed", error=str(exc))
        finally:
            self.ended = True
            self.arrived.set()


def _corresponds(recorded: Recorded, live: Message) -> bool:
    """Whether ``live`` is the counterpart of ``recorded``: an answer to the same request (the
    Client's id, sent as recorded), or the same method for a notification or a request."""
    message = recorded.message
    if message.kind in (Kind.RESPONSE, Kind.ERROR):
        return live.kind in (Kind.RESPONSE, Kind.ERROR) and live.id_token == recorded.pair[0]
    return live.kind is message.kind and live.method == message.method
