"""What the Python engine keeps in memory between batches: the keys and heads of the tables it writes."""
from __future__ import annotations

import threading

__all__ = ["Hashes", "Known", "key_hashes"]


class Hashes:
    """A set of 64-bit hashes (DuckDB's ``hash`` of a key) in sorted NumPy chunks, merged as they grow (8 bytes a
    key, a lookup is a binary search per chunk). A hit is only a maybe (two keys can share a hash); a miss is
    certain. A hash added twice is kept twice (harmless: only membership is asked; ``len`` is for the log)."""

    def __init__(self):
        self.chunks: list = []

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)

    def add(self, hashes) -> None:
        import numpy as np

        if len(hashes):
            self.chunks.append(np.sort(hashes))
        while len(self.chunks) > 1 and len(self.chunks[-2]) <= 2 * len(self.chunks[-1]):
            last = self.chunks.pop()
            merged = np.concatenate((self.chunks.pop(), last))  # twice the keys in memory (np.union1d: ~4 times)
            merged.sort()
            self.chunks.append(merged)

    def hits(self, hashes) -> int:
        import numpy as np

        found = 0
        for chunk in self.chunks:
            at = np.minimum(np.searchsorted(chunk, hashes), len(chunk) - 1)
            found += int(np.count_nonzero(chunk[at] == hashes))
        return found


def key_hashes(con, relation: str, columns) -> "object":
    """DuckDB's 64-bit hash of ``columns`` (as text: equal keys hash alike whatever their Arrow or Parquet type)
    for each row of ``relation`` -> a NumPy uint64 array."""
    expression = ", ".join(f"CAST({c} AS VARCHAR)" for c in columns)
    return con.sql(f"SELECT hash({expression}) AS h FROM {relation}").to_arrow_table().column("h").to_numpy()


class Known:
    """What the engine keeps in memory between batches about a table it writes, so a live batch reads no more of
    the table than its own keys: the sequence ledger's heads (aggregate -> last admitted version) and event ids,
    an insert-once table's keys. Valid while every commit to the table since it was read is this engine's own:
    its writes (each applied here as it commits) and its compactions (the same rows in fewer files), in whatever
    order they came. Any other writer (the Spark engine after a hand-over, a repair, a second process) leaves a
    version not among them, and the next batch reads the table again."""

    def __init__(self):
        self.version: int | None = None  # the table's version this holds (None: to be read)
        self.heads: dict[str, int] = {}
        self.keys = Hashes()
        self._mine: set[int] = set()  # versions after ``version`` committed by this engine
        self._lock = threading.Lock()  # a compaction on the background thread tells its version

    def current(self, table) -> bool:
        """Whether this holds for ``table`` (a loaded DeltaTable) as of its version."""
        latest = table.version()
        with self._lock:
            if self.version is None or latest < self.version \
                    or any(v not in self._mine for v in range(self.version + 1, latest + 1)):
                return False
            self.version = latest
            self._mine = {v for v in self._mine if v > latest}
            return True

    def loaded(self, version: int) -> None:
        """This was just read from the table at ``version``."""
        with self._lock:
            self.version = version
            self._mine = {v for v in self._mine if v > version}  # a compaction committed since the read

    def forget(self) -> None:
        """To be read again at the next batch."""
        with self._lock:
            self.version = None

    def written(self, version: int) -> None:
        """This engine committed ``version``: a write it applied here, or a compaction."""
        with self._lock:
            self._mine.add(version)
