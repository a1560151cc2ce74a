"""The memory of a process that parses and folds large batches (the Python engine, its second parser)."""
from __future__ import annotations

__all__ = ["MMAP_THRESHOLD_BYTES", "large_blocks_off_the_heap"]

# Blocks this large or larger come from mappings of their own, returned when freed (large_blocks_off_the_heap).
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def large_blocks_off_the_heap() -> None:
    """glibc's malloc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), after which the
    engine's large short-lived blocks (a batch's hash arrays, record lists, the merges of the id index) come from
    the heap, whose freed space fragments and is seldom given back: the process grew with the log. A fixed
    threshold keeps them in mappings of their own. (Not glibc: nothing to do.)"""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD_BYTES)  # M_MMAP_THRESHOLD (fixed from now on)
    except (OSError, AttributeError):
        pass
