"""What a live table's growing Delta log costs each commit of the Python engine, with and without its choice of
post-commit hooks.

Prints figures; it is not a test. One local table is given commits the way the live projection gives them (a small
append carrying an idempotent-write id, compacted every ``COMPACT_EVERY`` commits, delta-rs's checkpoint every 100),
and at each log length asked for (``--at``, in commits) the same appends are timed, alternating, two ways:
delta-rs's default hooks (a checkpoint when due, and the expired logs' cleanup, which lists the whole log, after
every commit) and the engine's (``Batch.hooks``: the checkpoint only; the cleanup on the compaction turns). Each
timing is the engine's own append (``Batch.append``): the snapshot brought up to date, the idempotent-write id
looked up, the append. At 1.5 batches a second, 4,000 commits are about 45 minutes of a live stream.

    .venv/bin/python bench/delta_log.py [--at 100 1000 2000 4000] [--appends 30]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from python_engine.compaction import COMPACT_EVERY  # noqa: E402
from python_engine.delta_writes import Batch  # noqa: E402


class _DefaultHooks(Batch):
    """The engine's batch with delta-rs's default post-commit hooks."""

    @staticmethod
    def hooks():
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--at", type=int, nargs="+", default=[100, 1000, 2000, 4000],
                    help="log lengths (commits) to time the appends at")
    ap.add_argument("--appends", type=int, default=30, help="timed appends per way and log length")
    args = ap.parse_args()

    rows = pa.table({"event_id": pa.array([f"event-{i:08d}" for i in range(50)]),
                     "n": pa.array(range(50), pa.int64())})
    folder = Path(tempfile.mkdtemp(prefix="eventlake-bench-delta-log-"))
    path = str(folder / "table")
    write_deltalake(path, rows)
    tables: dict = {}  # path -> DeltaTable, shared by both ways as the engine keeps it between batches
    ways = {"delta-rs's default hooks": _DefaultHooks, "the engine's hooks": Batch}
    print(f"bench/delta_log.py: one table at {path}; {args.appends} appends per way and log length, alternating")
    print(f"{'commits':>8} {'log files':>9}  " + "  ".join(f"{w + ' (ms, median)':>36}" for w in ways)
          + f"  {'ratio':>6}")
    commit = 1
    try:
        for at in sorted(args.at):
            while commit < at:
                _DefaultHooks("bench", "bench", commit, {}, tables).append(rows, path, "table")
                commit += 1
                if commit % COMPACT_EVERY == 0:
                    tables[path].optimize.compact()
            times: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(args.appends):
                for way, batch in ways.items():
                    started = time.perf_counter()
                    batch("bench", "bench", commit, {}, tables).append(rows, path, "table")
                    times[way].append(time.perf_counter() - started)
                    commit += 1
            medians = [statistics.median(t) * 1000 for t in times.values()]
            files = sum(1 for _ in (Path(path) / "_delta_log").iterdir())
            print(f"{commit:>8} {files:>9}  " + "  ".join(f"{m:>36.1f}" for m in medians)
                  + f"  {medians[0] / medians[1]:>5.2f}x", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
