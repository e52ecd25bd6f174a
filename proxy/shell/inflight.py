"""Bytes in flight across the whole proxy (``--max-inflight-bytes``): one count, one bound.

A message is *in flight* from the moment the proxy has read it from a peer until its destination
has taken it down to that destination's own high-water mark (the link drains it), or, for a
message a timer holds (``delay``, a spaced ``duplicate``), until the timer releases it. A POST's
body counts from the moment it is admitted, before a byte of it is read. Every link of the
proxy adds to and takes from one :class:`InflightBytes`.

Past the bound the proxy takes no more from peers, without dropping anything:

* a link's reader waits before it reads the next message (:meth:`InflightBytes.room`): the pipe
  or the TCP window fills and the peer waits. A reader of a peer toward which the proxy still has
  bytes queued never waits: that peer may be writing before it reads, and its reading is what
  makes the count fall (without this, one stalled link could stop every other, and two links
  could wait on each other for ever). So the count may pass the bound: by one message for each
  such reader, and for each reader that was already reading when the bound was reached;
* a POST whose body does not fit (its ``Content-Length``, or its chunks as they come) is answered
  503 with ``Retry-After`` before its body is read (:meth:`InflightBytes.admit`): a POST cannot be
  held back without holding its connection and its Client's patience, the message was not relayed
  (a retry is safe), and 503 is HTTP's own answer for a server that is overloaded for now. POSTs
  never take the count past the bound, except one when nothing else is in flight (a single
  message larger than the bound still passes, alone).

A timer's held messages leave by time alone; the message a reader must write to make room (an
answer, a drain) never waits behind the bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from proxy.shell.log import get_logger

__all__ = ["DEFAULT_MAX_INFLIGHT_BYTES", "InflightBytes", "Reservation"]

log = get_logger("proxy.inflight")

DEFAULT_MAX_INFLIGHT_BYTES: Final = 256 * 1024 * 1024
"""The bound across the proxy (``--max-inflight-bytes``): four messages of the largest size
(``--max-message-bytes``, 64 MiB) at once, or thousands of ordinary ones; twelve concurrent
60 MB POSTs took 2.2 GB without it."""
INFLIGHT_RETRY_AFTER_SECONDS: Final = 1
"""What a refused POST's ``Retry-After`` says: the count falls as fast as peers read."""


class InflightBytes:
    """The count of bytes in flight across the proxy, its bound, and who waits for room."""

    def __init__(self, bound: int | None) -> None:
        """``bound``: bytes in flight past which readers wait and POSTs are refused (None: none)."""
        self.bound = bound
        self.count = 0
        """Bytes in flight now."""
        self.peak = 0
        """The largest :attr:`count` seen."""
        self.waits = 0
        """Times a reader waited for room."""
        self._waiters: set[asyncio.Event] = set()
        self._over = False
        """The count reached the bound and has not fallen under half of it since: logged once
        (a count hovering at the bound would otherwise log at every message)."""

    def full(self) -> bool:
        """Whether the count has reached the bound."""
        return self.bound is not None and self.count >= self.bound

    def add(self, size: int) -> None:
        """``size`` bytes were read from a peer (or admitted)."""
        self.count += size
        self.peak = max(self.peak, self.count)
        self.wake()  # a waiting reader may be exempt now (bytes were queued toward its peer)

    def remove(self, size: int) -> None:
        """``size`` bytes have left (taken by their destination, or released)."""
        self.count -= size
        if self._over and self.bound is not None and self.count < self.bound // 2:
            self._over = False
            log.info(
                "bytes in flight back under half their bound", count=self.count, bound=self.bound
            )
        self.wake()

    async def room(self, exempt: Callable[[], bool]) -> None:
        """Wait while the bound is reached, unless ``exempt()`` says this reader must go on
        (the proxy still has bytes queued toward its peer); checked again at every change."""
        if not self.full() or exempt():
            return
        self.waits += 1
        self._note_over()
        while self.full() and not exempt():
            waiter = asyncio.Event()
            self._waiters.add(waiter)
            try:
                await waiter.wait()
            finally:
                self._waiters.discard(waiter)

    def admit(self, size: int) -> Reservation | None:
        """Admit a message of ``size`` bytes before reading it: its reservation, or None when
        it does not fit (the caller refuses it)."""
        reservation = Reservation(self)
        if not reservation.grow(size):
            return None
        return reservation

    def refused(self) -> None:
        """A message was refused for want of room (the first of a stretch is logged)."""
        self._note_over()

    def fits(self, size: int, own: int = 0) -> bool:
        """Whether ``size`` more bytes fit, for a reservation already holding ``own``."""
        if self.bound is None:
            return True
        return self.count + size <= self.bound or self.count == own

    def _note_over(self) -> None:
        if not self._over:
            self._over = True
            log.warning(
                "bytes in flight reached their bound; reading waits and POSTs that do not fit "
                "are refused (503) until peers read",
                count=self.count,
                bound=self.bound,
            )

    def wake(self) -> None:
        """Have every waiting reader check again whether it may go on (its exemption may have
        changed: its peer was closed)."""
        for waiter in self._waiters:
            waiter.set()


class Reservation:
    """The bytes of one message admitted before they are read; released once, by whoever is
    done with them first (idempotent)."""

    __slots__ = ("_inflight", "size")

    def __init__(self, inflight: InflightBytes) -> None:
        self._inflight: InflightBytes | None = inflight
        self.size = 0

    def grow(self, size: int) -> bool:
        """Reserve ``size`` more bytes (a body read in chunks); False, reserving nothing, when
        they do not fit."""
        inflight = self._inflight
        assert inflight is not None, "a released reservation cannot grow"
        if not inflight.fits(size, self.size):
            return False
        self.size += size
        inflight.add(size)
        return True

    def release(self) -> None:
        """The reserved bytes have left, or someone else counts them now."""
        if self._inflight is not None:
            self._inflight.remove(self.size)
            self._inflight = None
