"""lakehouse.native_heap: the C heap's free pages handed back to the kernel (glibc's malloc_trim)."""
import platform
import subprocess
import sys
import time

import pytest

from lakehouse.native_heap import Trimmer

# A heap full of holes: 60 MB of 4 KB objects (from glibc's malloc: larger than Python's small-object allocator
# takes), every 16th kept, so the heap's top cannot shrink and ~56 MB of free chunks stay resident in its middle.
FRAGMENTED = """
import sys
from lakehouse.native_heap import trim

def anon():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1]) // 1024

objects = [bytes(4096) for _ in range(15_000)]
kept = objects[::16]
del objects
holes = anon()
released = trim()
print(holes, anon(), released, len(kept))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc on Linux only")
def test_trim_hands_a_fragmented_heaps_free_pages_back():
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True).stdout
    before, after, released, kept = (int(x) if x.isdigit() else x for x in out.split())
    assert released == "True" and kept == 938
    assert before - after >= 40, (before, after)  # MiB of RssAnon


def test_the_trimmer_trims_at_most_once_per_interval_and_never_at_zero():
    trimmer = Trimmer(every_s=0.05)
    trimmer.maybe()
    assert trimmer.trims == 0
    time.sleep(0.06)
    trimmer.maybe()
    trimmer.maybe()
    assert trimmer.trims == 1
    never = Trimmer(every_s=0)
    time.sleep(0.01)
    never.maybe()
    assert never.trims == 0
