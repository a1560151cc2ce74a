"""Hand a memory-mapped file's pages back to the kernel's page cache, so they stop counting in the process's RSS.

LMDB (the handler's state store, the Python engine's key indexes) reads through a map of its whole file: every
page a read or a write touches stays mapped into the process, and RSS counts it (as ``RssFile``) until the kernel
reclaims it under pressure. A store that grows with the live aggregates would then show as a process that grows
with them, however small its heap. RocksDB, in Kafka Streams and Flink, reads with ``pread`` instead: its pages sit
in the page cache, outside the process's RSS. ``release`` gives the same: ``madvise(MADV_DONTNEED)`` on the
process's shared mappings of a file unmaps the pages it touched; the next access maps them again from the page
cache (a minor fault, no read from disk while the kernel keeps them), or reads them from the file. For a shared
mapping nothing is lost: the file and the page cache hold the contents (man 2 madvise). Private mappings are
never touched (there it would drop the process's own changes).

``Releaser`` does it at most once per ``every_s`` seconds, for a caller that touches its store on every batch, or
at once, for a walk through the whole store (a snapshot's cut: LMDB reads ~350 MB a second sequentially here).
Off Linux (no /proc/self/maps) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from pathlib import Path

__all__ = ["mappings", "release", "Releaser", "RELEASE_EVERY_S"]

RELEASE_EVERY_S = 1.0
_MADV_DONTNEED = 4  # Linux
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_libc = None


def _madvise():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise


def mappings(path: Path | str) -> list[tuple[int, int]]:
    """(start, end) of each shared mapping of the file at ``path`` in this process (none off Linux)."""
    target = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(maxsplit=5)
                if len(parts) == 6 and parts[5] == target and parts[1][3:4] == "s":
                    start, end = parts[0].split("-")
                    found.append((int(start, 16), int(end, 16)))
    except OSError:
        return []
    return found


def release(path: Path | str) -> int:
    """Unmap the pages this process touched of the file at ``path`` (its shared mappings only); the bytes of the
    file's size that were advised (0 when it is not mapped)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    size = -(-size // _PAGE) * _PAGE
    advised = 0
    for start, end in mappings(path):
        length = min(end - start, size)
        if length > 0 and _madvise()(start, length, _MADV_DONTNEED) == 0:
            advised += length
    return advised


class Releaser:
    """``release(path)`` at most once per ``every_s`` seconds: ``maybe()`` after each piece of work; ``now()``
    every so many entries of a walk through the file; ``settle()`` when idle, for what the last pieces of work
    mapped after the last release (else an idle process keeps them until its next piece of work)."""

    def __init__(self, path: Path | str, every_s: float = RELEASE_EVERY_S):
        self.path, self.every_s = str(path), every_s
        self._last = time.monotonic()
        self._owed = False  # work was done since the last release
        self.released = 0  # how many times it ran

    def maybe(self) -> bool:
        """Release if ``every_s`` has passed since the last time; whether it did."""
        if time.monotonic() - self._last < self.every_s:
            self._owed = True
            return False
        self.now()
        return True

    def settle(self) -> bool:
        """When idle: release what work since the last release mapped, once ``every_s`` has passed; whether it
        did (nothing to do when no work was done since)."""
        return self._owed and self.maybe()

    def now(self) -> None:
        """Release now (a walk through the whole file maps hundreds of MB a second: it releases by what it read,
        not by the clock)."""
        self._last = time.monotonic()
        self._owed = False
        release(self.path)
        self.released += 1
