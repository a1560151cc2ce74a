"""The Python engine's Delta writes: a batch's writes with the Spark projection's idempotent-write ids and
metadata, the MERGE, and the models' writes side by side."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable

from spark_apps.arrow_rows import in_schema

__all__ = ["Batch", "merge_into", "side_by_side", "register_delta", "sql_text", "cast_to", "MERGE_ATTEMPTS"]

# How many times a batch's MERGE into a table is tried when other writers commit to it in between.
MERGE_ATTEMPTS = 5


class Batch:
    """The writes of one batch, each carrying the Spark projection's idempotent-write id and metadata."""

    def __init__(self, projection: str, app_id: str, batch_id: int, steps: dict[str, float],
                 tables: dict | None = None, settle: Callable[[str], bool] | None = None):
        self.projection, self.app_id, self.batch_id, self.steps = projection, app_id, batch_id, steps
        self.written: set[str] = set()  # the tables this batch committed to
        self.merged: set[str] = set()  # of those, the tables it MERGEd into (compacted by the batch, not beside it)
        # Waits for a compaction of the table at a path running beside the batches: -> whether there was one
        self.settle = settle
        self.windowed: set[str] = set()  # of those, windowed tables (clustered, not compacted)
        self.to_cluster: set[str] = set()  # windowed tables whose MERGE copied too many unchanged rows
        self.appended: dict[tuple[str, str], int] = {}  # (name, writer) -> rows this batch appended (one write each)
        self.tables = {} if tables is None else tables  # path -> DeltaTable, kept between batches
        self._locks: dict[str, threading.Lock] = {}  # path -> the lock of its DeltaTable, for writes side by side

    def table(self, path):
        """The Delta table at ``path`` as of now: loaded once, then brought up to date by reading only the
        commits since (a fresh load reads the log from its last checkpoint, up to 100 commits, every time)."""
        from deltalake import DeltaTable

        key = str(path)
        with self.lock(key):
            table = self.tables.get(key)
            if table is None:
                table = self.tables[key] = DeltaTable(key)
            else:
                table.update_incremental()
            return table

    def lock(self, path) -> threading.Lock:
        return self._locks.setdefault(str(path), threading.Lock())

    @contextmanager
    def timed(self, step: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.steps[step] = self.steps.get(step, 0.0) + time.perf_counter() - started

    def metadata(self, **extra) -> str:
        return json.dumps({"projection": self.projection, "app_id": self.app_id, "batch_id": self.batch_id,
                           "input_rows": -1, **extra})

    def commit(self, txn_app_id: str, **metadata):
        from deltalake import CommitProperties, Transaction

        return CommitProperties(app_transactions=[Transaction(txn_app_id, self.batch_id)],
                                custom_metadata={"userMetadata": self.metadata(**metadata)})

    @staticmethod
    def hooks():
        """What delta-rs does after each of this engine's commits: a Delta log checkpoint every 100 commits, not the
        expired logs' cleanup (``PythonProjection.expire_logs``, on the tables' compaction turns instead)."""
        from deltalake import PostCommitHookProperties

        return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

    def done(self, table, txn_app_id: str) -> bool:
        return (table.transaction_version(txn_app_id) or -1) >= self.batch_id

    def append(self, data, path, name: str, writer: str = "", txn: str | None = None, table=None) -> int | None:
        """``BatchContext.append``'s write (transaction ``<app id>/<name>/<writer>``), once: -> the version it
        committed (None: nothing written)."""
        from deltalake import write_deltalake

        txn = txn or f"{self.app_id}/{name}/{writer}"
        table = table if table is not None else self.table(path)
        with self.lock(path):
            if self.done(table, txn) or data.num_rows == 0:
                return None
            write_deltalake(table, cast_to(data, table), mode="append", commit_properties=self.commit(txn),
                            post_commithook_properties=self.hooks())
            self.written.add(str(path))
            self.appended[(name, writer)] = data.num_rows
            return table.version()  # this commit's version (after any other writer's, resolved by delta-rs)


def cast_to(data, table):
    """``data``'s columns in the order and types of the Delta ``table``'s schema."""
    import pyarrow as pa

    return in_schema(data, pa.schema(table.schema().to_arrow()))


def register_delta(con, name: str, path, table=None) -> None:
    """The Delta table at ``path`` as DuckDB view ``name``: its data files through DuckDB's own Parquet reader (as
    ``archive_fold`` reads the archive), or through delta-rs when the table uses features that reader does not
    apply (deletion vectors, column mapping, partitions)."""
    from deltalake import DeltaTable

    table = table if table is not None else DeltaTable(str(path))
    protocol = table.protocol()
    if protocol.reader_features or protocol.min_reader_version > 1 or table.metadata().partition_columns:
        con.register(f"{name}_data", table.to_pyarrow_dataset().to_table())
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {name}_data")
        return
    files = table.file_uris()
    if not files:
        import pyarrow as pa

        con.register(f"{name}_data", pa.schema(table.schema().to_arrow()).empty_table())
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {name}_data")
        return
    con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM read_parquet([{sql_text(files)}], "
                f"union_by_name = true)")


def sql_text(values) -> str:
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in values)


def side_by_side(writes: list[Callable[[], None]]) -> None:
    """The models' writes, each on its own thread (delta-rs does its work without Python's lock): a batch commits
    its tables in the time of its slowest write rather than of all of them. Every write has ended when this
    returns, whatever happened (a hand-over must not find one still running); then the first failure is raised.
    Each write touches its own model's tables; a table two of them share (``late_events``) is appended to under
    ``Batch``'s lock for its path."""
    if len(writes) <= 1:
        for write in writes:
            write()
        return
    with ThreadPoolExecutor(len(writes), thread_name_prefix="projection-write") as pool:
        futures = [pool.submit(write) for write in writes]
    for future in futures:
        future.result()


def merge_into(batch: Batch, target, path, txn: str, source, on: str, insert: dict, update: dict | None = None,
           guard: bool = False, **metadata) -> dict:
    """``source`` MERGEd into ``target`` with the model's own update and insert expressions (the write of
    ``spark_apps.merge._merge``), once per batch: skipped when the table holds this batch's transaction id.
    ``guard``: a row changes only when the changes continue its version, and a new row only from version 1 (current
    state by version)."""
    if batch.done(target, txn):
        return {}
    batch.written.add(str(path))
    batch.merged.add(str(path))
    if batch.settle is not None and batch.settle(str(path)):
        # A compaction beside the batches removed files this MERGE would read as of the older snapshot: it
        # fails on such a commit. The rows are the same; the MERGE reads them as the compaction left them.
        with batch.lock(path):
            target.update_incremental()
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, MERGE_ATTEMPTS + 1):
        merger = target.merge(source, predicate=on, source_alias="s", target_alias="t",
                              commit_properties=batch.commit(txn, **metadata),
                              post_commithook_properties=batch.hooks())
        if update:
            merger = merger.when_matched_update(updates=update,
                                                predicate="s.first_version = t.version + 1" if guard else None)
        try:
            return merger.when_not_matched_insert(updates=insert,
                                                  predicate="s.first_version = 1" if guard else None).execute()
        except CommitFailedError:
            # Another writer committed to the table since this batch read it (``eventlake forget``'s UPDATE, a
            # maintenance run): the MERGE is run again on the table as it is now (delta-rs' conflict check says
            # the query must be rerun). Its result is the same rows: the source and the versions did not change.
            if attempt == MERGE_ATTEMPTS:
                raise
            with batch.lock(path):
                target.update_incremental()
            if batch.done(target, txn):
                return {}
    return {}
