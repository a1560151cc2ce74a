"""Python's cyclic garbage collector in the long-running services whose state is many small long-lived objects
(the command handler's states and idempotency window, the fraud detector's per-account histories).

With Python's default thresholds (700, 10, 10) a service that replaces a few objects of a large state per record
makes a full collection every few seconds, each a pass over the whole state: about a third of the handler's loop
(bench/commands.py), and the fraud detector's full passes every ~5 s took up to 0.28 s each in a ten-minute
freshness run (every finding waiting). Their hot paths make no reference cycles (records, envelopes, states and
commands are trees), so collecting rarely loses nothing; objects that do form cycles are still collected, later.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["THRESHOLDS", "rare_collections"]

# A young-generation collection per 100,000 net new objects; a full one after 50 x 100 of those.
THRESHOLDS = (100_000, 50, 100)


@contextmanager
def rare_collections() -> Iterator[None]:
    """Run the block with the collector's thresholds at ``THRESHOLDS``; the thresholds before it are set back."""
    before = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
