"""Python's cyclic garbage collector, set for a process that relays messages.

Every message the relay parses is a few dicts and lists, freed by their reference counts once
the message is relayed: none of them is ever part of a cycle. The collector does not know that.
It runs a collection of the youngest objects whenever 700 more have been made than freed, and
the notifications of one read (a burst of a thousand or more ``session/update`` lines, each kept
until the burst is relayed) are several thousand live objects: every burst ran several
collections, which moved the burst's objects to the older generations, and those then ran
collections of everything the process holds (its modules, classes and settings: some 70,000
objects). Measured on a stream of 1,000,000 notifications through the compiled core: 4,905
young, 446 middle and 39 full collections, the full ones 1.0-1.7 s of a 2.5-3.6 s stream.

``acp-proxy run`` sets it as it starts (not :mod:`proxy.embedded`: a program embedding the proxy
owns its collector):

* everything start-up made is frozen (:func:`gc.freeze`): no collection looks at it again (the
  modules, the classes, the settings are never garbage);
* a collection of the youngest objects waits for :data:`YOUNG_THRESHOLD` more objects made than
  freed, more than a burst keeps alive at once: the same stream ran 11 young collections, 1
  middle one and no full one, and carried about twice the messages a second.

Cycles are still collected (an exception's traceback, a task that refers to itself), later: at
most some thousands of garbage objects wait for the next collection.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

YOUNG_THRESHOLD = 10_000
"""Objects made and not freed since the last collection before the youngest generation is
collected (Python's own: 700)."""


def tune_collector() -> tuple[int, int]:
    """Freeze what the process holds now and raise the youngest generation's threshold (the older
    generations' stay Python's); the threshold set and how many objects were frozen, for the
    log."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return YOUNG_THRESHOLD, gc.get_freeze_count()
