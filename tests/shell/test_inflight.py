"""The count of bytes in flight and its bound (``--max-inflight-bytes``), without sockets: who
is admitted, who waits, who never waits, and when a waiting reader goes on."""

from __future__ import annotations

import asyncio

from harness import TIMEOUT

from proxy.shell.inflight import InflightBytes


def test_a_message_is_admitted_while_it_fits_and_alone_whatever_its_size() -> None:
    """Reservations fit up to the bound; past it, none; a message larger than the bound is
    admitted when nothing else is in flight (else it could never pass)."""
    inflight = InflightBytes(100)
    first = inflight.admit(60)
    assert first is not None
    assert inflight.admit(50) is None
    second = inflight.admit(40)
    assert second is not None
    assert (inflight.count, inflight.peak) == (100, 100)
    first.release()
    second.release()
    second.release()  # idempotent: released once
    assert inflight.count == 0
    alone = inflight.admit(1000)
    assert alone is not None
    assert inflight.admit(1) is None
    alone.release()
    assert (inflight.count, inflight.peak) == (0, 1000)


def test_a_body_read_in_chunks_grows_while_it_fits() -> None:
    """A chunked body reserves as it comes; a chunk that does not fit reserves nothing."""
    inflight = InflightBytes(100)
    other = inflight.admit(30)
    assert other is not None
    body = inflight.admit(0)
    assert body is not None
    assert body.grow(50)
    assert not body.grow(21)
    assert (body.size, inflight.count) == (50, 80)
    other.release()
    assert body.grow(60)  # alone now: it may pass the bound
    body.release()
    assert inflight.count == 0


def test_without_a_bound_everything_fits_and_nobody_waits() -> None:
    inflight = InflightBytes(None)
    inflight.add(1 << 40)
    assert not inflight.full()
    assert inflight.admit(1 << 40) is not None


async def test_a_reader_waits_while_the_bound_is_reached_and_goes_on_when_it_falls() -> None:
    """A reader that is not exempt waits at the bound (counted), until bytes leave."""
    inflight = InflightBytes(100)
    inflight.add(100)
    reader = asyncio.create_task(  # noqa: TID251 - the test awaits it
        inflight.room(lambda: False)
    )
    await asyncio.sleep(0)  # one turn: the reader reaches its wait
    assert not reader.done()
    assert inflight.waits == 1
    inflight.remove(1)
    await asyncio.wait_for(reader, TIMEOUT)


async def test_a_reader_the_count_depends_on_never_waits() -> None:
    """A reader whose peer the proxy still writes to goes on past the bound; one that becomes
    so while it waits (bytes were just queued toward its peer) goes on then."""
    inflight = InflightBytes(100)
    inflight.add(150)
    await asyncio.wait_for(inflight.room(lambda: True), TIMEOUT)
    queued_toward_its_peer = False
    reader = asyncio.create_task(  # noqa: TID251 - the test awaits it
        inflight.room(lambda: queued_toward_its_peer)
    )
    await asyncio.sleep(0)
    assert not reader.done()
    queued_toward_its_peer = True
    inflight.add(10)  # the other side read a message, now queued toward this reader's peer
    await asyncio.wait_for(reader, TIMEOUT)
    assert inflight.full()


async def test_a_waiting_reader_checks_again_when_woken() -> None:
    """A reader whose peer the proxy closed must go on to see its end: the link wakes the
    waiting readers, and the one now exempt leaves its wait."""
    inflight = InflightBytes(10)
    inflight.add(10)
    closed = False
    reader = asyncio.create_task(  # noqa: TID251 - the test awaits it
        inflight.room(lambda: closed)
    )
    await asyncio.sleep(0)
    assert not reader.done()
    closed = True
    inflight.wake()
    await asyncio.wait_for(reader, TIMEOUT)
