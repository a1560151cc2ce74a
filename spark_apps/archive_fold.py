"""The rebuild's fold of ``event_archive`` in DuckDB over delta-rs: columns in, each table written once, no JVM.

The same fold as ``spark_apps.rebuild_fold`` (the sequence rule once over the archived events up to a position,
then each model's table written whole, with the bookkeeping a streaming catch-up from that position needs),
done by one DuckDB database in this process: the archive is scanned through delta-rs's pyarrow dataset (only
the columns and rows a step needs), each model's fold is its ``fold_sql`` (the SQL twin of its vectorised
``fold``, over a relation ``events``), and every table is written by ``deltalake.write_deltalake`` in the
model's own schema (the Spark ``StructType``, as Arrow) with the rebuild's ``userMetadata`` on the commit.
The tables are plain Delta tables (protocol 1/2) the streaming projection goes on MERGE-ing into.

The sequence rule as in ``spark_apps.rebuild_fold.admit_archived``: cheap checks (per aggregate: first and last version and
the count; 64-bit hashes of (aggregate, version) and of event ids that come twice) find the aggregates whose
events are exactly versions 1..n, once each, with no event id repeated (nearly all); their events are admitted
as they are. Only the others are ranked: dedup by event id (first in log order), the first event at a version
takes it (later ones are conflicts), the run from version 1 without a gap is admitted, the rest is held.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import time
from typing import Callable

from event_store.sealing import Unsealer, unsealed_select
from lakehouse.settings import Settings
from projection_core.reference import ReferenceTables
from read_models.catalog import ARCHIVE_TABLE
from read_models.enrichment import enriched_sql
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel
from spark_apps.arrow_rows import arrow_schema, in_schema
from projection_core.rebuild_errors import RebuildError

__all__ = ["supports", "archive_position", "fold_archive"]

# The archive's columns every step may read (its bookkeeping columns included).
_LOG_ORDER = "kafka_partition, kafka_offset"


def supports(models: list[ReadModel], paths: list[str]) -> str:
    """'' when this fold can do the job, else why not (a model without ``fold_sql``, a path that is a URI)."""
    missing = [m.name for m in models if not m.fold_sql]
    if missing:
        return f"no fold_sql for {', '.join(missing)}"
    remote = [p for p in paths if "://" in str(p) and not str(p).startswith("file://")]
    if remote:
        return f"not a local path: {remote[0]}"
    return ""


def _event_row_schema(archive_schema):
    """The archive's columns as a pyarrow schema, every field nullable (what ``_pending`` / held tables hold)."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in archive_schema])


class _Fold:
    def __init__(self, settings: Settings, metadata: dict):
        import duckdb
        import pyarrow as pa
        from deltalake import DeltaTable

        self.metadata = metadata
        self.path = str(settings.table_path(ARCHIVE_TABLE))
        try:
            self.archive = DeltaTable(self.path)
        except Exception as e:  # noqa: BLE001 -- TableNotFoundError and the like: not a Delta table
            raise RebuildError(f"cannot rebuild from {self.path}: no event archive there "
                               f"({str(e).splitlines()[0][:200]}); run `eventlake project` (its event_archive query) "
                               f"first") from None
        self.con = duckdb.connect(config={"threads": max(2, os.cpu_count() or 2)})
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute("SET preserve_insertion_order = false")
        Unsealer(settings).register(self.con)  # the models' folds read personal values unsealed
        # The reference tables folds join as of each event's time (read_models.enrichment), as relations.
        self.reference = ReferenceTables(settings)
        self.schema = pa.schema(self.archive.schema().to_arrow())
        protocol = self.archive.protocol()
        if protocol.reader_features or protocol.min_reader_version > 1 or self.archive.metadata().partition_columns:
            # Deletion vectors, column mapping, partition values: delta-rs's dataset applies them.
            self.con.register("archive", self.archive.to_pyarrow_dataset())
        else:
            # A plain table is its data files: DuckDB's own Parquet reader scans them in parallel (3-5x faster
            # than through the dataset), reading only the columns and row groups a step needs.
            files = self.archive.file_uris()
            if files:
                self.con.execute(f"CREATE VIEW archive AS SELECT * FROM read_parquet({_sql_list(files)})")
            else:
                self.con.register("archive", self.schema.empty_table())

    def close(self) -> None:
        self.con.close()

    def one(self, query: str):
        return self.con.execute(query).fetchall()[0]

    def write(self, query_or_table, path: str, schema, stats_columns: tuple[str, ...] = (),
              predicate: str | None = None, metadata: dict | None = None) -> int:
        """One overwrite of the table at ``path`` (whole, or the rows ``predicate`` selects) with the rows of
        ``query_or_table`` cast to ``schema`` -> rows written."""
        import pyarrow as pa
        from deltalake import CommitProperties, write_deltalake

        if isinstance(query_or_table, str):
            reader = self.con.sql(query_or_table).to_arrow_reader(1_000_000)
            # Columns by name, in the schema's order, each cast to its Delta type (DuckDB's own, e.g. a count's
            # BIGINT or a timestamp's time zone, may differ).
            batches = (in_schema(b, schema, missing_null=False) for b in reader)
            data = pa.RecordBatchReader.from_batches(schema, batches)
        else:
            data = in_schema(query_or_table, schema, missing_null=False)
        counted = _Counted(data)
        configuration = {"delta.dataSkippingStatsColumns": ",".join(stats_columns)} if stats_columns else None
        write_deltalake(path, counted, mode="overwrite", schema_mode=None if predicate else "overwrite",
                        predicate=predicate, configuration=configuration,
                        commit_properties=CommitProperties(custom_metadata={
                            "userMetadata": json.dumps(metadata or self.metadata)}))
        return counted.rows


def _sql_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


class _Counted:
    """An Arrow stream that counts the rows it hands out."""

    def __init__(self, data):
        import pyarrow as pa

        self.schema = data.schema
        self.rows = 0
        batches = data.to_batches() if isinstance(data, pa.Table) else data

        def counted():
            for batch in batches:
                self.rows += batch.num_rows
                yield batch

        self._reader = pa.RecordBatchReader.from_batches(self.schema, counted())

    def __arrow_c_stream__(self, requested_schema=None):
        return self._reader.__arrow_c_stream__(requested_schema)


def archive_position(settings: Settings) -> dict[int, int]:
    """Per Kafka partition, the highest offset in ``event_archive`` (``spark_apps.rebuild_fold.archive_position``)."""
    fold = _Fold(settings, {})
    try:
        rows = fold.con.execute("SELECT kafka_partition, max(kafka_offset) FROM archive GROUP BY 1").fetchall()
    finally:
        fold.close()
    return {int(p): int(o) for p, o in rows}


def fold_archive(settings: Settings, models: list[ReadModel], targets: dict, position: dict[int, int],
                 result, step: Callable[[str, float, int, str], None]) -> None:
    """Steps 2 and 3 of ``spark_apps.rebuild_fold.fold_archive``: fold the archived events at or before ``position``
    (partition -> last offset; checked against the archive by the caller) into ``targets`` (model name ->
    ``FoldTargets``), filling ``result`` (a ``FoldResult``) and reporting each step through
    ``step(name, t0, rows, detail)``."""
    metadata = {"projection": "rebuild", "position": {str(p): o for p, o in sorted(position.items())}}
    fold = _Fold(settings, metadata)
    try:
        _fold(fold, models, targets, position, result, step)
    finally:
        fold.close()


def _fold(fold: _Fold, models: list[ReadModel], targets: dict, position: dict[int, int], result, step) -> None:
    from spark_apps.sequence import ledger_schema

    within = " OR ".join(f"(kafka_partition = {int(p)} AND kafka_offset <= {int(o)})"
                         for p, o in sorted(position.items())) or "false"
    fold.con.execute(f"CREATE VIEW ev AS SELECT * FROM archive WHERE {within}")

    # 2. the sequence rule.
    t0 = time.monotonic()
    fold.con.execute("CREATE TEMP TABLE per_aggregate AS SELECT aggregate_id, min(aggregate_version) AS first, "
                     "max(aggregate_version) AS last, count(*) AS n FROM ev GROUP BY aggregate_id")
    result.events = int(fold.one("SELECT coalesce(sum(n), 0) FROM per_aggregate")[0])
    # Equal values hash equal, so no repeat is missed; a collision only ranks a few more aggregates.
    fold.con.execute("CREATE TEMP TABLE repeated AS SELECT h FROM (SELECT hash(aggregate_id, aggregate_version) AS h "
                     "FROM ev UNION ALL SELECT hash(event_id) FROM ev) GROUP BY h HAVING count(*) > 1")
    fold.con.execute(
        "CREATE TEMP TABLE slow AS SELECT aggregate_id FROM per_aggregate WHERE first <> 1 OR n <> last "
        "UNION SELECT aggregate_id FROM ev WHERE hash(aggregate_id, aggregate_version) IN (SELECT h FROM repeated) "
        "OR hash(event_id) IN (SELECT h FROM repeated)")
    slow = int(fold.one("SELECT count(*) FROM slow")[0])
    columns = ", ".join(f'"{f.name}"' for f in fold.schema)
    if slow == 0:
        fold.con.execute("CREATE VIEW admitted AS SELECT * FROM ev")
        fold.con.execute("CREATE VIEW held AS SELECT * FROM ev WHERE false")
        conflicts = 0
    else:
        # Every event sharing an id with another is here (its hash repeats), so this dedup is global.
        fold.con.execute(
            f"CREATE TEMP TABLE ranked AS SELECT *, row_number() OVER (PARTITION BY aggregate_id, aggregate_version "
            f"ORDER BY {_LOG_ORDER}) AS _rank FROM (SELECT * FROM ev SEMI JOIN slow USING (aggregate_id) "
            f"QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY {_LOG_ORDER}) = 1)")
        conflicts = int(fold.one("SELECT count(*) FROM ranked WHERE _rank > 1")[0])
        # Versions are distinct among the takers: version == its rank in the aggregate exactly while no gap came.
        fold.con.execute(
            "CREATE TEMP TABLE takers AS SELECT *, aggregate_version = row_number() OVER (PARTITION BY aggregate_id "
            "ORDER BY aggregate_version) AS _contiguous FROM ranked WHERE _rank = 1")
        fold.con.execute(f"CREATE VIEW admitted AS SELECT * FROM ev ANTI JOIN slow USING (aggregate_id) "
                         f"UNION ALL BY NAME SELECT {columns} FROM takers WHERE _contiguous")
        fold.con.execute(f"CREATE VIEW held AS SELECT {columns} FROM takers WHERE NOT _contiguous")
    result.conflicts = conflicts
    result.held = int(fold.one("SELECT count(*) FROM held")[0])
    ledgers = sorted({targets[m.name].ledger for m in models})
    helds = sorted({targets[m.name].held for m in models})
    rows_schema = _event_row_schema(fold.schema)
    for i, path in enumerate(ledgers):
        rows = fold.write("SELECT aggregate_id, aggregate_version, event_id, kafka_partition, kafka_offset, "
                          "'rebuild' AS admitted_by FROM admitted", path, arrow_schema(ledger_schema()),
                          ("aggregate_id",))
        result.admitted = rows if i == 0 else result.admitted
    for path in helds:
        fold.write("SELECT * FROM held", path, rows_schema)
    step("sequence", t0, result.events, f"events -> {result.admitted:,} admitted, {result.held:,} held after "
         f"a gap, {result.conflicts:,} version conflict(s), {slow:,} aggregate(s) ranked")

    # 3. each model: its fold of the admitted events, written once, with its bookkeeping.
    for model in models:
        t0 = time.monotonic()
        rows = _fold_model(fold, model, targets[model.name], rows_schema)
        step(model.name, t0, rows)


def _fold_model(fold: _Fold, model: ReadModel, targets, rows_schema) -> int:
    from spark_apps.merge import applied_schema, late_events_schema

    types = ", ".join("'" + t.replace("'", "''") + "'" for t in model.event_types)
    # The fold reads personal values unsealed (``events``); what the rebuild keeps of the events themselves
    # (pending, applied ids) is written from the sealed rows (``events_sealed``).
    fold.con.execute(f"CREATE OR REPLACE VIEW events_sealed AS SELECT * FROM admitted WHERE event_type IN ({types})")
    unsealed = unsealed_select('events_sealed', [f.name for f in fold.schema])
    for name in model.reference_tables:
        fold.con.register(name, fold.reference.arrow(name))
    if model.reference_tables:
        unsealed = enriched_sql(f"({unsealed})", model.reference_tables)
    fold.con.execute(f"CREATE OR REPLACE VIEW events AS {unsealed}")
    schema = arrow_schema(model.schema())
    stats = tuple(model.stats_columns or model.key)
    insert = model.merge_insert or {f.name: f"s.{f.name}" for f in schema}
    select = ", ".join(f'{insert[f.name]} AS "{f.name}"' for f in schema)
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        # The admitted events of an aggregate are its versions 1..n; a model that skipped some event types
        # would see a gap, and (as in the stream) those keys wait in _pending instead of being applied.
        fold.con.execute(f"CREATE OR REPLACE TEMP TABLE folded AS SELECT *, first_version = 1 AND "
                         f"_events = version - first_version + 1 AS _continues FROM ({model.fold_sql})")
        rows = fold.write(f"SELECT {select} FROM folded s WHERE _continues", targets.table, schema, stats)
        key = model.key[0]
        stuck = fold.one("SELECT count(*) FROM folded WHERE NOT _continues")[0]
        pending = "SELECT * FROM events_sealed WHERE false" if not stuck else \
            f"SELECT * FROM events_sealed WHERE aggregate_id IN (SELECT {key} FROM folded WHERE NOT _continues)"
        fold.write(pending, targets.required("pending", model), rows_schema)
        fold.con.execute("DROP TABLE folded")
        return rows
    if model.merge_strategy == INSERT_ONCE:
        keys = ", ".join(f'"{k}"' for k in model.key)
        fold.con.execute(f"CREATE OR REPLACE VIEW folded AS {model.fold_sql}")
        total, distinct = fold.one(f"SELECT count(*), count(DISTINCT hash({keys})) FROM folded")
        source = "folded" if total == distinct else f"(SELECT DISTINCT ON ({keys}) * FROM folded)"
        return fold.write(f"SELECT {select} FROM {source} s", targets.table, schema, stats)
    if model.merge_strategy == WINDOWED_SUM:
        # Where the catch-up's watermark goes on: the newest event time on the clock (capped by its recording
        # and by now), as the stream records it with each MERGE (spark_apps.merge.windowed_watermark).
        newest = fold.one(f"SELECT max(least({model.event_time}, recorded_at, now())) FROM events_sealed")[0]
        metadata = dict(fold.metadata)
        if newest is not None:
            metadata["watermark_newest_event_time"] = newest.astimezone(dt.timezone.utc).isoformat()
        rows = fold.write(f"SELECT {select} FROM ({model.fold_sql}) s", targets.table, schema, stats,
                          metadata=metadata)
        fold.write(f"SELECT event_id, {model.event_time} AS event_time, false AS _late FROM events_sealed",
                   targets.required("applied", model), arrow_schema(applied_schema()))
        # Every late event is in its window now: the generation's late_events holds none of this model's.
        import pyarrow as pa

        late = arrow_schema(late_events_schema())
        fold.write(pa.Table.from_pylist([], schema=late), targets.required("late", model), late,
                   predicate=f"read_model = '{model.name}'")
        return rows
    raise RebuildError(f"read model {model.name}: no rebuild for merge strategy {model.merge_strategy!r}")

