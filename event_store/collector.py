"""Python's cyclic garbage collector in the long-running services whose state is many long-lived objects (the
command handler's states and idempotency window, the fraud detector's per-account histories, the projection).

Python's collector counts *net* new objects: a young-generation collection runs once allocations outnumber
deallocations by its first threshold. A service whose state churns (each command's result replaces an older one
in the idempotency window, each payment a version of its account's payment ids) allocates about as many objects
as it frees, so the count hardly moves while the young generation fills with new long-lived objects; when a
collection does run it visits every one of them. In ten minutes of bench/freshness.py the handler's young
collections came every one to five minutes and visited ~500,000 objects each (0.5-1 s, every command waiting),
and with Python's default thresholds a service makes a pass over its whole state every few seconds instead
(the detector's took up to 0.28 s, the projection's 0.3 s).

``CollectorPaced``: at most every ``every_s`` seconds, between batches, a collection of what is not frozen, then
``gc.freeze()`` of what survived it (frozen objects are left out of every later collection, and freed as usual
when no longer referenced; freezing costs nothing however many objects it moves). Each collection then visits
about a second's worth of new objects: tens of milliseconds, not seconds. Reference cycles made and dropped
within a second are still collected (the hot paths make none: their young collections found none). A cycle
whose objects were still referenced when frozen is not collected while the service runs, so nothing is frozen
mid-batch: ``tick()`` is called between batches, where only the service's state is alive; and a loop that does
make cycles (the Python projection's libraries do, ~150 objects a second) also collects everything, the frozen
objects included, every ``whole_every_s``. After a large state is loaded (a partition rebuilt), the next
collection visits all of it, once.

Every ``trim_every_s`` a tick also hands the C heap's free pages back to the kernel (``lakehouse.native_heap``):
without it the services' resident set grew by the holes their batches left in the heap, not by what they hold.
"""
from __future__ import annotations

import gc
import threading
import time

from lakehouse.native_heap import TRIM_EVERY_S, Trimmer

__all__ = ["CollectorPaced", "THRESHOLDS"]

# Automatic collections between ticks only when a second adds 100,000 net objects (e.g. a partition's state
# loaded); a full one after 50 x 100 of those.
THRESHOLDS = (100_000, 50, 100)

# Loops running at once in one process (threads of a test, say): the first sets the thresholds, the last sets
# them back and unfreezes.
_lock = threading.Lock()
_active = 0
_saved_thresholds: tuple[int, int, int] | None = None


class CollectorPaced:
    """Use as ``with CollectorPaced() as collector:`` around a service's loop and call ``collector.tick()``
    between batches. On entry one full collection, then everything alive is frozen; on exit (of the last such
    loop of the process) the frozen objects are handed back to the collector and the thresholds set back."""

    def __init__(self, every_s: float = 1.0, whole_every_s: float | None = None, trim_every_s: float = TRIM_EVERY_S):
        self.every_s = every_s
        self.whole_every_s = whole_every_s
        self.trimmer = Trimmer(trim_every_s)
        self.collections = 0
        self.seconds = 0.0  # spent in tick()'s collections
        self.longest_s = 0.0
        self._last = self._last_whole = 0.0

    def __enter__(self) -> "CollectorPaced":
        global _active, _saved_thresholds
        with _lock:
            if _active == 0:
                _saved_thresholds = gc.get_threshold()
                gc.set_threshold(*THRESHOLDS)
            _active += 1
        gc.collect()
        gc.freeze()
        self._last = self._last_whole = time.monotonic()
        return self

    def tick(self) -> None:
        """Collect what is not frozen (every ``whole_every_s``: everything) and freeze what survives, if ``every_s``
        has passed since the last time."""
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        if self.whole_every_s is not None and now - self._last_whole >= self.whole_every_s:
            gc.unfreeze()
            self._last_whole = now
        gc.collect()
        gc.freeze()
        done = time.monotonic()
        self._last = done
        self.collections += 1
        self.seconds += done - now
        self.longest_s = max(self.longest_s, done - now)
        self.trimmer.maybe()

    def __exit__(self, *exc) -> None:
        global _active
        with _lock:
            _active -= 1
            if _active == 0:
                gc.unfreeze()
                if _saved_thresholds is not None:
                    gc.set_threshold(*_saved_thresholds)
