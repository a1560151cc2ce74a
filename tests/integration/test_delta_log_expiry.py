"""The Python engine's Delta logs stay bounded by their retention (``PythonProjection.expire_logs``): its commits
leave the expired log to the table's compaction turn (delta-rs's per-commit cleanup lists the whole log on every
commit), and that turn deletes what expired, as of the table's ``delta.logRetentionDuration`` (30 days by default).
Real Delta tables on disk, written by the engine's own ``Batch``; no broker."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakehouse.settings import Settings
from python_engine.compaction import COMPACT_EVERY
from python_engine.delta_writes import Batch
from python_engine.run import PythonProjection

DAY = 24 * 3600
# A Delta log checkpoint every 10 commits instead of delta-rs's default 100 (the table's own
# `delta.checkpointInterval`, which delta-rs's post-commit hook reads): the same log shape, a tenth of the commits.
CHECKPOINT_EVERY_10 = {"delta.checkpointInterval": "10"}


def commits(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def age(path: Path, versions, days: float) -> None:
    """Commit files of ``versions`` made ``days`` old (their modification time: what the retention counts)."""
    then = time.time() - days * DAY
    for v in versions:
        os.utime(path / "_delta_log" / f"{v:020d}.json", (then, then))


@pytest.fixture
def engine(tmp_path):
    lines: list[str] = []
    engine = PythonProjection(Settings.load({}).replace(home=tmp_path / "home"), models=[], log=lines.append,
                              archive=False)
    engine.lines = lines
    return engine


def test_the_expired_log_is_deleted_on_the_compaction_turn_not_by_each_commit(engine, tmp_path):
    path = tmp_path / "ledger"
    write_deltalake(str(path), pa.table({"n": pa.array([0], pa.int64())}), configuration=CHECKPOINT_EVERY_10)
    for batch_id in range(1, 13):  # a checkpoint at version 9
        Batch("projection-t", "app", batch_id, {}).append(pa.table({"n": pa.array([batch_id], pa.int64())}),
                                                          path, "ledger")
    assert (path / "_delta_log" / f"{9:020d}.checkpoint.parquet").exists()
    age(path, range(0, 10), days=31)  # older than the default retention: 30 days
    age(path, range(10, 13), days=1)

    Batch("projection-t", "app", 13, {}).append(pa.table({"n": pa.array([13], pa.int64())}), path, "ledger")
    assert commits(path)[0] == 0  # a commit leaves the expired log alone

    steps: dict[str, float] = {}
    for _ in range(COMPACT_EVERY):  # the table's turn comes within as many commits
        engine.compact({str(path)}, steps, merged={str(path)})
    assert "compact ledger" in steps
    left = commits(path)
    assert left[0] == 9 and left[-1] >= 13, left  # the expired ones before the last checkpoint, and no more
    table = DeltaTable(str(path))
    assert sorted(table.to_pyarrow_table().column("n").to_pylist()) == list(range(14))
    assert table.transaction_version("app/ledger/") == 13  # the idempotent writes' ids kept (in the checkpoint)
    assert DeltaTable(str(path), version=11).to_pyarrow_table().num_rows == 12  # time travel within the retention
    assert not any("skipped" in line for line in engine.lines), engine.lines


def test_a_table_keeps_its_log_for_its_own_retention(engine, tmp_path):
    path = tmp_path / "account_summary"
    write_deltalake(str(path), pa.table({"n": pa.array([0], pa.int64())}),
                    configuration={**CHECKPOINT_EVERY_10, "delta.logRetentionDuration": "interval 60 days"})
    for batch_id in range(1, 12):  # a checkpoint at version 9
        Batch("projection-t", "app", batch_id, {}).append(pa.table({"n": pa.array([batch_id], pa.int64())}),
                                                          path, "account_summary")
    assert (path / "_delta_log" / f"{9:020d}.checkpoint.parquet").exists()
    age(path, range(0, 10), days=31)
    for _ in range(COMPACT_EVERY):
        engine.compact({str(path)}, {}, merged={str(path)})
    assert commits(path)[0] == 0  # 31 days old, kept 60
    assert DeltaTable(str(path), version=5).to_pyarrow_table().num_rows == 6
