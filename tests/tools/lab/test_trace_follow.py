"""Following a proxy's trace: which answers are lost, and when the proxy has nothing outstanding.

:class:`TraceState` is fed records shaped as the proxy writes them (see ``proxy/shell/trace.py``);
:class:`TraceFollower` reads a real file as it grows. The reference Client and the demo use both
(``tests/tools/lab/client/``, ``tests/tools/lab/test_demo.py``, against real proxies).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

from harness import TIMEOUT

from proxy.core import acp
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind
from proxy.core.observations import RestartWhat
from proxy.core.records import (
    TRACE_VERSION,
    ConnectionRecord,
    Disposition,
    FaultRecord,
    HeldRecord,
    MessageRecord,
    Record,
    RestartRecord,
    TraceHeader,
    encode,
)
from proxy.tools.lab.trace_follow import TraceFollower, TraceState


def header() -> Record:
    return TraceHeader(time=1.0, version=TRACE_VERSION)


def request(client_id: int, forwarded: int, link: int = 1, **extra: Any) -> Record:
    """A Client's prompt relayed to the Agent."""
    return MessageRecord(
        time=1.0,
        link=link,
        disposition=Disposition.RELAYED,
        direction=Direction.TO_AGENT,
        kind=Kind.REQUEST,
        method=acp.PROMPT,
        id=client_id,
        forwarded_id=forwarded,
        **extra,
    )


def answer(client_id: int, forwarded: int, disposition: str = "relayed", link: int = 1) -> Record:
    """The Agent's answer to it, relayed, dropped or swallowed by the proxy."""
    return MessageRecord(
        time=1.0,
        link=link,
        disposition=Disposition(disposition),
        direction=Direction.TO_CLIENT,
        kind=Kind.RESPONSE,
        method=acp.PROMPT,
        id=client_id,
        forwarded_id=forwarded,
    )


def fault(action: str, forwarded: int, link: int = 1) -> Record:
    """A rule acting on the answer the Agent sent with id ``forwarded``."""
    return FaultRecord(
        time=1.0,
        link=link,
        rule=action,
        action=action,
        direction=Direction.TO_CLIENT,
        kind=Kind.RESPONSE,
        method=acp.PROMPT,
        session=None,
        id=forwarded,
    )


def connection(state: Literal["open", "closed"], side: str, link: int = 1) -> Record:
    return ConnectionRecord(time=1.0, link=link, state=state, side=Side(side), transport="stdio")


def restart(what: RestartWhat, link: int = 1) -> Record:
    return RestartRecord(time=1.0, link=link, what=what, abandoned=1)


def fed(*records: Record) -> TraceState:
    state = TraceState()
    for record in records:
        state.feed(record)
    return state


def test_a_dropped_answer_is_lost_and_a_relayed_one_answered() -> None:
    state = fed(header(), request(3, 2), fault("drop", 2), answer(3, 2, "dropped"))
    assert (state.lost, state.answered) == ({3}, set())
    state.feed(request(4, 3))
    assert not state.quiet([])  # the retry is at the Agent
    state.feed(answer(4, 3))
    assert (state.lost, state.answered) == ({3}, {4})
    assert state.quiet([4])


def test_a_corrupted_answer_is_lost() -> None:
    """The Client cannot read it: the bytes relayed are no answer."""
    state = fed(header(), request(3, 2), fault("corrupt", 2), answer(3, 2))
    assert (state.lost, state.answered) == ({3}, set())
    assert state.quiet([])


def test_an_answer_dropped_with_the_agent_killed_is_not_lost_when_the_link_ends() -> None:
    """The proxy exits with its Agent: the Client's connection ends, which tells it; a resend
    before it would race the proxy going down."""
    state = fed(
        header(),
        request(5, 3),
        fault("drop", 3),
        fault("kill_agent", 3),
        answer(5, 3, "dropped"),
        connection("closed", "agent"),
    )
    assert state.lost == set()
    state.feed(connection("closed", "client"))
    assert state.lost == set()
    assert state.quiet([])


def test_an_answer_dropped_with_the_agent_respawned_is_lost_once_the_new_agent_is_up() -> None:
    """kill_agent with respawn keeps the Client's connection: a resend then reaches the new
    Agent, not the one being killed."""
    state = fed(
        header(),
        request(3, 2),
        fault("drop", 2),
        fault("kill_agent", 2),
        answer(3, 2, "dropped"),
        connection("closed", "agent"),
        restart("agent"),
    )
    assert state.lost == set()
    state.feed(connection("open", "agent"))
    assert state.lost == {3}


def test_a_restart_loses_what_was_outstanding_at_the_old_agent_but_not_its_copies() -> None:
    state = fed(
        header(),
        request(7, 4),
        request(7, 5, copy=True),
        request(8, 6),
        answer(8, 6),
        connection("closed", "agent"),
        restart("proxy"),
    )
    assert state.quiet([8])  # nothing is outstanding at the new Agent
    assert state.lost == set()
    state.feed(connection("open", "agent"))
    assert state.lost == {7}


def test_a_restart_that_cuts_the_clients_connection_loses_nothing() -> None:
    """A restart of a listening proxy severs the Client too: its connection's end tells it."""
    state = fed(header(), request(7, 4), restart("proxy"), connection("closed", "client"))
    state.feed(connection("closed", "agent"))
    assert state.lost == set()


def test_a_held_copy_keeps_the_proxy_busy_until_its_answer() -> None:
    """A duplicate's copy is held (spaced), then relayed, then its answer swallowed."""
    state = fed(
        header(),
        request(9, 4),
        HeldRecord(
            time=1.0,
            link=1,
            hold=1,
            rules=("copy-it",),
            delay_ms=50.0,
            direction=Direction.TO_AGENT,
            kind=Kind.REQUEST,
            method=acp.PROMPT,
            session=None,
            id=9,
            forwarded_id=5,
            size=80,
            copy=True,
        ),
        answer(9, 4),
    )
    assert not state.quiet([9])
    state.feed(request(9, 5, copy=True, hold=1))
    assert not state.quiet([9])
    state.feed(answer(9, 5, "swallowed"))
    assert state.quiet([9])
    assert not state.quiet([9, 10])  # the answer to 10 has not left the proxy yet


def test_a_new_run_of_the_proxy_starts_its_links_afresh() -> None:
    """Link 1 of the next run is another link: what was outstanding went with the old proxy."""
    state = fed(header(), request(5, 3))
    assert not state.quiet([])
    state.feed(header())
    assert state.quiet([])
    state.feed(fault("kill_agent", 3))
    state.feed(header())
    state.feed(answer(6, 3, "dropped"))  # no fault of its own in this run
    assert state.lost == {6}


def append(path: Path, *records: Record) -> None:
    with path.open("ab") as trace:
        trace.write(b"".join(encode(record) + b"\n" for record in records))


async def test_the_follower_reads_the_file_as_it_grows_from_its_end_when_created(
    tmp_path: Path,
) -> None:
    """Records already there are another run's; a line written in two parts is read whole."""
    path = tmp_path / "trace.jsonl"
    append(path, header(), request(3, 2), answer(3, 2, "dropped"))
    async with TraceFollower(path) as follower:
        lost = asyncio.get_running_loop().create_task(follower.lost([3]))
        line = encode(answer(3, 7, "dropped")) + b"\n"
        append(path, header(), request(4, 8), answer(4, 8))
        with path.open("ab") as trace:
            trace.write(line[:20])
        async with asyncio.timeout(TIMEOUT):
            await follower.quiet([4])  # read up to the partial line
        assert not lost.done()
        with path.open("ab") as trace:
            trace.write(line[20:])
        async with asyncio.timeout(TIMEOUT):
            await lost
    assert follower.state.lost == {3}


async def test_the_follower_waits_for_a_file_the_proxy_has_not_created_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.jsonl"
    async with TraceFollower(path) as follower:
        append(path, header(), request(1, 0), answer(1, 0))
        async with asyncio.timeout(TIMEOUT):
            await follower.quiet([1])
