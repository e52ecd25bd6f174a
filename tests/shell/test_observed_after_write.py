"""A message relayed as it is read is observed before or after its bytes are written, as asked.

A real link in this process: both peers are pipes of the test (the Client's stdin and stdout, the
Agent's). The test's observer looks, when it hears that a request was relayed, at what the Agent's
end of its pipe holds at that moment: the request's bytes once written, nothing before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest
from harness import TIMEOUT, request

from proxy.core.events import Direction, Side
from proxy.core.observations import Observation, Relayed
from proxy.core.relay import Relay
from proxy.shell.link import Link
from proxy.shell.observers import Fanout, Tally
from proxy.shell.transports.stdio import LineStream, open_client_stdio

LIMIT = 1024 * 1024


class PipePeeker:
    """An observer that reads, when a request to the Agent is observed, what the Agent's end of
    its pipe holds then (non-blocking: empty when nothing was written yet), by the request's
    original id."""

    def __init__(self, agent_reads: int) -> None:
        self._agent_reads = agent_reads
        self.found: dict[bytes, asyncio.Future[bytes]] = {}

    def when(self, request_id: bytes) -> asyncio.Future[bytes]:
        """What the pipe held when the request ``request_id`` was observed."""
        return self.found.setdefault(request_id, asyncio.get_running_loop().create_future())

    def observe(self, observation: Observation, link: int | None = None) -> None:
        if not isinstance(observation, Relayed) or observation.direction is not Direction.TO_AGENT:
            return
        try:
            held = os.read(self._agent_reads, 1 << 16)
        except BlockingIOError:
            held = b""
        assert observation.original_id is not None
        self.when(observation.original_id).set_result(held)


async def stream(reading: int, writing: int) -> LineStream:
    """A peer's endpoint over the test's pipes (the descriptors are the endpoint's from here)."""
    endpoint = await open_client_stdio(limit=LIMIT, stdin=reading, stdout=writing)
    os.close(reading)
    os.close(writing)
    return endpoint


@contextlib.asynccontextmanager
async def running_link(observe_after_write: bool) -> AsyncIterator[tuple[int, PipePeeker]]:
    """A running link: the Client's writing end, and the observer peeking at the Agent's pipe."""
    client_writes, proxy_reads_client = os.pipe()[::-1]
    client_reads, proxy_writes_client = os.pipe()
    agent_reads, proxy_writes_agent = os.pipe()
    agent_writes, proxy_reads_agent = os.pipe()[::-1]
    os.set_blocking(agent_reads, False)
    peeker = PipePeeker(agent_reads)
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
        yield client_writes, peeker
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
    async with running_link(after) as (client_writes, peeker):
        # The first is relayed by the reading task, the link's start (its write waits for the
        # end of the loop's turn); the next as it is read, the link running.
        os.write(client_writes, request(7, "_test/ping") + b"\n")
        await asyncio.wait_for(peeker.when(b"7"), TIMEOUT)
        os.write(client_writes, request(8, "_test/ping") + b"\n")
        held = await asyncio.wait_for(peeker.when(b"8"), TIMEOUT)
    forwarded = request(1, "_test/ping") + b"\n"  # under the proxy's id, whole
    assert held.endswith(forwarded) is after
