"""The projection's Spark engine: Structured Streaming queries from the events topic into Delta read models.

The read models' query: ``foreachBatch`` parses the batch once, appends records that are not valid events
to the dead-letter table, and MERGEs the events into every selected read model (see ``merge``). The archive
query appends every valid event to ``event_archive``. Each keeps its Kafka offsets in its own checkpoint,
so a restart resumes where its last committed batch ended.

Each read model is written in its current generation (read_models/catalog.py), resolved at the start of every
batch: after a switch or a rollback the running projection writes the new current generation from its next
batch, without a restart. A batch that Spark runs again after a crash writes the generations its first run
resolved (kept in the checkpoint), so no generation is left with half a batch. A projection given
``generations`` writes exactly those instead (e.g. a rebuild catching a new generation up before its switch).

The entry point that chooses between this engine and the Python one (``python_engine``) is
``spark_apps.projection``.
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Mapping

from lakehouse.settings import Settings
from projection_core.errors import ProjectionError, ProjectionRun
from projection_core.figures import ARCHIVE_QUERY, READ_MODELS_QUERY
from projection_core.plan import ARCHIVE, ARCHIVE_STATS_COLUMNS, DEAD_LETTERS, HELD, LEDGER, ProjectionPlan
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Generation
from read_models.spec import ReadModel
from spark_apps.events import check_records, parse_events, parsed_row_schema, read_event_records, split_checked
from spark_apps.merge import EVENT_TIME_FORMAT, BatchContext, apply, bookkeeping_tables, ensure_table
from spark_apps import sequence
from spark_apps.progress_figures import ProgressFigures

__all__ = ["Projection", "ProjectionError", "ProjectionRun", "ARCHIVE_STATS_COLUMNS", "QUERY_STOP_TIMEOUT_S",
           "bound_query_stop", "stop_query", "dead_letter_schema", "spark_event_row_schema"]

class Projection:
    """The read models' streaming query, and (``archive=True``, the default when no models are named) the
    archive's own query beside it: appending every event is as much work as the read models' whole batch,
    so it runs with its own checkpoint and never holds the read models back."""

    def __init__(self, spark, settings: Settings, models: list[ReadModel] | None = None,
                 log: Callable[[str], None] = print, archive: bool | None = None,
                 generations: Mapping[str, Generation] | None = None, checkpoint: Path | None = None,
                 starting_offsets: dict[int, int] | None = None):
        """``generations`` (name -> Generation): write these generations of the models, not the current ones;
        ``checkpoint``: the read models' query's checkpoint (default ``checkpoints/projection-<names>``; it
        must lie under the checkpoints folder, as the projection's name is its path there)."""
        self.spark = spark
        # The read models' query starts here when its checkpoint is new (partition -> first offset to read, -2
        # for the earliest; every partition of the topic): a rebuild's catch-up after its fold of the archive.
        self.starting_offsets = starting_offsets
        self.settings = settings
        self.log = log
        self.plan = ProjectionPlan(settings, models, archive=archive, generations=generations, checkpoint=checkpoint,
                                   log=log)
        self.archive, self.models, self.name = self.plan.archive, self.plan.models, self.plan.name
        self.checkpoint, self.archive_checkpoint = self.plan.checkpoint, self.plan.archive_checkpoint
        self.catalog, self.pinned = self.plan.catalog, self.plan.pinned
        self._ensured: set[tuple[str, int]] = set()  # (model, generation) whose tables exist
        self.gate_choice = sequence.GateChoice()  # the sequence gate its batches take (setting sequence_gate)
        self.queries: list = []
        self._tables_ready = False
        self.step_seconds: dict[str, float] = {}
        # Its queries' metrics (batches, records, seconds by step, lag), served by `eventlake project`.
        self.figures = ProgressFigures(settings.events_topic, self.step_seconds, log)
        self._model_sessions: dict = {}  # read model name -> its Spark session for side-by-side writes

    def ensure_tables(self) -> None:
        """Create every table this projection writes, empty, if missing (readers never see a missing table)."""
        event_rows = spark_event_row_schema(self.spark)
        schemas = {DEAD_LETTERS: (dead_letter_schema(), None), ARCHIVE: (event_rows, ARCHIVE_STATS_COLUMNS),
                   LEDGER: (sequence.ledger_schema(), ("aggregate_id",)), HELD: (event_rows, None)}
        tables = {name: schemas[kind] for name, kind in self.plan.fixed_tables().items()}
        _upgrade_dead_letter_table(self.spark, self.settings.table_path(DEAD_LETTER_TABLE), self.log)
        for name, (schema, stats_columns) in tables.items():
            ensure_table(self.spark, self.settings.table_path(name), schema, stats_columns)
        self._ensure_generation_tables(self._resolve())
        self._tables_ready = True

    def _ensure_generation_tables(self, generations: Mapping[str, list[Generation]], spark=None) -> None:
        """Create a generation's table and bookkeeping tables, if missing, the first time it is met."""
        event_rows = None
        for model, generation in self._units(generations):
            if (model.name, generation.number) in self._ensured:
                continue
            event_rows = event_rows or spark_event_row_schema(spark or self.spark)
            ensure_table(spark or self.spark, generation.table, model.schema(), model.stats_columns or model.key)
            for path, schema in bookkeeping_tables(model, event_rows, generation).items():
                ensure_table(spark or self.spark, path, schema)
            self._ensured.add((model.name, generation.number))

    def _resolve(self) -> dict[str, list[Generation]]:
        return self.plan.resolve()

    def _units(self, generations: Mapping[str, list[Generation]]) -> list[tuple[ReadModel, Generation]]:
        return self.plan.units(generations)

    def _generations_for_batch(self, spark, batch_id: int) -> dict[str, list[Generation]]:
        """The generations batch ``batch_id`` writes (``ProjectionPlan.generations_for_batch``), their tables
        created if missing."""
        generations = self.plan.generations_for_batch(batch_id)
        self._ensure_generation_tables(generations, spark)
        return generations

    _app_id = staticmethod(ProjectionPlan.app_id)

    # -- the queries -------------------------------------------------------------------------------
    def _process_batch(self, app_id: str):
        def process(batch, batch_id: int) -> None:
            from pyspark import StorageLevel

            spark = batch.sparkSession  # the query's own session: its conf changes stay in this query
            # JSON parsed once; the cache holds typed event columns (the raw bytes only of bad records).
            checked = check_records(batch).persist(StorageLevel.MEMORY_AND_DISK)
            steps = self.step_seconds
            started = time.monotonic()
            before = dict(steps)
            try:
                events, dead = split_checked(checked)
                generations = self._generations_for_batch(spark, batch_id) if self.models else {}
                ctx = BatchContext(spark, self.settings, app_id, self.name, batch_id, input_rows=-1, steps=steps,
                                   generations={name: gs[0] for name, gs in generations.items()}, log=self.log)
                has_dead = not dead.isEmpty()  # the first pass over the batch: it also fills the cache
                steps["read, parse, cache"] = steps.get("read, parse, cache", 0.0) + time.monotonic() - started
                dead_lettered = 0
                if has_dead:
                    dead_lettered = dead.count()  # over the cache; only in a batch holding bad records
                    ctx.append(dead, DEAD_LETTER_TABLE)
                    self.log(f"projection: batch {batch_id}: record(s) that are not valid events -> "
                             f"dead-letter table {self.settings.table_path(DEAD_LETTER_TABLE)}")
                # The events every read model applies: each aggregate's once, in version order (spark_apps.sequence).
                admission = sequence.admit(ctx, events, self.name, self.gate_choice.gate(ctx, self.name))
                if admission.conflicts:
                    self.log(f"projection: batch {batch_id}: {admission.conflicts} version conflict(s) (a different "
                             f"event at a version already taken) -> dead-letter table "
                             f"{self.settings.table_path(DEAD_LETTER_TABLE)}")
                units = self._units(generations) if self.models else []
                applied, newest = 0, None
                if units:
                    units, ctx.event_times, applied, newest = self._units_with_events(units, admission.events)
                if len(units) == 1:
                    model, generation = units[0]
                    ctx.generations = {model.name: generation}
                    counts = [self._apply_timed(ctx, model, admission.events)]
                elif units:
                    counts = self._apply_side_by_side(ctx, units, admission.events)
                else:
                    counts = []
                late = sum(max(0, c.get("late", 0)) for c in counts if c)
                self.figures.batch_outcomes(
                    READ_MODELS_QUERY, batch_id,
                    {"applied": applied, "late": late, "dead_lettered": dead_lettered + admission.conflicts},
                    held=admission.waiting, newest_event_at=newest)
                self.log(_batch_line(batch_id, time.monotonic() - started, before, steps))
            finally:
                checked.unpersist()
        return process

    @staticmethod
    def _units_with_events(units: list[tuple[ReadModel, Generation]], events):
        """The units whose read model folds an event type among the batch's admitted events (held events an
        earlier batch kept back included): with several domains, a batch of one domain's events leaves the
        others' models alone (no Spark job, no commit: there is nothing for them to apply). And each type's first
        and last event time, which the windowed models read their applied-ids ledger by. One pass over the
        admitted events, which the sequence gate has materialised; it also counts them and finds the newest
        ``recorded_at`` (the projection's metrics). -> (units, event times by type, events, newest recorded_at as
        Unix time or None)."""
        from pyspark.sql import functions as F

        rows = events.groupBy("event_type").agg(
            F.date_format(F.min("occurred_at"), EVENT_TIME_FORMAT).alias("first"),
            F.date_format(F.max("occurred_at"), EVENT_TIME_FORMAT).alias("last"),
            F.count(F.lit(1)).alias("events"), F.unix_micros(F.max("recorded_at")).alias("newest")).collect()
        times = {r["event_type"]: (r["first"], r["last"]) for r in rows}
        newest = max((r["newest"] for r in rows if r["newest"] is not None), default=None)
        return ([(model, generation) for model, generation in units if set(times).intersection(model.event_types)],
                times, sum(r["events"] for r in rows), None if newest is None else newest / 1e6)

    def _apply_timed(self, ctx: BatchContext, model: ReadModel, events) -> dict[str, int]:
        with ctx.timed(model.name):
            return apply(ctx, model, events)

    def _apply_side_by_side(self, ctx: BatchContext, units: list[tuple[ReadModel, Generation]],
                            events) -> list[dict[str, int]]:
        """Every read model's writes at once (each generation it writes: the current one and any followed),
        one thread and one Spark session each (its own conf, so each MERGE carries its own idempotent-write ids),
        reading the batch's admitted events (over the one cached batch) through a global temporary view. While
        one model's commit runs on the driver, another's tasks keep the cores busy."""
        from concurrent.futures import ThreadPoolExecutor

        spark = ctx.spark
        view = f"eventlake_batch_{ctx.app_id}_{ctx.batch_id}"
        events.createOrReplaceGlobalTempView(view)

        def run(model: ReadModel, generation: Generation) -> dict[str, int]:
            key = (model.name, generation.number)
            session = self._model_sessions.get(key)
            if session is None:  # one per model and generation for the projection's life (sessions pile up)
                session = self._model_sessions[key] = spark.newSession()
            events = session.table(f"global_temp.{view}")
            own = BatchContext(session, self.settings, ctx.app_id, ctx.projection, ctx.batch_id, ctx.input_rows,
                               steps=ctx.steps, generations={model.name: generation}, log=ctx.log)
            own.event_times = ctx.event_times
            return self._apply_timed(own, model, events)

        try:
            with ThreadPoolExecutor(max_workers=len(units), thread_name_prefix="read-model") as pool:
                futures = [pool.submit(run, model, generation) for model, generation in units]
                # a failed model fails the batch; Spark re-runs it, the writes are idempotent
                return [future.result() for future in futures]
        finally:
            spark.catalog.dropGlobalTempView(view)

    def _archive_batch(self, app_id: str):
        def process(batch, batch_id: int) -> None:
            events, _ = parse_events(batch)  # records that are not events: the read models' query dead-letters them
            BatchContext(batch.sparkSession, self.settings, app_id, f"projection-{ARCHIVE_TABLE}", batch_id,
                         input_rows=-1).append(events, ARCHIVE_TABLE)
        return process

    def _start_query(self, name: str, checkpoint: Path, process, until_caught_up: bool,
                     max_offsets_per_trigger: int | None):
        s = self.settings
        bound_query_stop(self.spark)
        starting = "earliest"
        if self.starting_offsets is not None and checkpoint == self.checkpoint:
            starting = json.dumps({s.events_topic: {str(p): o for p, o in sorted(self.starting_offsets.items())}})
        records = read_event_records(self.spark, s, max_offsets_per_trigger, starting)
        query_name = name.replace("+", "_").replace("-", "_")
        self.figures.track(query_name, READ_MODELS_QUERY if checkpoint == self.checkpoint else ARCHIVE_QUERY)
        writer = (records.writeStream.queryName(query_name)
                  .foreachBatch(process(self._app_id(checkpoint, name)))
                  .option("checkpointLocation", str(checkpoint)))
        writer = writer.trigger(availableNow=True) if until_caught_up else writer.trigger(
            processingTime=s.trigger_interval)
        query = writer.start()
        self.queries.append(query)
        self.log(f"projection: {name} started from {s.events_topic} at {s.bootstrap_servers} "
                 f"(checkpoint {checkpoint})")
        return query

    def start(self, until_caught_up: bool = False, max_offsets_per_trigger: int | None = None):
        """Start the streaming queries; with ``until_caught_up`` they stop by themselves at the log's current
        end. Returns the read models' query (``self.queries`` holds all)."""
        if not self._tables_ready:
            self.ensure_tables()
        self.figures.attach(self.spark)
        query = None
        if self.models:
            query = self._start_query(self.name, self.checkpoint, self._process_batch, until_caught_up,
                                      max_offsets_per_trigger)
        if self.archive:
            archive = self._start_query(f"projection-{ARCHIVE_TABLE}", self.archive_checkpoint, self._archive_batch,
                                        until_caught_up, max_offsets_per_trigger)
            query = query or archive
        if query is None:
            raise ValueError("nothing to project: no read models and no archive")
        return query

    def stop(self) -> None:
        """Stop every query, each within ``QUERY_STOP_TIMEOUT_S``: a query waiting for an absent broker is left
        behind (it ends with this process), and nothing of its unfinished batch is committed."""
        for query in self.queries:
            if query.isActive:
                stop_query(query, self.log)
        self.figures.detach(self.queries)
        self.queries = []

    def await_termination(self, stop_requested: threading.Event | None = None) -> None:
        """Until a query fails (its error is raised, the others stopped), all have stopped, or ``stop_requested``
        is set (e.g. by SIGTERM; noticed within a second or two, whatever the queries wait for): then every
        query is stopped. A batch cut short commits nothing; the next start redoes it from the checkpoint."""
        try:
            with self._explained_failures():
                while any(q.isActive for q in self.queries):
                    if stop_requested is not None and stop_requested.is_set():
                        return
                    for q in self.queries:
                        q.awaitTermination(1)  # raises the query's failure
                for q in self.queries:
                    q.awaitTermination()
        finally:
            self.stop()

    @contextmanager
    def _explained_failures(self):
        """A gap in the log (records deleted by retention or by hand before the projection read them) stops the
        query (``failOnDataLoss``); say so in the user's terms instead of only Spark's."""
        try:
            yield
        except Exception as e:
            text = str(e)
            if "failOnDataLoss" in text or "data may have been lost" in text.lower():
                raise ProjectionError(
                    f"projection stopped: records of {self.settings.events_topic} that it had not read yet are gone "
                    f"from Kafka (retention or deleted records), so the read models would silently miss events. "
                    f"Nothing was written past the gap. To go on: rebuild the read models from {ARCHIVE_TABLE} if "
                    f"it holds those events, or accept the gap by removing the checkpoint {self.checkpoint} and "
                    f"projecting from the log's current start. Spark's report: {text.splitlines()[0][:400]}"
                ) from e
            raise

    def run_until_caught_up(self, progress_every_s: float = 5.0,
                            max_offsets_per_trigger: int | None = None) -> ProjectionRun:
        """Project everything committed to the log so far, printing progress, then stop. The figures are the
        read models' query (the archive's when it runs alone), timed from the queries' start."""
        self.ensure_tables()
        started = time.monotonic()
        main = self.start(until_caught_up=True, max_offsets_per_trigger=max_offsets_per_trigger)
        run = ProjectionRun()
        seen: set[int] = set()

        def count_progress():
            for p in main.recentProgress:
                if p["batchId"] not in seen:
                    seen.add(p["batchId"])
                    run.batches += 1
                    run.input_rows += p["numInputRows"]
                    run.batch_ms.append(p["durationMs"].get("addBatch"))

        try:
            with self._explained_failures():
                while main.isActive:
                    main.awaitTermination(progress_every_s)
                    count_progress()
                    if main.isActive:
                        self.log(f"projection: {run.batches} batch(es) done, {run.input_rows} events so far; now: "
                                 f"{main.status['message']} ({time.monotonic() - started:.0f}s)")
                main.awaitTermination()  # re-raises the query's failure, if any
                count_progress()
                run.seconds = time.monotonic() - started  # the read models are caught up here
                run.step_seconds = dict(self.step_seconds)
                for q in self.queries:
                    q.awaitTermination()
        finally:
            self.stop()
        return run


# How long stopping a streaming query may take (Spark's spark.sql.streaming.stopTimeout; its default waits for
# ever, and a query waiting for an absent broker does not stop by itself).
QUERY_STOP_TIMEOUT_S = 5


def bound_query_stop(spark) -> None:
    """Queries started after this stop within QUERY_STOP_TIMEOUT_S (or raise, see ``stop_query``)."""
    spark.conf.set("spark.sql.streaming.stopTimeout", f"{QUERY_STOP_TIMEOUT_S}s")


def stop_query(query, log: Callable[[str], None] = print) -> None:
    """Stop ``query``; one that does not stop in time (it waits for the broker) is logged and left to end with the
    process: its checkpoint only ever holds committed batches, so the next start redoes the unfinished one."""
    try:
        query.stop()
    except Exception as e:  # noqa: BLE001 -- Spark's TimeoutException, through py4j
        log(f"{query.name or 'query'}: not stopped within {QUERY_STOP_TIMEOUT_S}s ({str(e).splitlines()[0][:200]}); "
            f"left to end with the process (the next start redoes its unfinished batch from the checkpoint)")


def spark_event_row_schema(spark):
    """Schema of the parsed event rows (what waits in a ``_pending`` table)."""
    return parsed_row_schema(spark)


def dead_letter_schema():
    """The event dead letters (``spark_apps.events.DEAD_LETTER_COLUMNS``): ``raw_bytes`` holds the record's exact
    bytes, ``raw_value`` the same as valid UTF-8 text (U+FFFD where they are not), ``raw_value_base64`` as base64."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, \
        TimestampType

    return StructType([StructField("reason", StringType()), StructField("raw_value", StringType()),
                       StructField("raw_value_base64", StringType()), StructField("kafka_topic", StringType()),
                       StructField("kafka_partition", IntegerType()), StructField("kafka_offset", LongType()),
                       StructField("dead_lettered_at", TimestampType()), StructField("raw_bytes", BinaryType()),
                       StructField("kafka_key", StringType())])


def _upgrade_dead_letter_table(spark, path: Path, log: Callable[[str], None]) -> None:
    """A dead-letter table made before ``raw_bytes`` existed gets the column, once, before anything is appended:
    its rows get their bytes back from ``raw_value_base64`` and a ``raw_value`` that is valid UTF-8 (the old one
    was the bytes cast to a string, which DuckDB refuses to read when they are not UTF-8)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, str(path)):
        return  # a new table is created with the whole schema
    if "raw_bytes" in spark.read.format("delta").load(str(path)).columns:
        return
    table = f"delta.`{path}`"
    spark.sql(f"ALTER TABLE {table} ADD COLUMNS (raw_bytes BINARY)")
    spark.sql(f"UPDATE {table} SET raw_bytes = unbase64(raw_value_base64), "
              f"raw_value = make_valid_utf8(CAST(unbase64(raw_value_base64) AS STRING)) WHERE raw_bytes IS NULL")
    log(f"projection: dead-letter table {path} upgraded: column raw_bytes added and filled from raw_value_base64")



def _batch_line(batch_id: int, seconds: float, before: dict[str, float], after: dict[str, float]) -> str:
    """One line per batch: its time and where it went (the read models' steps run side by side, so they add up
    to more than the batch's time)."""
    spent = {step: after[step] - before.get(step, 0.0) for step in after}
    parts = "; ".join(f"{step} {t:.2f}s" for step, t in spent.items() if t >= 0.005)
    return f"projection: batch {batch_id} done in {seconds:.2f}s ({parts or 'nothing to do'})"
