"""Compaction of a Delta table's small files only (spark_apps/small_files.py), on real Delta tables (delta-rs writes
them, delta-rs, DuckDB and Spark read them): the files it does not merge stay as they are, every row stays once, a
concurrent append only moves its commit on, a concurrent removal of its files makes it give up cleanly."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_apps.small_files import Conflict, SmallFilesCompaction, compact_small_files

STATS = {"delta.dataSkippingStatsColumns": "n,name"}


def rows(start: int, count: int) -> pa.Table:
    return pa.table({"n": pa.array(range(start, start + count), pa.int64()),
                     "name": [f"row-{i:06d}-" + "x" * (i % 37) for i in range(start, start + count)]})


def table_with(path, big: int, small: list[int]) -> int:
    """A table holding one file of ``big`` rows, then one small file per count in ``small``: -> rows in all."""
    write_deltalake(str(path), rows(0, big), configuration=STATS)
    at = big
    for count in small:
        write_deltalake(str(path), rows(at, count), mode="append")
        at += count
    return at


def sizes(path) -> dict[str, int]:
    files = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return dict(zip(files.column("path").to_pylist(), files.column("size_bytes").to_pylist()))


def numbers(path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["n"]).column("n").to_pylist())


def test_the_small_files_are_merged_and_the_large_ones_left_as_they_are(tmp_path, spark):
    path = tmp_path / "t"
    total = table_with(path, 60_000, [200] * 40)
    before = sizes(path)
    small_bytes = 20_000
    large = {f: s for f, s in before.items() if s >= small_bytes}
    assert len(large) == 1 and len(before) == 41
    version = DeltaTable(str(path)).version()
    target = 2 * max(large.values())  # delta-rs's compaction to this size would rewrite the large file too

    metrics = compact_small_files(path, small_bytes, target)

    assert metrics["version"] == version + 1 and metrics["numFilesRemoved"] == 40 and metrics["numFilesAdded"] >= 1
    after = sizes(path)
    assert set(large) <= set(after), "a file over the small size was rewritten"
    assert len(after) == 1 + metrics["numFilesAdded"] < len(before)
    assert numbers(path) == list(range(total))
    commit = [json.loads(line) for line in
              (path / "_delta_log" / f"{version + 1:020d}.json").read_text().splitlines()]
    assert commit[0]["commitInfo"]["operation"] == "OPTIMIZE"
    assert all(a[k]["dataChange"] is False for a in commit[1:] for k in a)  # no reader of changes sees new rows
    added = [a["add"] for a in commit if "add" in a]
    assert all(json.loads(a["stats"])["numRecords"] > 0 for a in added)  # delta-rs's statistics, for skipping
    # Spark reads it as a Delta table (its log, its statistics for the filter), so does delta-rs with a filter
    frame = spark.read.format("delta").load(str(path))
    assert frame.count() == total and frame.where("n = 60150").count() == 1
    assert DeltaTable(str(path)).to_pyarrow_dataset().to_table(filter=pa.compute.field("n") == 60150).num_rows == 1
    # the next compaction reads only what is small now: none of the files over the small size
    again = compact_small_files(path, small_bytes, target)
    assert again["removedBytes"] < small_bytes * 2
    assert not (path / "_eventlake_compaction").exists()


def written_compaction(path) -> tuple[SmallFilesCompaction, int]:
    """A table of 21 small files and a compaction of them, planned and written, not committed: -> it, rows."""
    total = table_with(path, 10, [100] * 20)
    compaction = SmallFilesCompaction(path, 1_000_000, 8_000_000)
    assert compaction.plan()
    compaction.write()
    return compaction, total


def test_an_append_committed_meanwhile_moves_the_compaction_to_the_next_version(tmp_path):
    path = tmp_path / "t"
    compaction, total = written_compaction(path)
    write_deltalake(str(path), rows(total, 50), mode="append")  # another writer's commit, after the plan
    version = compaction.commit()
    compaction.close()
    assert version == compaction.read_version + 2
    assert numbers(path) == list(range(total + 50))
    assert len(sizes(path)) == 2  # the merged file and the append


def test_a_commit_that_removed_a_merged_file_makes_the_compaction_give_up_and_leave_nothing(tmp_path):
    path = tmp_path / "t"
    compaction, total = written_compaction(path)
    DeltaTable(str(path)).optimize.compact()  # another compaction, of the same files, committed first
    with pytest.raises(Conflict, match="removed"):
        compaction.commit()
    compaction.discard()
    compaction.close()
    assert numbers(path) == list(range(total))  # every row once: its merged file was not added
    on_disk = {p.name for p in path.glob("*.parquet")}
    assert not {a["path"] for a in compaction.added} & on_disk
    assert len(sizes(path)) == 1


def test_a_table_with_table_features_is_left_to_delta_rs(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), rows(0, 10), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(str(path), rows(10, 10), mode="append")
    assert compact_small_files(path, 1_000_000, 8_000_000) is None
    assert len(sizes(path)) == 2


def test_files_spark_wrote_and_files_delta_rs_wrote_are_merged_in_the_tables_types(tmp_path, spark):
    # A batch handed to the Spark engine writes its files the Spark way (its own Parquet types, e.g. for times);
    # the engine's appends around them the delta-rs way: the merged file holds both, in the table's schema.
    import datetime as dt

    path = tmp_path / "t"
    when = dt.datetime(2026, 11, 27, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
    frame = pa.table({"n": pa.array([0], pa.int64()), "name": ["spark"],
                      "at": pa.array([when], pa.timestamp("us", tz="UTC"))})
    write_deltalake(str(path), frame, configuration=STATS)
    for i in range(1, 4):
        row = [(i, f"spark-{i}", when + dt.timedelta(seconds=i))]
        spark.createDataFrame(row, "n long, name string, at timestamp").write.format("delta").mode("append") \
            .save(str(path))
        write_deltalake(str(path), pa.table({"n": pa.array([100 + i], pa.int64()), "name": [f"rs-{i}"],
                                             "at": pa.array([when], pa.timestamp("us", tz="UTC"))}), mode="append")
    before = DeltaTable(str(path)).to_pyarrow_table().sort_by("n")
    files = sizes(path)  # Spark's writes compact the table as they go (auto compaction): its file and ours
    assert len(files) >= 2

    metrics = compact_small_files(path, 1_000_000, 8_000_000)

    assert metrics["numFilesRemoved"] == len(files) and len(sizes(path)) == 1, (metrics, sizes(path))
    assert DeltaTable(str(path)).to_pyarrow_table().sort_by("n").equals(before)
    assert spark.read.format("delta").load(str(path)).where("name = 'spark-2'").count() == 1
