"""The Python engine's small files: when each table is compacted, compactions beside the batches, windowed tables
clustered, the expired Delta log deleted."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

__all__ = ["Compaction", "CompactionTurns", "COMPACT_EVERY", "COMPACT_TARGET_BYTES", "SMALL_FILE_BYTES",
           "CLUSTER_AFTER_COPIED_ROWS", "CLUSTER_TARGET_BYTES"]

COMPACT_EVERY = 50  # commits of this engine to a table between two compactions of its small files
# The small files a compaction reads into one file, at most (bytes read). delta-rs's own compaction chooses its files
# by this size alone: a file it made is 0.5-0.8 of the files it read, stays under this size and was read again by
# every later compaction (the archive's read 12 MB at the start of a ten-minute live stream, 55-60 MB at its end).
# A compaction of a table MERGEd into is part of a batch, so it adds to the freshness of the batches behind it:
# 32 MiB made some batches seconds slower. (The appended tables' run beside the batches: ``PythonProjection.compact``.)
COMPACT_TARGET_BYTES = 8 * 1024 * 1024
# The files a compaction takes (``spark_apps.small_files``): those under this size. It merges them into files of up
# to ``COMPACT_TARGET_BYTES`` of what it read, about half that written (ZSTD, where an append writes Snappy); a merged
# file this size or more is not read again, so a compaction reads the new small files (and at most one merged file
# under it), however large the table has grown.
SMALL_FILE_BYTES = COMPACT_TARGET_BYTES // 4
# A windowed table (its key holds ``window_start``) is not compacted but clustered: when a MERGE had to copy this
# many unchanged rows (a MERGE rewrites every file holding a row it changes, and one file can hold every window
# since January), the table is rewritten sorted by window into files of ``CLUSTER_TARGET_BYTES``, whose window
# ranges do not overlap: the next MERGEs, which name their windows, touch the newest file only.
CLUSTER_AFTER_COPIED_ROWS = 50_000
CLUSTER_TARGET_BYTES = 256 * 1024


class CompactionTurns:
    """When each table is compacted: every ``every`` commits of this engine to it, the tables' turns spread over
    those commits (the n-th table seen starts n golden-ratio steps of ``every`` along). A batch commits to most
    tables; counted from zero, they all came due in the same batch, which then took the sum of their compactions
    (seconds) - each such batch a step in the freshness of what followed."""

    def __init__(self, every: int):
        self.every = every
        self.commits: dict[str, int] = {}

    def due(self, table: str) -> bool:
        """One more commit to ``table``: -> whether it is its turn to be compacted."""
        count = self.commits.get(table)
        if count is None:
            count = round(len(self.commits) * 0.6180339887 * self.every) % self.every
        self.commits[table] = count + 1
        return (count + 1) % self.every == 0


def lowest_priority() -> None:
    """The calling thread at nice 19 (Linux, where a thread has its own): the compactions beside the batches read
    their small files on it (decoding is most of their work), in whatever CPU the live path leaves. At the default
    priority, the archive's (30-40 MB read, 3-5 s) made the batches beside it two to three times slower, every
    50 batches: the freshness's p99."""
    import os
    import sys

    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


class Compaction:
    """The compactions of the tables an engine writes (``log``: its log; ``known``: what it keeps of them, path ->
    ``Known``, told of each compaction's version)."""

    def __init__(self, log: Callable[[str], None], known: dict):
        self.log, self.known = log, known
        self._commits = CompactionTurns(COMPACT_EVERY)
        self._background: ThreadPoolExecutor | None = None  # compactions of the appended-only tables (``compact``)
        self._compacting: dict = {}  # table -> its compaction on that thread (a Future)

    # -- small files ------------------------------------------------------------------------------------------
    def compact(self, written: set[str], steps: dict[str, float], windowed: set[str] = frozenset(),
                merged: set[str] = frozenset()) -> None:
        """Every ``COMPACT_EVERY`` commits of this engine to a table, its small files are compacted (a live batch
        writes one file per table; left alone, readers and this engine's own reads of the bookkeeping tables
        open thousands); a windowed table is clustered instead, when it holds many more files than that would
        make. Delta log checkpoints are delta-rs's own (every 100 commits); the expired commits of the log are
        deleted on the same turns (``expire_logs``).

        A table the batch appended to (the archive, the sequence ledger, an insert-once table, a windowed
        model's applied-ids ledger, ``late_events``) is compacted on a thread of its own while the batches go on:
        an append and a compaction commit one after the other whichever comes first (the compaction rewrites only
        files it read), and no live batch waits for it. Inside the batches, the ledger's took 0.6-0.8 s after ten
        minutes of a live stream, and payments' and fraud_alerts' 0.3-0.8 s each, every 50 batches: the probes
        of those batches made the freshness's p99. A table the batch MERGEd into is compacted by the batch itself:
        a MERGE meeting a compaction of the files it read fails, so a MERGE into a table being compacted beside
        the batches (an insert-once table's key seen before) first waits for that compaction (``settle``)."""
        import pyarrow as pa
        from deltalake import DeltaTable

        for path in sorted(written):
            if not self._commits.due(path):
                continue
            if path in windowed:
                table = DeltaTable(path)
                self.expire_logs(path, table)
                sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
                if len(sizes) > 2 * (sum(sizes) // CLUSTER_TARGET_BYTES + 1) + 10:
                    self.cluster({path}, steps)
                continue
            running = self._compacting.get(path)
            if path not in merged:
                if running is None or running.done():  # else still at it: the next turn
                    if running is not None:
                        self._finished(path, running)
                    if self._background is None:
                        self._background = ThreadPoolExecutor(1, thread_name_prefix="projection-compact",
                                                              initializer=lowest_priority)
                    self._compacting[path] = self._background.submit(self._compact_table, path, None)
                continue
            if running is not None and not running.done():
                continue  # compacted beside the batches right now: two compactions would race, one giving up
            self._compact_table(path, steps)

    def settle(self, path: str) -> bool:
        """Wait for the compaction of ``path`` running beside the batches, if any (its failure is logged by
        ``_finished`` later): -> whether there was one."""
        running = self._compacting.get(path)
        if running is None:
            return False
        try:
            running.result()
        except Exception:  # noqa: BLE001 -- the table is as its last commit left it
            pass
        return True

    def _compact_table(self, path: str, steps: dict[str, float] | None) -> None:
        """Compact the table at ``path`` (``steps``: a batch's, when the batch runs it; else on the background
        thread)."""
        from deltalake import DeltaTable

        from spark_apps.small_files import compact_small_files

        started = time.perf_counter()
        self.expire_logs(path)
        try:
            metrics = compact_small_files(path, SMALL_FILE_BYTES, COMPACT_TARGET_BYTES)
            if metrics is None:  # a table of another protocol: delta-rs's compaction (it reads again what it made)
                table = DeltaTable(path)
                before = table.version()
                # One thread: the platform's other services (the fraud detector, the handler) keep a core.
                metrics = table.optimize.compact(target_size=COMPACT_TARGET_BYTES, max_concurrent_tasks=1)
                metrics["version"] = table.version() if table.version() != before else None
        except Exception as e:  # noqa: BLE001 -- a race with another writer: the next round compacts
            self.log(f"projection: compacting {path} skipped: {str(e).splitlines()[0][:200]}")
            return
        index = self.known.get(path)
        if index is not None and metrics["version"] is not None:
            index.written(metrics["version"])  # the same rows in fewer files: what the engine keeps of them holds
        if steps is not None:
            steps[f"compact {Path(path).name}"] = time.perf_counter() - started
        if metrics.get("numFilesRemoved"):
            read = f" ({metrics['removedBytes'] / 1e6:.1f} MB)" if "removedBytes" in metrics else ""
            self.log(f"projection: compacted {path}: {metrics['numFilesRemoved']} files{read} into "
                     f"{metrics['numFilesAdded']} ({time.perf_counter() - started:.2f}s"
                     f"{'' if steps is not None else ', while the batches went on'})")

    def expire_logs(self, path: str, table=None) -> None:
        """The table's Delta log commits older than its ``delta.logRetentionDuration`` (30 days unless set: time
        travel reaches back that far) and before its last checkpoint, deleted (delta-rs's ``cleanup_metadata``).
        delta-rs does this after every commit unless told not to, listing the whole log each time: 24 ms of a 40 ms
        append once the log holds 4,000 commits (about 45 minutes of a live stream), growing with the log. The
        engine's commits leave it to the table's compaction turns (``Batch.hooks``), every ``COMPACT_EVERY``
        commits. ``table``: the table at ``path``, when the caller loaded it already."""
        from deltalake import DeltaTable

        try:
            (table if table is not None else DeltaTable(path)).cleanup_metadata()
        except Exception as e:  # noqa: BLE001 -- nothing deleted: the next turn tries again
            self.log(f"projection: deleting the expired Delta log of {path} skipped: {str(e).splitlines()[0][:200]}")

    def wait_for_compaction(self) -> None:
        """Let the compactions on the background thread finish: before another writer (Spark) takes the tables
        on, and before the engine stops."""
        compacting, self._compacting = self._compacting, {}
        for path, running in compacting.items():
            self._finished(path, running)

    def _finished(self, path: str, running) -> None:
        try:
            running.result()
        except Exception as e:  # noqa: BLE001 -- a compaction not made: the table is as its last commit left it
            self.log(f"projection: compacting {path} failed: {type(e).__name__}: {e}")

    def cluster(self, paths: set[str], steps: dict[str, float]) -> None:
        """Each windowed table in ``paths`` rewritten sorted by ``window_start`` into small files of disjoint
        window ranges (``CLUSTER_AFTER_COPIED_ROWS``)."""
        from deltalake import DeltaTable

        for path in paths:
            started = time.perf_counter()
            try:
                metrics = DeltaTable(path).optimize.z_order(["window_start"], target_size=CLUSTER_TARGET_BYTES,
                                                          max_concurrent_tasks=1)
            except Exception as e:  # noqa: BLE001 -- a race with another writer: the next large MERGE asks again
                self.log(f"projection: clustering {path} by window skipped: {str(e).splitlines()[0][:200]}")
                continue
            steps[f"cluster {Path(path).name}"] = time.perf_counter() - started
            self.log(f"projection: clustered {path} by window: {metrics.get('numFilesRemoved')} files into "
                     f"{metrics.get('numFilesAdded')} ({time.perf_counter() - started:.2f}s)")

