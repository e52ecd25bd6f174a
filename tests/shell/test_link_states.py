"""Every action on a link is safe in every state of the link, and none leaves a task or coroutine.

A real link in this process (the Client's stdin and stdout are pipes of the test, the Agent the
scripted raw Agent, spawned) is driven to each state of its life, and there it is given each
action the control API and a shutdown can give it: ``sever``, ``kill_agent`` (with and without
``respawn``), a restart of its Agent, ``sever_all`` (a restart of the whole proxy), ``shutdown``,
``abort``. The states: *new* (made, not running yet), *running*, *restarting* (the Agent is
being replaced: no Agent yet), *ending* (its last task is done and its task group finished, but
:meth:`Link.run` has not returned: reached through the link's ``on_ended`` hook, which is called
right then), *ended* (:meth:`Link.run` returned). Each must neither raise nor make a coroutine
nobody awaits (the suite turns that warning into an error), and the link must still end, its
Agent reaped.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import TIMEOUT, raw_agent, request

from proxy.core.commands import Restart, Sever, SignalAgent
from proxy.core.events import Side
from proxy.core.relay import Relay
from proxy.shell.link import Link, LinkState
from proxy.shell.observers import Fanout, Tally
from proxy.shell.transports.stdio import AgentProcess, open_client_stdio, spawn_agent

LIMIT = 1024 * 1024
KILL = 9
GRACE = 5.0


def sever(link: Link) -> None:
    link.inject([Sever(Side.CLIENT, flush=False), Sever(Side.AGENT, flush=False)])


def kill_agent(link: Link) -> None:
    link.inject([SignalAgent(KILL, respawn=False)])


def kill_agent_respawn(link: Link) -> None:
    link.inject([SignalAgent(KILL, respawn=True)])


def restart(link: Link) -> None:
    link.inject([Restart(0.0)])


def twice(action: Callable[[Link], None]) -> Callable[[Link], None]:
    """The action given twice at once (two restarts, two severs...)."""

    def both(link: Link) -> None:
        action(link)
        action(link)

    return both


ACTIONS: dict[str, Callable[[Link], None]] = {
    "sever": sever,
    "kill_agent": kill_agent,
    "kill_agent_respawn": kill_agent_respawn,
    "restart": restart,
    "two_restarts": twice(restart),
    "sever_all": Link.sever_all,
    "two_sever_alls": twice(Link.sever_all),
    "shutdown": Link.shutdown,
    "abort": Link.abort,
}


@dataclass
class Running:
    """A link of this test, its Client's pipes and the Agents it spawned."""

    link: Link
    to_proxy: int
    """The Client's writing end (-1 once the Client has left)."""
    from_proxy: asyncio.StreamReader
    """What the Client reads."""
    agents: list[AgentProcess]
    runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.runner = asyncio.get_running_loop().create_task(self.link.run())

    def client_leaves(self) -> None:
        if self.to_proxy >= 0:
            os.close(self.to_proxy)
            self.to_proxy = -1

    async def ends(self) -> None:
        """The Client leaves; the link must end within TIMEOUT, every Agent reaped."""
        self.client_leaves()
        assert self.runner is not None
        await asyncio.wait_for(self.runner, TIMEOUT)
        assert self.link.state is LinkState.ENDED
        for agent in self.agents:
            await asyncio.wait_for(agent.process.wait(), TIMEOUT)


MakeLink = Callable[..., Awaitable[Running]]


@pytest.fixture
async def make_link(tmp_path: Path) -> AsyncIterator[MakeLink]:
    """Make links (not started); at the end, whatever is left is cut and reaped."""
    made: list[tuple[Running, asyncio.BaseTransport]] = []
    loop = asyncio.get_running_loop()

    async def make(on_ended: Callable[[Link], None] | None = None) -> Running:
        to_proxy_read, to_proxy_write = os.pipe()
        from_proxy_read, from_proxy_write = os.pipe()
        client = await open_client_stdio(limit=LIMIT, stdin=to_proxy_read, stdout=from_proxy_write)
        os.close(to_proxy_read)
        os.close(from_proxy_write)
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_proxy_read, "rb", 0)
        )
        agents: list[AgentProcess] = []

        async def connect() -> AgentProcess:
            agent = await spawn_agent(raw_agent(tmp_path / "agent.jsonl"), limit=LIMIT, grace=GRACE)
            agents.append(agent)
            return agent

        link = Link(
            lambda _cached: Relay(),
            {Side.CLIENT: client, Side.AGENT: await connect()},
            Fanout([Tally()]),
            connect_agent=connect,
            on_ended=on_ended,
        )
        running = Running(link, to_proxy_write, reader, agents)
        made.append((running, transport))
        return running

    try:
        yield make
    finally:
        for running, transport in made:
            running.client_leaves()
            if running.runner is not None and not running.runner.done():
                running.link.abort()
                await asyncio.wait_for(asyncio.shield(running.runner), TIMEOUT)
            for agent in running.agents:
                agent.signal(KILL)
                await asyncio.wait_for(agent.process.wait(), TIMEOUT)
            transport.close()


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_on_a_new_link_waits_for_it_to_run(
    make_link: MakeLink, action: str
) -> None:
    running = await make_link()
    ACTIONS[action](running.link)
    assert running.link.state is LinkState.NEW
    running.start()
    await running.ends()


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_on_a_running_link(make_link: MakeLink, action: str) -> None:
    running = await make_link()
    running.start()
    os.write(running.to_proxy, request(1, "_test/ping") + b"\n")
    ACTIONS[action](running.link)
    await running.ends()


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_while_the_agent_is_being_replaced(
    make_link: MakeLink, action: str
) -> None:
    running = await make_link()
    running.start()
    running.link.inject([Restart(3600.0)])  # no Agent for an hour, unless the link stops
    assert running.link.endpoints[Side.AGENT] is running.agents[0]
    ACTIONS[action](running.link)
    running.link.shutdown()  # ends the downtime: no new Agent is started
    await running.ends()


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_while_the_link_shuts_down(make_link: MakeLink, action: str) -> None:
    running = await make_link()
    running.start()
    running.link.shutdown()
    ACTIONS[action](running.link)
    await running.ends()
    assert len(running.agents) == 1  # a restart during the shutdown started no new Agent


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_on_an_ending_link_is_refused_quietly(
    make_link: MakeLink, action: str
) -> None:
    """In ``on_ended`` the link's task group has finished and ``run`` has not returned: the
    window in which ``restart_proxy`` used to start a task on a finished group (a 500, and a
    coroutine never awaited)."""
    seen: list[bool] = []

    def on_ended(link: Link) -> None:
        assert running.runner is not None
        seen.append(running.runner.done())
        ACTIONS[action](link)

    running = await make_link(on_ended)
    running.start()
    await running.ends()
    assert seen == [False]
    assert len(running.agents) == 1  # nothing was respawned


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_on_an_ended_link_is_refused_quietly(
    make_link: MakeLink, action: str
) -> None:
    running = await make_link()
    running.start()
    await running.ends()
    ACTIONS[action](running.link)
    assert running.link.inject([Sever(Side.AGENT, flush=False)]) is False
    assert len(running.agents) == 1


async def test_a_new_client_cannot_attach_to_an_ended_link(
    make_link: MakeLink, tmp_path: Path
) -> None:
    running = await make_link()
    running.start()
    await running.ends()
    read_end, write_end = os.pipe()
    client = await open_client_stdio(limit=LIMIT, stdin=read_end, stdout=write_end)
    os.close(read_end)
    os.close(write_end)
    assert running.link.attach_client(client) is False
    client.sever(flush=False)
    await asyncio.wait_for(client.wait_closed(), TIMEOUT)


async def test_a_link_runs_once(make_link: MakeLink) -> None:
    running = await make_link()
    running.start()
    await running.ends()
    with pytest.raises(RuntimeError, match="has already run"):
        await running.link.run()


async def test_the_answer_still_flows_after_an_action_on_a_new_link(make_link: MakeLink) -> None:
    """A restart asked of a link not yet running is carried out once it runs: the Client's
    request reaches the new Agent and is answered."""
    running = await make_link()
    restart(running.link)
    running.start()
    os.write(running.to_proxy, request(7, "_test/after") + b"\n")
    answer = json.loads(await asyncio.wait_for(running.from_proxy.readline(), TIMEOUT))
    assert answer["id"] == 7
    assert answer["result"]["method"] == "_test/after"
    assert len(running.agents) == 2
    await running.ends()
