"""The Python engine's MERGE when another writer commits to the table between the batch's read and its commit."""
from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from python_engine.delta_writes import Batch, merge_into


def test_a_merge_overtaken_by_another_writers_commit_runs_again_on_the_table_as_it_is_now(tmp_path):
    """``eventlake forget`` nulls a subject's columns with an UPDATE while the projection runs: delta-rs refuses the
    batch's MERGE (a concurrent transaction changed what it read). The MERGE is run again on the new version: the
    batch's rows land, the nulled value stays null, the batch's transaction id is recorded once."""
    path = str(tmp_path / "account_summary")
    write_deltalake(path, pa.table({"id": ["a", "b"], "version": [1, 1], "name": ["Ada", "Grace"]}))
    batch = Batch("projection", "app", 7, {})
    target = batch.table(path)  # what the batch read
    DeltaTable(path).update(updates={"name": "NULL"}, predicate="id = 'a'")  # forget's commit, in between

    merge_into(batch, target, path, "app/account_summary", pa.table({"id": ["a", "c"], "version": [2, 1],
                                                                     "name": ["Ada", "Lin"]}),
               "s.id = t.id", insert={"id": "s.id", "version": "s.version", "name": "s.name"},
               update={"version": "s.version"})

    table = DeltaTable(path)
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": "a", "version": 2, "name": None}, {"id": "b", "version": 1, "name": "Grace"},
        {"id": "c", "version": 1, "name": "Lin"}]
    assert table.transaction_version("app/account_summary") == 7 and table.version() == 2
