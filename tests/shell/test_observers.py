"""Observers and when they observe: :class:`~proxy.shell.observers.Fanout`'s deferral.

Relaying a message as it arrives, the link lets the observers that need not see a message before
its peer (the ledger, the metrics) observe it once it is written, and the trace before: first
the fan-out alone, then a link over real pipes and a real Agent process, whose Client end the
observers read as they observe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import ClassVar

from harness import TIMEOUT, raw_agent, request

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind
from proxy.core.observations import Check, Finding, Observation, Relayed
from proxy.core.relay import Relay
from proxy.shell.link import Link
from proxy.shell.observers import Fanout
from proxy.shell.transports.stdio import open_client_stdio, spawn_agent

LIMIT = 1024 * 1024


def relayed(number: int) -> Relayed:
    number_bytes = str(number).encode()
    return Relayed(
        direction=Direction.TO_CLIENT,
        kind=Kind.RESPONSE,
        method=None,
        session=None,
        size=1,
        original_id=number_bytes,
        forwarded_id=number_bytes,
    )


class Seen:
    """Records what it observes, and the order across observers (``log``)."""

    def __init__(self, name: str, log: list[tuple[str, Observation]]) -> None:
        self.name = name
        self.log = log

    def observe(self, observation: Observation, link: int | None = None) -> None:
        self.log.append((self.name, observation))


class Early(Seen):
    before_delivery: ClassVar[bool] = True


def test_without_deferring_every_observer_observes_at_once_in_order() -> None:
    log: list[tuple[str, Observation]] = []
    fanout = Fanout([Seen("a", log), Early("t", log), Seen("b", log)])
    fanout.observe(relayed(1))
    assert [name for name, _ in log] == ["a", "t", "b"]


def test_deferring_the_early_observe_at_once_the_others_at_catch_up_in_order() -> None:
    log: list[tuple[str, Observation]] = []
    fanout = Fanout([Seen("a", log), Early("t", log)])
    fanout.defer()
    first, second = relayed(1), relayed(2)
    fanout.observe(first)
    fanout.observe(second)
    assert log == [("t", first), ("t", second)]
    fanout.catch_up()
    assert log[2:] == [("a", first), ("a", second)]
    fanout.observe(relayed(3))  # still deferring after a catch-up
    assert [name for name, _ in log[4:]] == ["t"]
    fanout.resume()
    assert [name for name, _ in log[5:]] == ["a"]
    fanout.observe(relayed(4))  # resumed: all at once again
    assert [name for name, _ in log[6:]] == ["a", "t"]


def test_what_an_observer_emits_while_catching_up_reaches_every_observer_at_once() -> None:
    """The ledger emits a finding when it observes a message: every observer has the finding
    then, the trace after the message it is about."""
    log: list[tuple[str, Observation]] = []
    finding = Finding(check=Check.DUPLICATE_INSERT, session="s", key="k", detail="detail")
    fanout = Fanout([])

    class Emitting(Seen):
        def observe(self, observation: Observation, link: int | None = None) -> None:
            super().observe(observation, link)
            if isinstance(observation, Relayed):
                fanout.observe(finding, link)

    fanout.extend([Emitting("ledger", log), Early("trace", log)])
    fanout.defer()
    message = relayed(1)
    fanout.observe(message)
    fanout.resume()
    assert log == [
        ("trace", message),
        ("ledger", message),
        ("ledger", finding),
        ("trace", finding),
    ]


class Reading(Seen):
    """At each answer to the Client, reads what the Client has been written so far."""

    def __init__(self, name: str, log: list[tuple[str, Observation]], fd: int) -> None:
        super().__init__(name, log)
        self.fd = fd
        self.had: dict[str, bool] = {}
        """Per answer's id: whether its bytes were on the Client's pipe when observed."""
        self.received = b""
        self.answered = asyncio.Event()

    def observe(self, observation: Observation, link: int | None = None) -> None:
        if isinstance(observation, Relayed) and observation.direction is Direction.TO_CLIENT:
            with contextlib.suppress(BlockingIOError):  # nothing written yet
                self.received += os.read(self.fd, 65536)
            answered = observation.original_id
            assert answered is not None
            ids = {json.loads(line)["id"] for line in self.received.splitlines()}
            self.had[answered.decode()] = json.loads(answered) in ids
            self.answered.set()


class ReadingEarly(Reading):
    before_delivery: ClassVar[bool] = True


async def test_a_link_relaying_as_it_reads_lets_the_late_observers_observe_once_written(
    tmp_path: Path,
) -> None:
    """Each ping answered while nothing else is in flight is relayed as it arrives: the trace's
    kind of observer has its answer before the Client's pipe does, the ledger's kind after."""
    to_proxy_read, to_proxy_write = os.pipe()
    from_proxy_read, from_proxy_write = os.pipe()
    os.set_blocking(from_proxy_read, False)
    client = await open_client_stdio(limit=LIMIT, stdin=to_proxy_read, stdout=from_proxy_write)
    os.close(to_proxy_read)
    os.close(from_proxy_write)
    agent = await spawn_agent(raw_agent(tmp_path / "agent.jsonl"), limit=LIMIT, grace=5.0)
    log: list[tuple[str, Observation]] = []
    late = Reading("ledger", log, from_proxy_read)
    early = ReadingEarly("trace", log, os.dup(from_proxy_read))
    link = Link(
        lambda _cached: Relay(),
        {Side.CLIENT: client, Side.AGENT: agent},
        Fanout([late, early]),
    )
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(link.run())
            try:
                for number in range(1, 6):
                    late.answered.clear()
                    os.write(to_proxy_write, request(number, "_test/ping") + b"\n")
                    await asyncio.wait_for(late.answered.wait(), TIMEOUT)
            finally:
                os.close(to_proxy_write)  # the Client leaves: the link ends
        # The first answers may go through the link's reading task (it starts as they come).
        later = [str(number) for number in range(3, 6)]
        assert [late.had[number] for number in later] == [True] * 3
        assert [early.had[number] for number in later] == [False] * 3
    finally:
        await asyncio.wait_for(agent.process.wait(), TIMEOUT)
        os.close(from_proxy_read)
        os.close(early.fd)
