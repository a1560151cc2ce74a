"""The idempotent writes every read model uses, one function per merge strategy (read_models/spec.py).

Common to all: the source is deduplicated inside the batch before MERGE (a MERGE must never see two
source rows for one target row), and every write carries Delta's idempotent-write ids (txnAppId = the
projection and table, txnVersion = the batch id), so a batch that Spark re-runs after a crash changes
nothing that was already committed. Each commit also carries ``userMetadata`` (projection, batch id,
rows) that ``eventlake status`` reads back.

CURRENT_STATE_BY_VERSION, per key: fold only the events that continue the row's version without a gap;
later ones wait in a ``_pending`` table; the MERGE updates a row only when ``s.first_version = t.version + 1``.
INSERT_ONCE: MERGE ... WHEN NOT MATCHED THEN INSERT.
WINDOWED_SUM: events not yet in the model's ``_applied`` ledger are split by the watermark; on-time ones are
added to their window, late ones are recorded in ``late_events``; then the ledger records them all.
The target is always written before its bookkeeping table (pending / applied), so a crash in between
leaves bookkeeping that the re-run batch rewrites, never a row counted twice.

A commit whose post-commit hook fails (e.g. Delta's auto compaction losing a race with another compaction) has
committed: Delta raises after the fact. The write is logged as committed, with the hook's failure, and the batch
goes on; the files are left for the next compaction.

A write that loses a commit race (Delta's optimistic concurrency: maintenance's OPTIMIZE, a reprocess's
``replaceWhere`` or a schema change committed between the write's read and its commit) is not an error of the
batch: ``apply`` runs the model's part of the batch again, up to ``COMMIT_ATTEMPTS`` times. That is the path a
re-run batch takes after a crash: what committed is skipped by its idempotent-write id, the rest is redone
against the table as it now stands.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from read_models.catalog import SHARED_LATE_EVENTS_TABLE, Generation, legacy_generation
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel

__all__ = ["BatchContext", "apply", "commit_conflict", "post_commit_hook_failure", "COMMIT_ATTEMPTS", "ensure_table",
           "bookkeeping_tables", "watermark_delay", "windowed_watermark", "newest_event_time_on_clock", "may_repeat",
           "rows_or_none", "utc_time"]

# How often a model's part of a batch is run when its commits keep losing races, and the pause before each retry.
COMMIT_ATTEMPTS = 6
RETRY_PAUSE_S = (0.5, 1.0, 2.0, 4.0, 8.0)

# Delta's commit conflicts that another run of the same write resolves. Not ConcurrentTransactionException:
# that is another writer with the same idempotent-write id (two copies of one projection), which must stop.
RETRIED_CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException",
                     "ConcurrentDeleteDeleteException", "ConcurrentWriteException", "MetadataChangedException",
                     "DeltaConcurrentModificationException")


def ensure_table(spark, path: Path, schema, stats_columns: tuple[str, ...] | None = None) -> None:
    """Create the Delta table if missing. ``stats_columns``: the columns Delta keeps min/max statistics of for
    data skipping (default: Delta's first 32); statistics on every wide string column cost more to write than
    the Parquet itself, so the tables written per batch name the columns readers filter on. A local table is
    created with delta-rs (``lakehouse.tables.ensure_table``: the same table, in a fraction of a second where
    Spark's CREATE takes seconds, more in a JVM that has not run one yet); one under a storage URI with Spark."""
    from lakehouse.storage import is_remote

    if not is_remote(path):
        from lakehouse.tables import ensure_table as ensure_local_table
        from spark_apps.arrow_rows import arrow_schema

        ensure_local_table(path, arrow_schema(schema), tuple(stats_columns) if stats_columns else None)
        return
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, str(path)):
        # A table made by an older release gains the columns added to ``schema`` since (nullable, at the end:
        # "add columns freely", docs/DESIGN.md), so the MERGEs naming them find them.
        have = set(spark.read.format("delta").load(str(path)).columns)
        missing = [f for f in schema.fields if f.name not in have]
        if missing:
            spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ("
                      f"{', '.join(f'`{f.name}` {f.dataType.simpleString()}' for f in missing)})")
        return
    builder = DeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema)
    if stats_columns:
        builder = builder.property("delta.dataSkippingStatsColumns", ",".join(stats_columns))
    builder.execute()


class BatchContext:
    """Where one projection batch writes, and the ids that make its writes idempotent. ``generations``: the
    read models' generations this batch writes (resolved through the catalog once per batch by the projection;
    a model not in it is at generation 1, the layout from before generations)."""

    def __init__(self, spark, settings, app_id: str, projection: str, batch_id: int, input_rows: int,
                 steps: dict[str, float] | None = None, generations: dict[str, Generation] | None = None,
                 log=None):
        self.spark, self.settings, self.app_id = spark, settings, app_id
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.retries = 0  # parts of this batch run again after losing a commit race
        self.projection, self.batch_id, self.input_rows = projection, batch_id, input_rows
        self.steps = {} if steps is None else steps  # step name -> seconds, summed: where a batch's time goes
        # Event type -> (first, last) occurred_at of the batch's admitted events of that type, as
        # "yyyy-MM-dd HH:mm:ss.SSSSSS" in the session's time zone, when the projection has them (else None).
        self.event_times: dict[str, tuple[str, str]] | None = None
        self.generations = dict(generations or {})

    @property
    def unsealer(self):
        """The readers' ``Unsealer`` (its key store under the home; opened on the first token met)."""
        if getattr(self, "_unsealer", None) is None:
            from event_store.sealing import Unsealer

            self._unsealer = Unsealer(self.settings)
        return self._unsealer

    @property
    def reference(self):
        """The reference tables the folds join (``projection_core.reference``: read with delta-rs when a fold first
        needs one)."""
        if getattr(self, "_reference", None) is None:
            from projection_core.reference import ReferenceTables

            self._reference = ReferenceTables(self.settings)
        return self._reference

    def fold(self, model: ReadModel, events):
        """``model.fold`` of ``events`` with their personal values unsealed (``spark_apps.unsealing``: vectorised,
        null once forgotten) and the model's reference tables joined as of each event's time
        (``spark_apps.reference_join``); what is kept of the events themselves (pending, late, ledgers) stays
        sealed."""
        from spark_apps.reference_join import with_reference
        from spark_apps.unsealing import unsealed

        return model.fold(with_reference(unsealed(events, self.unsealer), model, self.reference))

    def generation(self, model_name: str) -> Generation:
        """The generation of read model ``model_name`` this batch writes: its table and bookkeeping paths."""
        if model_name not in self.generations:
            self.generations[model_name] = legacy_generation(self.settings, model_name)
        return self.generations[model_name]

    @contextmanager
    def timed(self, step: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.steps[step] = self.steps.get(step, 0.0) + time.monotonic() - started

    def path(self, name: str) -> str:
        """A table that is not a read model's (archive, dead letters, sequence ledgers): no generations."""
        return str(self.settings.table_path(name))

    def metadata(self, **extra) -> str:
        return json.dumps({"projection": self.projection, "app_id": self.app_id, "batch_id": self.batch_id,
                           "input_rows": self.input_rows, **extra})

    @contextmanager
    def dml(self, table: str, **metadata):
        """MERGE inside this block (its last statement) is an idempotent write for (projection/table, batch id)."""
        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", f"{self.app_id}/{table}")
        conf.set("spark.databricks.delta.write.txnVersion", str(self.batch_id))
        conf.set("spark.databricks.delta.commitInfo.userMetadata", self.metadata(**metadata))
        try:
            with self._committed_if_only_a_hook_failed(table):
                yield
        finally:
            for key in ("write.txnAppId", "write.txnVersion", "commitInfo.userMetadata"):
                conf.unset(f"spark.databricks.delta.{key}")

    def append(self, df, table: str, mode: str = "append", writer: str | None = None,
               path: Path | None = None) -> None:
        """Append (or overwrite) once per batch; ``writer`` tells apart several writers of one table. ``table``
        names the write (its idempotency id); it is written at ``path`` when given (a generation's
        bookkeeping), else at ``settings.table_path(table)``."""
        # mergeSchema: a table of event rows written by an older release gains the columns added since.
        with self._committed_if_only_a_hook_failed(table):
            (df.write.format("delta").mode(mode).option("mergeSchema", "true")
             .option("txnAppId", f"{self.app_id}/{table}/{writer or ''}").option("txnVersion", self.batch_id)
             .option("userMetadata", self.metadata())
             .save(str(path) if path is not None else self.path(table)))

    @contextmanager
    def _committed_if_only_a_hook_failed(self, table: str):
        """The write in this block committed even if a post-commit hook then failed: log that, go on."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 -- Delta's DELTA_POST_COMMIT_HOOK_FAILED through py4j; else raised
            failure = post_commit_hook_failure(e)
            if failure is None:
                raise
            self.log(f"{self.projection}: batch {self.batch_id}: {table}: committed; then {failure}; "
                     f"the table's small files are left for the next compaction")


def late_events_schema():
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    return StructType([StructField("read_model", StringType()), StructField("event_id", StringType()),
                       StructField("event_type", StringType()), StructField("aggregate_id", StringType()),
                       StructField("event_time", TimestampType()), StructField("watermark", TimestampType()),
                       StructField("event", StringType()), StructField("recorded_at", TimestampType())])


def bookkeeping_tables(model: ReadModel, event_row_schema, generation: Generation) -> dict[Path, object]:
    """The tables (path -> schema) a model's merge strategy needs in ``generation`` besides the model's table."""
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        return {generation.pending: event_row_schema}
    if model.merge_strategy == WINDOWED_SUM:
        return {generation.applied: applied_schema(), generation.late_events: late_events_schema()}
    return {}


def applied_schema():
    """A windowed model's ``_applied`` ledger: each event id folded, its event time, and whether it came late."""
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("event_id", StringType()), StructField("event_time", TimestampType()),
                       StructField("_late", BooleanType())])


def post_commit_hook_failure(error: BaseException) -> str | None:
    """What failed, when ``error`` (or its cause) is Delta's DELTA_POST_COMMIT_HOOK_FAILED: the commit succeeded,
    a hook run after it (auto compaction, a checkpoint) did not. None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        start = text.find("[DELTA_POST_COMMIT_HOOK_FAILED]")
        if start >= 0:
            line = text[start + len("[DELTA_POST_COMMIT_HOOK_FAILED]"):].strip().splitlines()[0]
            hook = line.split("post-commit hook", 1)[-1].strip() if "post-commit hook" in line else line
            return f"its post-commit hook failed: {hook[:500]}"
        error = error.__cause__ or error.__context__
    return None


def commit_conflict(error: BaseException) -> str | None:
    """The name of the Delta commit conflict ``error`` is (or is caused by), if another run resolves it."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names = {cls.__name__ for cls in type(error).__mro__}
        text = str(error)[:2000]
        for name in RETRIED_CONFLICTS:
            if name in names or f"io.delta.exceptions.{name}" in text or f"[DELTA_{_snake(name)}" in text:
                return name
        error = error.__cause__ or error.__context__
    return None


def _snake(name: str) -> str:
    """ConcurrentAppendException -> CONCURRENT_APPEND (the start of Delta's error class)."""
    import re

    words = re.findall(r"[A-Z][a-z]*", name.removesuffix("Exception"))
    return "_".join(w.upper() for w in words)


def apply(ctx: BatchContext, model: ReadModel, events, attempts: int = COMMIT_ATTEMPTS) -> dict[str, int]:
    """Fold ``events`` (valid event rows of any type) into ``model``'s table; returns counts for progress.
    A commit race lost to another writer of the model's tables runs the model's part again (module docstring)."""
    for attempt in range(1, attempts + 1):
        try:
            return _apply_once(ctx, model, events)
        except Exception as e:  # noqa: BLE001 -- only commit conflicts are retried; the rest is raised as is
            conflict = commit_conflict(e)
            if conflict is None or attempt == attempts:
                raise
            pause = RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S)) - 1]
            ctx.retries += 1
            ctx.log(f"{ctx.projection}: batch {ctx.batch_id}: {model.name}: a commit lost a race with another "
                    f"writer ({conflict}); running this model's part of the batch again in {pause:.1f}s "
                    f"(attempt {attempt + 1} of {attempts})")
            time.sleep(pause)
    raise AssertionError("unreachable")


def _apply_once(ctx: BatchContext, model: ReadModel, events) -> dict[str, int]:
    from pyspark.sql import functions as F

    mine = events.filter(F.col("event_type").isin(*model.event_types))
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        return _current_state(ctx, model, mine)
    if mine.isEmpty():
        return {"applied": 0}
    if model.merge_strategy == INSERT_ONCE:
        return _insert_once(ctx, model, mine)
    if model.merge_strategy == WINDOWED_SUM:
        return _windowed_sum(ctx, model, mine)
    raise ValueError(f"read model {model.name}: no writer for merge strategy {model.merge_strategy!r}")


def _merge(ctx: BatchContext, model: ReadModel, source, update_condition=None, insert_condition=None,
           update=True, **metadata) -> None:
    from delta.tables import DeltaTable

    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    builder = DeltaTable.forPath(ctx.spark, str(ctx.generation(model.name).table)).alias("t").merge(source.alias("s"), on)
    if update:
        builder = builder.whenMatchedUpdate(condition=update_condition, set=dict(model.merge_update))
    if model.merge_insert:
        builder = builder.whenNotMatchedInsert(condition=insert_condition, values=dict(model.merge_insert))
    else:
        builder = builder.whenNotMatchedInsertAll(condition=insert_condition)
    with ctx.dml(model.name, **metadata):
        builder.execute()


def _insert_once(ctx: BatchContext, model: ReadModel, events) -> dict[str, int]:
    """Rows are deduplicated (which sorts the batch) only when a key may come twice in it."""
    rows = ctx.fold(model, events)
    key = list(model.key)
    with ctx.timed(f"{model.name}: repeated keys"):
        repeated = may_repeat(rows, *key)
    if repeated:
        rows = rows.dropDuplicates(key)
    with ctx.timed(f"{model.name}: merge"):
        _merge(ctx, model, rows, update=False)
    return {"applied": -1}  # not counted: counting would cost a pass over the batch


def _current_state(ctx: BatchContext, model: ReadModel, events) -> dict[str, int]:
    """One aggregation per batch on the common path; a gap, a replayed version or a waiting (``_pending``)
    event sends only the keys concerned through the ranked path (``_ranked``)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spark = ctx.spark
    key = model.key[0]
    generation = ctx.generation(model.name)
    with ctx.timed(f"{model.name}: repeated versions"):
        pending = rows_or_none(spark, str(generation.pending))
        # A version that comes twice in the batch (a replayed or duplicated record) is rare; only then is the
        # batch deduplicated (which sorts it).
        if may_repeat(events, "aggregate_id", "aggregate_version"):
            events = events.dropDuplicates(["aggregate_id", "aggregate_version"])
    current = (spark.read.format("delta").load(str(generation.table))
               .select(F.col(key), F.col("version").alias("_current")))
    folded = ctx.fold(model, events)
    columns = folded.columns
    folded = folded.join(current, key, "left")
    continues = ((F.coalesce("_current", F.lit(0)) + 1 == F.col("first_version"))
                 & (F.col("_events") == F.col("version") - F.col("first_version") + 1))
    if pending is not None:
        waiting_keys = pending.select(F.col("aggregate_id").alias(key)).distinct().withColumn("_waits", F.lit(True))
        folded = folded.join(F.broadcast(waiting_keys), key, "left")
        continues = continues & F.col("_waits").isNull()
    folded = folded.withColumn("_fast", continues).persist(StorageLevel.MEMORY_AND_DISK)
    ranked = None
    try:
        with ctx.timed(f"{model.name}: fold"):
            counts = {r["_fast"]: r["count"] for r in folded.groupBy("_fast").count().collect()}
        source = folded.filter("_fast").select(*columns)
        applied = waiting = 0
        if counts.get(False) or pending is not None:
            slow_keys = folded.filter(~F.col("_fast")).select(F.col(key).alias("aggregate_id"))
            with ctx.timed(f"{model.name}: ranked keys"):
                ranked, applied, waiting = _ranked(ctx, model, events.join(slow_keys, "aggregate_id", "left_semi"),
                                                   pending)
            if applied:
                contiguous = ranked.filter("_contiguous").drop("_current", "_contiguous")
                source = source.unionByName(ctx.fold(model, contiguous).select(*columns))
        if counts.get(True) or applied:
            with ctx.timed(f"{model.name}: merge"):
                _merge(ctx, model, source, update_condition="s.first_version = t.version + 1",
                       insert_condition="s.first_version = 1")
        # After the MERGE: a crash in between re-runs the batch against the new target, and the version guard
        # keeps from the old pending rows only what is still waiting.
        if ranked is not None and (waiting or pending is not None):
            ctx.append(ranked.filter(~F.col("_contiguous")).drop("_current", "_contiguous"),
                       f"_pending/{model.name}", mode="overwrite", path=generation.pending)
    finally:
        folded.unpersist()
        if ranked is not None:
            ranked.unpersist()
    return {"keys": counts.get(True, 0), "ranked_applied": applied, "waiting": waiting}


def _ranked(ctx: BatchContext, model: ReadModel, events, pending):
    """The slow path for some keys: dedup, drop versions already applied, mark the run of versions that
    continues each row (``_contiguous``); the rest waits. -> (ranked rows, persisted; applied; waiting)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = model.key[0]
    candidates = events.unionByName(pending) if pending is not None else events
    candidates = candidates.dropDuplicates(["event_id"]).dropDuplicates(["aggregate_id", "aggregate_version"])
    current = (ctx.spark.read.format("delta").load(str(ctx.generation(model.name).table))
               .select(F.col(key).alias("aggregate_id"), F.col("version").alias("_current")))
    window = Window.partitionBy("aggregate_id").orderBy("aggregate_version")
    ranked = (candidates.join(current, "aggregate_id", "left")
              .withColumn("_current", F.coalesce("_current", F.lit(0)))
              .filter(F.col("aggregate_version") > F.col("_current"))
              .withColumn("_contiguous", F.col("aggregate_version") == F.col("_current") + F.row_number().over(window))
              .persist(StorageLevel.MEMORY_AND_DISK))
    counts = ranked.groupBy("_contiguous").count().collect()  # also fills the cache
    applied = sum(r["count"] for r in counts if r["_contiguous"])
    waiting = sum(r["count"] for r in counts if not r["_contiguous"])
    return ranked, applied, waiting


def may_repeat(df, *columns: str) -> bool:
    """Whether some value of ``columns`` may occur twice in ``df``: counts of a 64-bit hash of them, one long
    per row through the shuffle. Equal values have equal hashes, so a repeat is never missed; a hash collision
    (about 1 in 10^7 for a million rows) only costs an unneeded dedup."""
    from pyspark.sql import functions as F

    return bool(df.groupBy(F.xxhash64(*columns).alias("_h")).count().filter("count > 1").limit(1).collect())


def rows_or_none(spark, path: str):
    """The Delta table at ``path`` as a DataFrame, or None when it holds no rows (known from its file list, so
    an empty table costs no Spark job)."""
    df = spark.read.format("delta").load(path)
    return df if df.inputFiles() and not df.isEmpty() else None


def _windowed_sum(ctx: BatchContext, model: ReadModel, events) -> dict[str, int]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spark = ctx.spark
    applied_table = f"_applied/{model.name}"
    generation = ctx.generation(model.name)
    ledger = _applied_between(ctx, model, events, spark.read.format("delta").load(str(generation.applied)))
    with ctx.timed(f"{model.name}: watermark"):
        watermark, newest = _watermark_before_batch(ctx, model)
    late = F.col(model.event_time) < F.lit(watermark) if watermark is not None else F.lit(False)
    fresh = (events.dropDuplicates(["event_id"]).join(ledger, "event_id", "left_anti")
             .withColumn("_late", late).persist(StorageLevel.MEMORY_AND_DISK))
    # An event advances the watermark no further than the clocks had reached: its event time capped by its
    # recording (``recorded_at``) and by the processing clock. (Recorded with the MERGE's rows in one commit, so
    # the clock read here cannot make a re-run of this batch differ.)
    on_clock = F.unix_micros(F.least(F.col(model.event_time), F.col("recorded_at"), F.current_timestamp()))
    try:
        with ctx.timed(f"{model.name}: not yet applied"):
            counts = fresh.groupBy("_late").agg(F.count(F.lit(1)).alias("count"),
                                                 F.max(on_clock).alias("newest_on_clock")).collect()
        on_time = sum(r["count"] for r in counts if not r["_late"])
        late_count = sum(r["count"] for r in counts if r["_late"])
        for r in counts:
            if r["newest_on_clock"] is not None:
                t = _EPOCH + dt.timedelta(microseconds=r["newest_on_clock"])
                newest = t if newest is None else max(newest, t)
        if on_time:
            with ctx.timed(f"{model.name}: merge"):
                _merge(ctx, model, ctx.fold(model, fresh.filter(~F.col("_late"))),
                       watermark_before=None if watermark is None else watermark.isoformat(),
                       watermark_newest_event_time=None if newest is None else newest.isoformat())
        if late_count:
            ctx.append(fresh.filter("_late").select(
                F.lit(model.name).alias("read_model"), "event_id", "event_type", "aggregate_id",
                F.col(model.event_time).alias("event_time"), F.lit(watermark).alias("watermark"),
                F.to_json(F.struct(*[c for c in fresh.columns if not c.startswith("_")])).alias("event"),
                F.current_timestamp().alias("recorded_at")), SHARED_LATE_EVENTS_TABLE, writer=model.name,
                path=generation.late_events)
        if on_time or late_count:
            with ctx.timed(f"{model.name}: applied ledger"):
                ctx.append(fresh.select("event_id", F.col(model.event_time).alias("event_time"), "_late"),
                           applied_table, path=generation.applied)
    finally:
        fresh.unpersist()
    return {"applied": on_time, "late": late_count}


# Event times as text, exact to the microsecond, in the session's time zone (UTC) both ways.
EVENT_TIME_FORMAT = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def _applied_between(ctx: BatchContext, model: ReadModel, events, applied):
    """The ids of the ``_applied`` ledger that an event of this batch can repeat: those of its event times only.
    An admitted event id has one event time (the sequence gate admits the first record of an id), so the rest of
    the ledger cannot match; Delta skips its files by their event_time statistics, and a live batch reads the
    ledger's recent files instead of its whole history. Rows without an event time (none are written) are kept."""
    from pyspark.sql import functions as F

    known = ctx.event_times if model.event_time == "occurred_at" else None
    if known is not None:  # from the projection's one pass over the batch (Projection._units_with_events)
        bounds = [known[t] for t in model.event_types if t in known]
        lo, hi = (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (None, None)
    else:
        with ctx.timed(f"{model.name}: event time bounds"):
            lo, hi = events.agg(F.date_format(F.min(model.event_time), EVENT_TIME_FORMAT),
                                F.date_format(F.max(model.event_time), EVENT_TIME_FORMAT)).first()
    if lo is None:
        return applied.select("event_id")
    time = F.col("event_time")
    return (applied.filter(time.isNull() | time.between(F.lit(lo).cast("timestamp"), F.lit(hi).cast("timestamp")))
            .select("event_id"))


def watermark_delay(model: ReadModel) -> dt.timedelta:
    """The model's ``watermark_delay`` ("10 minutes") as a timedelta."""
    amount, unit = model.watermark_delay.split()
    return dt.timedelta(**{unit if unit.endswith("s") else unit + "s": int(amount)})


def windowed_watermark(newest_event_time: dt.datetime | None, delay: dt.timedelta) -> dt.datetime | None:
    """The watermark of a windowed (per-minute) model: the end of the window of the newest event time *on the
    clock*, minus the delay; None (nothing is late) before any. "On the clock": each event's time capped by
    the time it was recorded (``recorded_at``, the handler's clock) and the time it was projected. An event
    dated ahead of those (a payment at 9998-12-31 written straight into the log, a terminal with a skewed
    clock) is counted in its window like any other but moves the watermark only as far as its recording, so
    one outlier cannot make every later event late; a client clock a little ahead still lets it advance."""
    if newest_event_time is None:
        return None
    window_end = newest_event_time.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    return window_end - delay


def newest_event_time_on_clock(history_metadata: list[dict]) -> tuple[bool, dt.datetime | None]:
    """(found, newest event time on the clock) recorded by the newest commit of a windowed model that has it
    (``history_metadata``: the commits' userMetadata, newest first)."""
    for meta in history_metadata:
        if "watermark_newest_event_time" in meta:
            return True, utc_time(meta["watermark_newest_event_time"])
    return False, None


def _watermark_before_batch(ctx: BatchContext, model: ReadModel) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(watermark, newest event time on the clock) as the table stood before this batch. A re-run of a batch
    whose MERGE committed reuses the watermark that commit recorded (its rows were split by it)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = DeltaTable.forPath(ctx.spark, str(ctx.generation(model.name).table))
    metadata = [json.loads(r["userMetadata"]) for r in table.history(5).select("userMetadata").collect()
                if r["userMetadata"]]
    found, newest = newest_event_time_on_clock(metadata)
    if metadata and metadata[0].get("app_id") == ctx.app_id and metadata[0].get("batch_id") == ctx.batch_id:
        return utc_time(metadata[0].get("watermark_before")), newest
    if not found:
        # A table written before the newest event time was recorded: its newest window, capped by the clock.
        # As epoch microseconds: no time zone conversion on the way out of the JVM.
        newest_us = table.toDF().agg(F.max(F.unix_micros("window_start"))).collect()[0][0]
        if newest_us is not None:
            newest = min(_EPOCH + dt.timedelta(microseconds=newest_us), dt.datetime.now(dt.timezone.utc))
    return windowed_watermark(newest, watermark_delay(model)), newest


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def utc_time(text: str | None) -> dt.datetime | None:
    """An ISO time from commit metadata as an aware UTC datetime (earlier versions wrote naive local times)."""
    if text is None:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.timezone.utc)
