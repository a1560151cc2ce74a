"""Hand the C heap's free pages back to the kernel, so a long-running service's resident set follows what it holds.

Python objects larger than 512 bytes (a state's encoded bytes, a batch's records, Kafka messages' payloads) and
what the C libraries allocate (librdkafka, LMDB's page copies, pyarrow's small buffers) come from glibc's
``malloc``. Freed, their memory stays in the process: glibc gives the top of its heap back only when the very top
is free, and chunks freed in the middle of it stay resident, reused only by allocations that fit them. A service
that keeps long-lived objects (its caches) among short-lived ones (each batch's) then grows by steps of the heap's
top as it runs, while what it holds stays flat: in the 60-minute soak of bench/freshness.py the handler's
``[heap]`` mapping grew 64 -> 139 MiB in 48 minutes while tracemalloc counted its Python allocations flat
(bench/README.md, "The soak").

``trim()`` is glibc's ``malloc_trim(0)``: every whole free page of every arena, in the middle of the heap too, is
handed back (``madvise(MADV_DONTNEED)``); the next allocation there faults in a zeroed page. ``Trimmer`` does it
at most once per ``every_s`` seconds, between a service's batches (``event_store.collector.CollectorPaced``).
Elsewhere than glibc (musl, macOS) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time

__all__ = ["trim", "Trimmer", "TRIM_EVERY_S"]

TRIM_EVERY_S = 30.0
_malloc_trim = None
_looked_up = False


def _function():
    global _malloc_trim, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            _malloc_trim = libc.malloc_trim
            _malloc_trim.argtypes = [ctypes.c_size_t]
            _malloc_trim.restype = ctypes.c_int
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = None
    return _malloc_trim


def trim() -> bool:
    """Hand every whole free page of the C heap back to the kernel: -> whether any was (False off glibc)."""
    function = _function()
    return bool(function(0)) if function is not None else False


class Trimmer:
    """``maybe()`` trims at most once per ``every_s`` seconds (``every_s`` 0: never)."""

    def __init__(self, every_s: float = TRIM_EVERY_S):
        self.every_s = every_s
        self.trims = 0
        self.seconds = 0.0  # spent in trim()
        self._last = time.monotonic()

    def maybe(self) -> None:
        if not self.every_s:
            return
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        trim()
        self._last = time.monotonic()
        self.trims += 1
        self.seconds += self._last - now
