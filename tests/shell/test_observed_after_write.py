"""A message relayed as it is read is observed before or after its bytes are written, as asked.

A real link in this process: both peers are pipes of the test (the Client's stdin and stdout, the
Agent's). The test's observer looks, when it hears that messages were relayed, at what the
receiving peer's end of its pipe holds at that moment: their bytes once written, nothing before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from harness import TIMEOUT, notification, request

from proxy.core.events import Direction, Side
from proxy.core.observations import Observation, Relayed, RelayedRun
from proxy.core.relay import Relay
from proxy.shell.link import Link
from proxy.shell.observers import Fanout, Tally
from proxy.shell.transports.stdio import LineStream, open_client_stdio

LIMIT = 1024 * 1024
UPDATES = 5


class PipePeeker:
    """An observer that reads, when it hears of a relayed request (by its original id) or of a
    run of notifications (``b"run"``), what the receiving peer's end of its pipe holds then
    (non-blocking: empty when nothing was written yet)."""

    def __init__(self, reads: dict[Direction, int]) -> None:
        self._reads = reads
        self._found: dict[bytes, asyncio.Future[bytes]] = {}

    def when(self, key: bytes) -> asyncio.Future[bytes]:
        """What the pipe held when the request ``key`` (or the run) was observed."""
        return self._found.setdefault(key, asyncio.get_running_loop().create_future())

    def observe(self, observation: Observation, link: int | None = None) -> None:
        if isinstance(observation, Relayed) and observation.original_id is not None:
            self.when(observation.original_id).set_result(self._peek(observation.direction))
        elif isinstance(observation, RelayedRun):
            self.when(b"run").set_result(self._peek(observation.direction))

    def _peek(self, direction: Direction) -> bytes:
        try:
            return os.read(self._reads[direction], 1 << 16)
        except BlockingIOError:
            return b""


@dataclass
class Peers:
    """The test's ends of the pipes: what the Client and the Agent write, and the peeker."""

    client_writes: int
    agent_writes: int
    peeker: PipePeeker


async def stream(reading: int, writing: int) -> LineStream:
    """A peer's endpoint over the test's pipes (the descriptors are the endpoint's from here)."""
    endpoint = await open_client_stdio(limit=LIMIT, stdin=reading, stdout=writing)
    os.close(reading)
    os.close(writing)
    return endpoint


@contextlib.asynccontextmanager
async def running_link(observe_after_write: bool) -> AsyncIterator[Peers]:
    """A running link between two peers that are pipes of the test."""
    proxy_reads_client, client_writes = os.pipe()
    client_reads, proxy_writes_client = os.pipe()
    agent_reads, proxy_writes_agent = os.pipe()
    proxy_reads_agent, agent_writes = os.pipe()
    for fd in (agent_reads, client_reads):
        os.set_blocking(fd, False)
    peeker = PipePeeker({Direction.TO_AGENT: agent_reads, Direction.TO_CLIENT: client_reads})
    link = Link(
        lambda _cached: Relay(),
        {
            Side.CLIENT: await stream(proxy_reads_client, proxy_writes_client),
            Side.AGENT: await stream(proxy_reads_agent, proxy_writes_agent),
        },
        Fanout([Tally(), peeker]),
        observe_after_write=observe_after_write,
    )
    runner = asyncio.get_running_loop().create_task(link.run())
    try:
        # The first message is relayed by the reading task, the link's start (its write waits
        # for the end of the loop's turn); those after it as they are read, the link running.
        os.write(client_writes, request("first", "_test/ping") + b"\n")
        await asyncio.wait_for(peeker.when(b'"first"'), TIMEOUT)
        yield Peers(client_writes, agent_writes, peeker)
    finally:
        link.abort()
        await asyncio.wait_for(runner, TIMEOUT)
        for fd in (client_writes, client_reads, agent_reads, agent_writes):
            os.close(fd)


@pytest.mark.parametrize("after", [True, False], ids=["after-write", "before-write"])
async def test_a_relayed_request_is_observed_after_or_before_its_write(after: bool) -> None:
    """With ``observe_after_write`` the observers hear of a request once the Agent can read it
    (a round trip does not wait for them); without it (a trace file must never lag the wire),
    they hear of it first, when nothing is written yet."""
    async with running_link(after) as peers:
        os.write(peers.client_writes, request(8, "_test/ping") + b"\n")
        held = await asyncio.wait_for(peers.peeker.when(b"8"), TIMEOUT)
    forwarded = request(1, "_test/ping") + b"\n"  # under the proxy's id, whole
    assert held.endswith(forwarded) is after


@pytest.mark.parametrize("after", [True, False], ids=["after-write", "before-write"])
async def test_notifications_read_together_are_observed_after_or_before_their_write(
    after: bool,
) -> None:
    """The notifications of one read go on as one run, in one write: observed after it, with
    ``observe_after_write``, or before it."""
    updates = [notification("session/update", {"sessionId": "s", "n": n}) for n in range(UPDATES)]
    async with running_link(after) as peers:
        os.write(peers.agent_writes, b"".join(line + b"\n" for line in updates))
        held = await asyncio.wait_for(peers.peeker.when(b"run"), TIMEOUT)
    assert (held == b"".join(line + b"\n" for line in updates)) is after
