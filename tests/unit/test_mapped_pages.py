"""lakehouse.mapped_pages: a store's touched pages stop counting in the process's RSS, and nothing is lost."""
from __future__ import annotations

import os
import sys

import lmdb
import pytest

from lakehouse.mapped_pages import Releaser, mappings, release

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux)")


def _resident_kib(path) -> int:
    """The resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    target, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) == 6 and head[5] == target
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def _filled(tmp_path, entries=20_000):
    env = lmdb.open(str(tmp_path / "store"), map_size=1 << 34, sync=False, metasync=False, readahead=False)
    with env.begin(write=True) as txn:
        for i in range(entries):
            txn.put(b"k%08d" % i, bytes([i % 251]) * 200)
    return env, tmp_path / "store" / "data.mdb"


def test_release_hands_back_every_touched_page_and_the_store_reads_the_same(tmp_path):
    env, data = _filled(tmp_path)
    with env.begin() as txn:
        before = {bytes(k): bytes(v) for k, v in txn.cursor()}
    touched = _resident_kib(data)
    assert touched > 2_000, f"reading 20,000 entries of 200 bytes should map > 2 MiB of {data}, not {touched} KiB"
    assert mappings(data), "LMDB maps its data file shared"

    assert release(data) > 0
    assert _resident_kib(data) < touched / 10

    with env.begin() as txn:  # the same bytes, read again through the map
        assert {bytes(k): bytes(v) for k, v in txn.cursor()} == before
    with env.begin(write=True) as txn:  # and written on
        txn.put(b"after", b"release")
    with env.begin() as txn:
        assert txn.get(b"after") == b"release" and txn.get(b"k00000007") == bytes([7]) * 200
    env.close()


def test_release_of_a_file_not_mapped_or_missing_does_nothing(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * 10_000)
    assert release(plain) == 0
    assert release(tmp_path / "missing") == 0


def test_releaser_runs_at_most_once_per_period(tmp_path):
    env, data = _filled(tmp_path, entries=1_000)
    pages = Releaser(data, every_s=3600)
    assert not pages.maybe() and pages.released == 0
    pages = Releaser(data, every_s=0)
    assert pages.maybe() and pages.maybe() and pages.released == 2
    env.close()


def test_when_idle_what_work_mapped_since_the_last_release_is_handed_back_once(tmp_path):
    env, data = _filled(tmp_path)
    pages = Releaser(data, every_s=3600)
    assert not pages.settle(), "no work since it was made: nothing owed"
    pages.now()
    with env.begin() as txn:  # a piece of work inside the period: its pages stay mapped
        for _ in txn.cursor():
            pass
    assert not pages.maybe()
    touched = _resident_kib(data)
    assert touched > 2_000
    assert not pages.settle(), "not before its period is over"
    pages.every_s = 0  # the period is over
    assert pages.settle() and _resident_kib(data) < touched / 10
    assert not pages.settle(), "handed back once; nothing owed until the next work"
    env.close()
