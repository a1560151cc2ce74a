"""Step 1 of a rebuild: fold the ``event_archive`` into fresh tables of read models, whole, in one batch.

The archive holds every valid event as columns (no JSON to parse). Up to a log position (per partition, the
last offset folded), the sequence rule (``read_models.sequence``) is applied once over the whole set, then each
model's table is written once (an overwrite, no MERGE) from its own vectorised ``fold`` and ``merge_insert``,
so its rows are those the streaming projection makes from the same admitted events. Beside each table goes
the bookkeeping a streaming catch-up started at that position (``Projection(starting_offsets=...)``) needs
to go on exactly: the sequence ledger and held events as they stand there, ``_pending`` (current state) and
``_applied`` / ``late_events`` (windowed). Every path is explicit (``FoldTargets``), so a catalog can hand in
a new generation's folders while the current one keeps serving.

Windowed models: a rebuild folds every admitted event into its window, late ones included (that is what a
rebuild is for). Their ``_applied`` ledger lists every event folded (``_late`` false), so the catch-up never
counts one twice, and the generation's ``late_events`` holds no row of the model: table plus late events is
still the fold of the log (``tests/oracle.windowed_with_late``). The table's commit records the newest event
time on the clock, from which the catch-up's watermark goes on.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Callable

from event_store.sealing import Unsealer
from spark_apps.reference_join import with_reference
from spark_apps.unsealing import unsealed
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from projection_core.rebuild_errors import RebuildError
from projection_core.reference import ReferenceTables
from read_models.catalog import ARCHIVE_TABLE, SHARED_LATE_EVENTS_TABLE, held_table, ledger_table
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel

__all__ = ["REBUILD_ENGINES", "fold_steps", "FoldTargets", "FoldStep", "FoldResult", "Admission", "warehouse_targets",
           "read_archive", "archive_position", "catch_up_offsets", "fold_archive", "admit_archived", "insert_rows"]

# How a rebuild folds the archive (``fold_archive``'s ``engine``).
REBUILD_ENGINES = ("duckdb", "spark")
# Aggregates whose events need the ranked (window) path are joined by broadcast below this many.
_BROADCAST_KEYS = 100_000


@dataclass(frozen=True)
class FoldTargets:
    """Where the fold writes one read model (Delta table paths or URIs). ``ledger`` and ``held`` are the
    sequence bookkeeping of the projection that will catch up (models sharing one give the same paths; each
    distinct path is written once)."""
    table: str
    ledger: str  # _sequence/<projection>
    held: str  # _sequence_held/<projection>
    pending: str | None = None  # CURRENT_STATE_BY_VERSION: events waiting for an earlier version
    applied: str | None = None  # WINDOWED_SUM: the event ids folded in
    late: str | None = None  # WINDOWED_SUM: late events (the model's rows only are replaced)

    def required(self, what: str, model: ReadModel) -> str:
        """The ``what`` target (``pending``, ``applied``, ``late``) that ``model``'s merge strategy writes."""
        path = getattr(self, what)
        if not path:
            raise RebuildError(f"read model {model.name} ({model.merge_strategy}) needs a {what} target")
        return path


@dataclass(frozen=True)
class FoldStep:
    name: str
    seconds: float
    rows: int  # events read / admitted, or rows written


@dataclass
class FoldResult:
    position: dict[int, int]  # per partition, the last archived offset folded: the catch-up starts after it
    events: int = 0  # archived events read (duplicates included)
    admitted: int = 0
    held: int = 0  # after a gap: waiting in the held table
    conflicts: int = 0  # a different event at a taken version (already dead-lettered by the live projection)
    steps: list[FoldStep] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def step_seconds(self) -> dict[str, float]:
        return {s.name: s.seconds for s in self.steps}


def warehouse_targets(settings: Settings, models: list[ReadModel], projection: str | None = None) \
        -> dict[str, FoldTargets]:
    """The targets where a ``Projection`` of ``models`` with ``settings`` keeps its tables (its ledger is named
    after the projection: ``projection-<model>+<model>...``)."""
    projection = projection or "projection-" + "+".join(m.name for m in models)
    path = lambda name: str(settings.table_path(name))  # noqa: E731
    return {m.name: FoldTargets(
        table=path(m.name), ledger=path(ledger_table(projection)), held=path(held_table(projection)),
        pending=path(f"_pending/{m.name}") if m.merge_strategy == CURRENT_STATE_BY_VERSION else None,
        applied=path(f"_applied/{m.name}") if m.merge_strategy == WINDOWED_SUM else None,
        late=path(SHARED_LATE_EVENTS_TABLE) if m.merge_strategy == WINDOWED_SUM else None) for m in models}


def read_archive(spark, settings: Settings):
    path = str(settings.table_path(ARCHIVE_TABLE))
    try:
        return spark.read.format("delta").load(path)
    except Exception as e:  # AnalysisException: not a Delta table
        raise RebuildError(f"cannot rebuild from {path}: no event archive there ({str(e).splitlines()[0][:200]}); "
                           f"run `eventlake project` (its event_archive query) first") from None


def archive_position(spark, settings: Settings) -> dict[int, int]:
    """Per Kafka partition, the highest offset in ``event_archive``. The archive query appends whole batches
    in offset order, so every valid event at or before it is archived."""
    from pyspark.sql import functions as F

    rows = read_archive(spark, settings).groupBy("kafka_partition").agg(F.max("kafka_offset").alias("o")).collect()
    return {int(r["kafka_partition"]): int(r["o"]) for r in rows}


def catch_up_offsets(settings: Settings, position: dict[int, int]) -> dict[int, int]:
    """The first offset a catch-up reads in every partition of the events topic (-2: from the earliest, for a
    partition with nothing folded): ``Projection(starting_offsets=...)``."""
    from event_store import kafka_log

    partitions = [tp.partition for tp in kafka_log.end_offsets(settings, settings.events_topic)]
    unknown = sorted(set(position) - set(partitions))
    if unknown:
        raise RebuildError(f"position names partition(s) {unknown} that {settings.events_topic} does not have "
                           f"(it has {partitions})")
    return {p: position[p] + 1 if p in position else -2 for p in partitions}


def fold_steps(models: list[ReadModel]) -> int:
    """How many steps ``fold_archive`` takes for ``models``: reading the archive, the sequence rule, one per model."""
    return 2 + len(models)


def fold_archive(spark, settings: Settings, models: list[ReadModel], targets: dict[str, FoldTargets],
                 up_to: dict[int, int] | None = None, log: Callable[[str], None] = print,
                 engine: str | None = None, on_step: Callable[[int, int], None] | None = None) -> FoldResult:
    """Fold the archived events up to ``up_to`` (partition -> last offset included; default: all archived) into
    ``targets`` (model name -> FoldTargets), each table written whole. Logs one line per step ("[k/n]", with the
    elapsed time) and returns the position, the counts and each step's time.

    ``engine`` (default ``settings.rebuild_engine``): ``duckdb`` folds in this process with each model's
    ``fold_sql`` (``spark_apps.archive_fold``; no Spark job), ``spark`` with each model's ``fold`` on ``spark``.
    DuckDB falls back to Spark, saying why, where it cannot do the job (a model without ``fold_sql``, a URI).
    ``on_step(done, total)`` is called after each step, with the line (a rebuild's progress, pushed while it runs)."""
    from spark_apps import archive_fold

    missing = [m.name for m in models if m.name not in targets]
    if missing:
        raise RebuildError(f"fold_archive: no targets for {', '.join(missing)}")
    engine = engine or settings.rebuild_engine
    if engine not in REBUILD_ENGINES:
        raise RebuildError(f"unknown rebuild engine {engine!r}; known: {', '.join(REBUILD_ENGINES)}")
    if engine == "duckdb":
        paths = [str(settings.table_path(ARCHIVE_TABLE))] + [p for t in targets.values() for p in
                                                               (t.table, t.ledger, t.held, t.pending, t.applied, t.late)
                                                               if p]
        why_not = archive_fold.supports(models, paths)
        if why_not:
            log(f"rebuild: folding in Spark, not DuckDB: {why_not}")
            engine = "spark"
    started = time.monotonic()
    ledgers = sorted({targets[m.name].ledger for m in models})
    helds = sorted({targets[m.name].held for m in models})
    total_steps = fold_steps(models)
    result = FoldResult(position={})

    estimated = _archived_events(settings)

    def step(name: str, t0: float, rows: int, detail: str = "") -> None:
        # Every step reads all the events folded: progress is steps done over all events; the ETA assumes the
        # steps left take as long as the average step so far.
        seconds = time.monotonic() - t0
        result.steps.append(FoldStep(name, seconds, rows))
        elapsed = time.monotonic() - started
        events = result.events or estimated
        done = len(result.steps)
        log(f"rebuild: [{done}/{total_steps}] {name}: {rows:,} {detail or 'rows'} in {seconds:.1f}s "
            f"({done}/{total_steps} steps over {'' if result.events else '~'}{events:,} events done; "
            f"elapsed {elapsed:.1f}s, {_eta(elapsed, done, total_steps)})")
        if on_step is not None:
            on_step(done, total_steps)

    # 1. read: where the fold stops, and the archive's columns up to there.
    t0 = time.monotonic()
    archived = archive_fold.archive_position(settings) if engine == "duckdb" else archive_position(spark, settings)
    position = dict(archived) if up_to is None else {int(p): int(o) for p, o in up_to.items()}
    beyond = {p: o for p, o in position.items() if o > archived.get(p, -1)}
    if beyond:
        raise RebuildError(f"cannot fold up to {_offsets_text(beyond)}: the archive ends at "
                           f"{_offsets_text(archived) or 'nothing'} (its query has not got that far yet)")
    result.position = position
    if engine == "duckdb":
        step("read", t0, len(position), "partition(s), up to " + (_offsets_text(position) or "nothing"))
        archive_fold.fold_archive(settings, models, targets, position, result, step)
        return _folded(result, models, started, log)
    from pyspark.sql import functions as F

    archive = read_archive(spark, settings)
    within = F.lit(False)
    for p, o in sorted(position.items()):
        within = within | ((F.col("kafka_partition") == p) & (F.col("kafka_offset") <= o))
    events = archive.filter(within)
    step("read", t0, len(position), "partition(s), up to " + (_offsets_text(position) or "nothing"))

    # 2. the sequence rule, once for every model; its ledger and held events as they stand at the position.
    t0 = time.monotonic()
    admission = admit_archived(spark, events)
    result.events, result.conflicts, result.held = admission.events, admission.conflicts, admission.held
    metadata = {"projection": "rebuild", "position": {str(p): o for p, o in sorted(position.items())}}
    ledger_rows = admission.admitted.select("aggregate_id", "aggregate_version", "event_id", "kafka_partition",
                                            "kafka_offset", F.lit("rebuild").alias("admitted_by"))
    try:
        for i, path in enumerate(ledgers):
            rows = _write(ledger_rows, path, metadata, ("aggregate_id",))
            result.admitted = rows if i == 0 else result.admitted
        for path in helds:
            _write(admission.held_rows, path, metadata)
        step("sequence", t0, result.events, f"events -> {result.admitted:,} admitted, {result.held:,} held after "
             f"a gap, {result.conflicts:,} version conflict(s), {admission.slow_aggregates:,} aggregate(s) ranked")

        # 3. each model: its fold of the admitted events, written once, with its bookkeeping.
        for model in models:
            t0 = time.monotonic()
            rows = _fold_model(spark, model, admission.admitted, targets[model.name], metadata,
                               Unsealer(settings), ReferenceTables(settings))
            step(model.name, t0, rows)
    finally:
        admission.release()
    return _folded(result, models, started, log)


def _folded(result: FoldResult, models: list[ReadModel], started: float, log: Callable[[str], None]) -> FoldResult:
    result.seconds = time.monotonic() - started
    log(f"rebuild: folded {result.events:,} archived events into {', '.join(m.name for m in models)} in "
        f"{result.seconds:.1f}s ({result.events_per_second:,.0f} events/s); a catch-up starts after "
        f"{_offsets_text(result.position) or 'nothing'}")
    return result


def _archived_events(settings: Settings) -> int:
    """How many events the archive holds, from its Delta statistics (no Spark job): for progress only."""
    try:
        actions = delta_table(settings.table_path(ARCHIVE_TABLE)).get_add_actions(flatten=True)
        return int(sum(n or 0 for n in actions.column("num_records").to_pylist()))
    except Exception:  # noqa: BLE001 -- a URI delta-rs cannot read, no stats: progress without a total
        return 0


def _offsets_text(position: dict[int, int]) -> str:
    return ", ".join(f"p{p}@{o}" for p, o in sorted(position.items()))


@dataclass
class Admission:
    admitted: object  # DataFrame of event rows
    held_rows: object
    events: int
    held: int
    conflicts: int
    slow_aggregates: int
    cached: list

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()


def admit_archived(spark, events) -> Admission:
    """The sequence rule over the whole set. Cheap checks find the aggregates whose events are exactly versions
    1..n, each once, with no event id seen twice (nearly all): their events are admitted as they are. Only the
    others go through the ranked path: dedup by event id (first in log order), the first event at a version
    takes it, the run of versions from 1 without a gap is admitted, the rest is held."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cached = []
    per_aggregate = events.groupBy("aggregate_id").agg(
        F.min("aggregate_version").alias("_first"), F.max("aggregate_version").alias("_last"),
        F.count(F.lit(1)).alias("_n")).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(per_aggregate)
    total = per_aggregate.agg(F.sum("_n")).collect()[0][0] or 0
    irregular = per_aggregate.filter((F.col("_first") != 1) | (F.col("_n") != F.col("_last"))).select("aggregate_id")
    # A version or an event id that comes twice (a duplicate, a conflict, a reused id): found by counting 64-bit
    # hashes, one long per row through the shuffle. Equal values hash equal, so none is missed; a collision
    # only sends a few more aggregates down the ranked path.
    hashes = events.select("aggregate_id", F.explode(F.array(
        F.xxhash64("aggregate_id", "aggregate_version"), F.xxhash64("event_id"))).alias("_h"))
    repeated = (hashes.groupBy("_h").count().filter("count > 1").select("_h")
                .persist(StorageLevel.MEMORY_AND_DISK))
    cached.append(repeated)
    n_repeated = repeated.count()
    slow = irregular
    if n_repeated:
        repeated_join = F.broadcast(repeated) if n_repeated < _BROADCAST_KEYS else repeated
        slow = slow.unionByName(hashes.join(repeated_join, "_h", "left_semi").select("aggregate_id"))
    slow = slow.distinct().persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(slow)
    n_slow = slow.count()
    columns = events.columns
    if n_slow == 0:
        return Admission(events, events.limit(0), total, 0, 0, 0, cached)

    slow_join = F.broadcast(slow) if n_slow < _BROADCAST_KEYS else slow
    fast = events.join(slow_join, "aggregate_id", "left_anti")
    mine = events.join(slow_join, "aggregate_id", "left_semi")
    log_order = ("kafka_partition", "kafka_offset")
    # Every event sharing an id with another is in ``mine`` (its hash repeats), so this dedup is global.
    once = Window.partitionBy("event_id").orderBy(*log_order)
    first = Window.partitionBy("aggregate_id", "aggregate_version").orderBy(*log_order)
    ranked = (mine.withColumn("_once", F.row_number().over(once)).filter("_once = 1")
              .withColumn("_rank", F.row_number().over(first)).drop("_once")
              .persist(StorageLevel.MEMORY_AND_DISK))
    cached.append(ranked)
    conflicts = ranked.filter("_rank > 1").count()
    order = Window.partitionBy("aggregate_id").orderBy("aggregate_version")
    # Versions are distinct among the takers: version == its rank in the aggregate exactly while no gap came.
    takers = (ranked.filter("_rank = 1")
              .withColumn("_contiguous", F.col("aggregate_version") == F.row_number().over(order))
              .persist(StorageLevel.MEMORY_AND_DISK))
    cached.append(takers)
    held = takers.filter("not _contiguous").count()
    admitted = fast.select(*columns).unionByName(takers.filter("_contiguous").select(*columns))
    return Admission(admitted, takers.filter("not _contiguous").select(*columns), total, held, conflicts, n_slow,
                      cached)


def _write(df, path: str, metadata: dict, stats_columns: tuple[str, ...] | None = None,
           replace_where: str | None = None) -> int:
    """One overwrite (a new table, or every row of an old one; with ``replace_where`` only those rows) -> rows
    written. The commit's userMetadata names the rebuild and its position."""
    from deltalake import DeltaTable as RustDeltaTable

    writer = df.write.format("delta").mode("overwrite").option("userMetadata", json.dumps(metadata))
    # A whole table is replaced schema and all; a replaced range keeps the table's schema (others' rows).
    writer = writer.option("replaceWhere", replace_where) if replace_where else writer.option("overwriteSchema", "true")
    if stats_columns:
        writer = writer.option("delta.dataSkippingStatsColumns", ",".join(stats_columns))
    writer.save(path)
    try:  # the commit's own count, read without a Spark job
        return int(RustDeltaTable(path).history(1)[0].get("operationMetrics", {}).get("numOutputRows", -1))
    except Exception:  # e.g. a URI delta-rs is not configured for: the count is for progress only
        return -1


def insert_rows(model: ReadModel, folded):
    """The table's columns from folded rows, as the MERGE's insert clause makes them (``merge_insert``)."""
    from pyspark.sql import functions as F

    schema = model.schema()
    if model.merge_insert:
        exprs = {c: F.expr(e) for c, e in model.merge_insert.items()}
    else:
        exprs = {f.name: F.col(f"s.{f.name}") for f in schema.fields}
    return folded.alias("s").select(*[exprs[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])


def _fold_model(spark, model: ReadModel, admitted, targets: FoldTargets, metadata: dict,
                unsealer: Unsealer, reference: ReferenceTables) -> int:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_apps.merge import late_events_schema

    mine = admitted.filter(F.col("event_type").isin(*model.event_types))
    # The fold reads personal values unsealed; the pending rows and applied ids stay sealed.
    clear = with_reference(unsealed(mine, unsealer), model, reference)
    stats = model.stats_columns or model.key
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        # The admitted events of an aggregate are its versions 1..n; a model that skipped some event types
        # would see a gap, and (as in the stream) those keys wait in _pending instead of being applied.
        folded = model.fold(clear).withColumn("_continues", (F.col("first_version") == 1) & (
            F.col("_events") == F.col("version") - F.col("first_version") + 1)).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            stuck = folded.filter("not _continues").select(F.col(model.key[0]).alias("aggregate_id"))
            pending = mine.limit(0) if stuck.isEmpty() else mine.join(stuck, "aggregate_id", "left_semi")
            rows = _write(insert_rows(model, folded.filter("_continues")), targets.table, metadata, stats)
            _write(pending, targets.required("pending", model), metadata)
        finally:
            folded.unpersist()
        return rows
    if model.merge_strategy == INSERT_ONCE:
        from spark_apps.merge import may_repeat

        folded = model.fold(clear)
        if may_repeat(folded, *model.key):  # as the stream's MERGE: one row per key
            folded = folded.dropDuplicates(list(model.key))
        return _write(insert_rows(model, folded), targets.table, metadata, stats)
    if model.merge_strategy == WINDOWED_SUM:
        # Where the catch-up's watermark goes on: the newest event time on the clock (capped by its recording
        # and by now), as the stream records it with each MERGE (spark_apps.merge.windowed_watermark).
        on_clock = F.unix_micros(F.least(F.col(model.event_time), F.col("recorded_at"), F.current_timestamp()))
        newest_us = mine.agg(F.max(on_clock)).collect()[0][0]
        newest = None if newest_us is None else (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
                                                 + dt.timedelta(microseconds=newest_us))
        table_metadata = {**metadata, "watermark_newest_event_time": None if newest is None else newest.isoformat()}
        if newest is None:
            table_metadata.pop("watermark_newest_event_time")
        rows = _write(insert_rows(model, model.fold(clear)), targets.table, table_metadata, stats)
        _write(mine.select("event_id", F.col(model.event_time).alias("event_time"), F.lit(False).alias("_late")),
               targets.required("applied", model), metadata)
        # Every late event is in its window now: the generation's late_events holds none of this model's.
        late = spark.createDataFrame([], late_events_schema())
        _write(late, targets.required("late", model), metadata,
               replace_where=f"read_model = '{model.name}'")
        return rows
    raise RebuildError(f"read model {model.name}: no rebuild for merge strategy {model.merge_strategy!r}")


def _eta(elapsed: float, done: float, total: float) -> str:
    if done <= 0 or total <= done:
        return "ETA 0s" if total and done >= total else "ETA unknown"
    return f"ETA ~{elapsed * (total - done) / done:.0f}s"
