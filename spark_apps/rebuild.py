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
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from read_models.catalog import ARCHIVE_TABLE, SHARED_LATE_EVENTS_TABLE, held_table, ledger_table
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel
from spark_apps.rebuild_errors import RebuildError, RebuildFailed, RebuildRefused

__all__ = ["FoldTargets", "FoldStep", "FoldResult", "RebuildError", "RebuildFailed", "RebuildRefused", "RebuildOutcome",
           "BuildResult", "RebuildLock", "rebuild", "start_generation", "build_generation", "check_generation",
           "switch_generation", "airflow_owner", "lock_path", "warehouse_targets", "archive_position",
           "catch_up_offsets", "fold_archive", "admit_archived", "read_archive", "insert_rows", "rebuild_models"]

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


def fold_archive(spark, settings: Settings, models: list[ReadModel], targets: dict[str, FoldTargets],
                 up_to: dict[int, int] | None = None, log: Callable[[str], None] = print,
                 engine: str | None = None) -> FoldResult:
    """Fold the archived events up to ``up_to`` (partition -> last offset included; default: all archived) into
    ``targets`` (model name -> FoldTargets), each table written whole. Logs one line per step ("[k/n]", with the
    elapsed time) and returns the position, the counts and each step's time.

    ``engine`` (default ``settings.rebuild_engine``): ``duckdb`` folds in this process with each model's
    ``fold_sql`` (``spark_apps.archive_fold``; no Spark job), ``spark`` with each model's ``fold`` on ``spark``.
    DuckDB falls back to Spark, saying why, where it cannot do the job (a model without ``fold_sql``, a URI)."""
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
    total_steps = 2 + len(models)
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
            rows = _fold_model(spark, model, admission.admitted, targets[model.name], metadata)
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
class _Admission:
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


def admit_archived(spark, events) -> _Admission:
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
        return _Admission(events, events.limit(0), total, 0, 0, 0, cached)

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
    return _Admission(admitted, takers.filter("not _contiguous").select(*columns), total, held, conflicts, n_slow,
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


def _fold_model(spark, model: ReadModel, admitted, targets: FoldTargets, metadata: dict) -> int:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_apps.merge import late_events_schema

    mine = admitted.filter(F.col("event_type").isin(*model.event_types))
    stats = model.stats_columns or model.key
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        # The admitted events of an aggregate are its versions 1..n; a model that skipped some event types
        # would see a gap, and (as in the stream) those keys wait in _pending instead of being applied.
        folded = model.fold(mine).withColumn("_continues", (F.col("first_version") == 1) & (
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

        folded = model.fold(mine)
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
        rows = _write(insert_rows(model, model.fold(mine)), targets.table, table_metadata, stats)
        _write(mine.select("event_id", F.col(model.event_time).alias("event_time"), F.lit(False).alias("_late")),
               targets.required("applied", model), metadata)
        # Every late event is in its window now: the generation's late_events holds none of this model's.
        late = spark.createDataFrame([], late_events_schema())
        _write(late, targets.required("late", model), metadata,
               replace_where=f"read_model = '{model.name}'")
        return rows
    raise RebuildError(f"read model {model.name}: no rebuild for merge strategy {model.merge_strategy!r}")


# -- the whole rebuild: fold, catch up, check, switch ------------------------------------------------------------
#
# Four steps, each a function the CLI's ``rebuild()`` calls in one process and the ``rebuild_read_model`` DAG
# calls as its own task (``start_generation`` + ``build_generation`` in ``build``, ``check_generation`` in
# ``check``, ``switch_generation`` in ``switch``). Between them only (name, generation, previous) travels.

@dataclass
class RebuildOutcome:
    name: str
    generation: int  # the new generation (current now, unless a dry run)
    previous: int  # the generation that was current when the rebuild began (kept for rollback)
    switched: bool
    fold: FoldResult
    caught_up_events: int = 0
    seconds: float = 0.0
    check_lines: list[str] = field(default_factory=list)


@dataclass
class BuildResult:
    """What ``build_generation`` did: the fold and the events caught up from Kafka after it."""
    name: str
    generation: int
    fold: FoldResult
    caught_up_events: int = 0
    seconds: float = 0.0


def lock_path(settings: Settings, name: str):
    return settings.home / "locks" / f"rebuild-{name}.lock"


# How long a lock owned by an Airflow run stays taken between two of its tasks (and after its last heartbeat):
# the scheduler starts the next task well within it; a run killed outright frees the model after it.
AIRFLOW_LOCK_LEASE = dt.timedelta(minutes=10)
_HEARTBEAT_S = 60.0


def airflow_owner(dag_id: str, run_id: str) -> str:
    """The lock owner of one Airflow DAG run: every task of that run may take the lock again."""
    return f"airflow:{dag_id}/{run_id}"


class RebuildLock:
    """One rebuild (or maintenance) of a read model at a time: a file created exclusively under the home folder.

    It names its *owner*: a process (the CLI; ``owner`` None) or an Airflow DAG run (``airflow_owner``), whose
    tasks are separate processes. A holder is alive while its process runs on this host or, for a run, while
    its lease lasts (renewed by a heartbeat while a task runs, and set anew by ``hand_over`` when a task ends
    and the next one of the run follows). A live holder refuses everyone else with a clear message; a dead
    one's lock (kill -9, a run killed outright) is taken over. ``resume=True``: the lock must still be this
    owner's (a later task of the same run); if it was lost, RebuildRefused."""

    def __init__(self, settings: Settings, name: str, log: Callable[[str], None] = print, owner: str | None = None,
                 purpose: str = "rebuild", resume: bool = False):
        self.path = lock_path(settings, name)
        self.name = name
        self.log = log
        self.owner = owner
        self.purpose = purpose
        self.resume = resume
        self._heartbeat = None

    # -- the file ---------------------------------------------------------------------------------------------
    def _me(self, lease: bool) -> dict:
        import os
        import socket

        now = dt.datetime.now(dt.timezone.utc)
        me = {"owner": self.owner or f"pid {os.getpid()}", "purpose": self.purpose, "pid": os.getpid(),
              "host": socket.gethostname(), "started": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if self.owner and lease:
            me["lease_until"] = (now + AIRFLOW_LOCK_LEASE).isoformat()
        return me

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def _rewrite(self, me: dict) -> None:
        """Replace the lock's content atomically (a reader sees the old or the new owner record, never half)."""
        import os

        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(me))
        os.replace(tmp, self.path)

    # -- taking and giving back -------------------------------------------------------------------------------
    def acquire(self) -> "RebuildLock":
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            holder = self._holder()
            if self.owner and holder and holder.get("owner") == self.owner:
                self._rewrite({**self._me(lease=True), "started": holder.get("started", "?")})  # the same run
                return self._started()
            if self.resume:
                raise RebuildRefused(
                    f"{self.name}: this run ({self.owner}) no longer holds the rebuild lock {self.path} "
                    + (f"(now held by {_holder_text(holder)})" if holder else "(it was released or taken over)")
                    + "; its generation may have been abandoned; run the rebuild again")
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if holder is None:
                    holder = self._holder()
                if holder and _holder_alive(holder):
                    raise RebuildRefused(
                        f"{self.name}: a {holder.get('purpose', 'rebuild')} of it is already running "
                        f"({_holder_text(holder)}); wait for it to end (or stop it) and run this again") from None
                self.log(f"rebuild: {self.name}: an earlier {holder.get('purpose', 'rebuild') if holder else 'rebuild'}"
                         f" ({_holder_text(holder) if holder else 'unknown holder'}) stopped without finishing; "
                         f"taking over")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._me(lease=True), f)
            return self._started()
        raise RebuildRefused(f"{self.name}: could not take the rebuild lock {self.path}; try again")

    def _started(self) -> "RebuildLock":
        if self.owner:  # a run's lease is renewed while this task works (e.g. a long fold on another host)
            import threading

            stop = threading.Event()

            def beat():
                while not stop.wait(_HEARTBEAT_S):
                    holder = self._holder()
                    if not holder or holder.get("owner") != self.owner:
                        return
                    self._rewrite({**holder, "lease_until": (dt.datetime.now(dt.timezone.utc)
                                                             + AIRFLOW_LOCK_LEASE).isoformat()})

            thread = threading.Thread(target=beat, name=f"rebuild-lock-{self.name}", daemon=True)
            thread.start()
            self._heartbeat = stop
        return self

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.set()
            self._heartbeat = None

    def hand_over(self) -> None:
        """End of a task whose run goes on: keep the lock for the run's next task (lease from now)."""
        self._stop_heartbeat()
        holder = self._holder()
        if holder and holder.get("owner") == self.owner:
            self._rewrite({**holder, "pid": None, "lease_until": (dt.datetime.now(dt.timezone.utc)
                                                                  + AIRFLOW_LOCK_LEASE).isoformat()})

    def release(self) -> None:
        """Give the lock back (only if it is still this owner's)."""
        import os

        self._stop_heartbeat()
        holder = self._holder()
        if holder is None or holder.get("owner") == (self.owner or f"pid {os.getpid()}"):
            self.path.unlink(missing_ok=True)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


_RebuildLock = RebuildLock  # the name it had before runs could own it


def _holder_text(holder: dict) -> str:
    owner = holder.get("owner") or ""
    if owner.startswith("airflow:"):
        lease = holder.get("lease_until")
        return (f"Airflow run {owner[len('airflow:'):]}, started {holder.get('started', '?')}"
                + (f", task pid {holder['pid']}" if holder.get("pid") else "")
                + (f", held until {lease[:19]}Z unless a task of it goes on" if lease else ""))
    return f"pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


def _holder_alive(holder: dict) -> bool:
    import socket

    if holder.get("pid") and holder.get("host") == socket.gethostname() and _alive(holder.get("pid")):
        return True
    lease = holder.get("lease_until")
    if lease:
        try:
            return dt.datetime.fromisoformat(lease) > dt.datetime.now(dt.timezone.utc)
        except ValueError:
            return False
    return False


def _alive(pid) -> bool:
    import os

    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def start_generation(settings: Settings, name: str, by: str, reason: str = "",
                     log: Callable[[str], None] = print):
    """Step 0 (under the model's lock): abandon what an earlier rebuild left unfinished (a killed one, a failed
    run) and reserve the next generation -> (previous current generation number, the new Generation)."""
    import read_models
    from read_models.catalog import Catalog

    read_models.get(name)  # an unknown name fails here, naming the known ones
    catalog = Catalog(settings)
    for leftover in catalog.state(name).unfinished:
        log(f"rebuild: {name}: generation {leftover} was left unfinished by an earlier rebuild; abandoning it")
        catalog.abandon(name, leftover, by, "left unfinished by an earlier rebuild")
        catalog.drop(name, leftover, by, "left unfinished by an earlier rebuild")
    previous = catalog.state(name).current
    generation = catalog.create_next(name, by, reason or "rebuild from the event archive")
    log(f"rebuild: {name}: building generation {generation.number} in {generation.table} while generation "
        f"{previous} keeps serving")
    return previous, generation


def _eta(elapsed: float, done: float, total: float) -> str:
    if done <= 0 or total <= done:
        return "ETA 0s" if total and done >= total else "ETA unknown"
    return f"ETA ~{elapsed * (total - done) / done:.0f}s"


def build_generation(spark, settings: Settings, name: str, number: int, by: str,
                     log: Callable[[str], None] = print) -> BuildResult:
    """Steps 1-3 on a reserved generation: fold the archive into it, catch it up from Kafka, mark it ready (the
    live projection writes it too from its next batch) and catch up once more. Progress lines name the events
    done of the total and an ETA. An error abandons the generation (readers never saw it) and is raised."""
    import read_models
    from read_models.catalog import Catalog
    from spark_apps.spark_projection import Projection

    model = read_models.get(name)
    catalog = Catalog(settings)
    generation = catalog.generation(name, number)
    started = time.monotonic()
    catch_up_name = str(generation.checkpoint.relative_to(settings.checkpoints))
    targets = {name: FoldTargets(
        table=str(generation.table), ledger=str(settings.table_path(ledger_table(catch_up_name))),
        held=str(settings.table_path(held_table(catch_up_name))),
        pending=str(generation.pending) if model.merge_strategy == CURRENT_STATE_BY_VERSION else None,
        applied=str(generation.applied) if model.merge_strategy == WINDOWED_SUM else None,
        late=str(generation.late_events) if model.merge_strategy == WINDOWED_SUM else None)}
    try:
        folded = fold_archive(spark, settings, [model], targets, log=log)
        catalog.record_position(name, number, folded.position, by)
        generation = catalog.generation(name, number)

        def catch_up(step: str) -> int:
            from event_store import kafka_log

            offsets = catch_up_offsets(settings, folded.position)
            ends = {tp.partition: end for tp, end in kafka_log.end_offsets(settings, settings.events_topic).items()}
            waiting = sum(max(0, end - (offsets.get(p, 0) if offsets.get(p, 0) >= 0 else 0))
                          for p, end in ends.items())
            log(f"rebuild: {name}: {step}: up to {waiting:,} record(s) in Kafka after the folded position "
                f"(elapsed {time.monotonic() - started:.0f}s)")
            projection = Projection(spark, settings, [model], log=log, archive=False,
                                    generations={name: generation}, checkpoint=generation.checkpoint,
                                    starting_offsets=offsets)
            run = projection.run_until_caught_up()
            log(f"rebuild: {name}: {step}: {run.input_rows:,} event(s) from Kafka after the archive's position "
                f"in {run.batches} batch(es) (elapsed {time.monotonic() - started:.0f}s)")
            return run.input_rows

        caught = catch_up("catch-up [1/2]")
        catalog.mark_ready(name, number, by)
        caught += catch_up("catch-up [2/2] (the live projection follows it now)")
    except BaseException:
        _abandon_quietly(catalog, name, number, by, "the rebuild stopped with an error", log)
        raise
    return BuildResult(name, number, folded, caught, time.monotonic() - started)


def check_generation(settings: Settings, name: str, number: int, previous: int, by: str,
                     log: Callable[[str], None] = print) -> list[str]:
    """Step 4: the model's suite and the reconciliation on generation ``number`` -> the report lines. A failure
    (or an error) abandons the generation, so readers stay on ``previous``, and raises RebuildFailed."""
    from expectations.checks import verdict
    from read_models.catalog import Catalog

    catalog = Catalog(settings)
    try:
        state = catalog.state(name)
        if number in state.dropped or number in state.abandoned:
            raise RebuildError(f"{name}: generation {number} was abandoned meanwhile (by another rebuild or "
                               f"maintenance); run the rebuild again")
        generation = catalog.generation(name, number)
        log(f"rebuild: {name}: checking generation {number} (its suite and the reconciliation)")
        checked = verdict(settings, name, reconcile=True, generation=generation)
        lines = checked.lines()
        for line in lines:
            log(f"rebuild: {name}: {line}")
    except BaseException:
        _abandon_quietly(catalog, name, number, by, "its check stopped with an error", log)
        raise
    if checked.failed:
        _abandon_quietly(catalog, name, number, by, "failed its checks", log)
        raise RebuildFailed(f"{name}: generation {number} failed its checks; readers stay on generation {previous}",
                            lines)
    return lines


def switch_generation(settings: Settings, name: str, number: int, previous: int, by: str, reason: str = "",
                      dry_run: bool = False, log: Callable[[str], None] = print) -> bool:
    """Step 5: make the checked generation current, a compare-and-set against ``previous`` -> switched. A dry run
    (or a refused switch: another switch or rollback came first) abandons it instead; readers stay."""
    from read_models.catalog import Catalog, CatalogRefused

    catalog = Catalog(settings)
    if dry_run:
        _abandon_quietly(catalog, name, number, by, "dry run: built and checked, not switched", log)
        log(f"rebuild: {name}: generation {number} passed its checks (dry run: not switched, dropped); readers stay "
            f"on generation {previous}")
        return False
    try:
        catalog.switch(name, number, previous, by, reason or "rebuild passed its checks")
    except CatalogRefused as e:
        _abandon_quietly(catalog, name, number, by, f"switch refused: {e}", log)
        raise RebuildError(str(e)) from None
    log(f"rebuild: {name}: generation {number} is current now; generation {previous} is kept for "
        f"`eventlake rollback {name}`")
    return True


def rebuild(spark, settings: Settings, name: str, by: str = "", reason: str = "", dry_run: bool = False,
            log: Callable[[str], None] = print) -> RebuildOutcome:
    """Build the next generation of read model ``name`` while the current one keeps serving, check it, and
    switch readers to it in one catalog commit (issue 9):

    1. fold ``event_archive`` up to the position it has reached, into a new generation (``fold_archive``);
    2. catch the generation up from Kafka after that position (its own checkpoint and sequence ledger);
    3. mark it ``ready``: from its next batch on the live projection writes it too; catch up once more, which
       covers every batch the live projection planned before it saw the mark, so nothing is missing;
    4. its suite and the reconciliation; a failure abandons it (readers stay) and raises RebuildFailed;
    5. switch (a compare-and-set against the generation that was current at the start).

    A rebuild killed at any point leaves readers on a complete generation (only the switch changes what they
    read); running it again abandons what the killed one left and starts over. ``dry_run`` does 1-4 and then
    abandons the generation. Two rebuilds of one model at once: the second raises RebuildRefused."""
    import read_models

    read_models.get(name)
    who = by or "eventlake rebuild"
    started = time.monotonic()
    with RebuildLock(settings, name, log):
        previous, generation = start_generation(settings, name, who, reason, log)
        built = build_generation(spark, settings, name, generation.number, who, log)
        lines = check_generation(settings, name, generation.number, previous, who, log)
        switched = switch_generation(settings, name, generation.number, previous, who, reason, dry_run, log)
        outcome = RebuildOutcome(name, generation.number, previous, switched, built.fold, built.caught_up_events,
                                 time.monotonic() - started, lines)
        log(f"rebuild: {name}: done in {outcome.seconds:.0f}s")
        return outcome


def _abandon_quietly(catalog, name: str, number: int, by: str, reason: str, log: Callable[[str], None]) -> None:
    """Abandon and drop a generation that will not be switched to; a failure here is logged, not raised (the
    next rebuild abandons what is left)."""
    try:
        state = catalog.state(name)
        if number not in state.abandoned and number not in state.dropped:
            catalog.abandon(name, number, by, reason)
        catalog.drop(name, number, by, reason)
    except Exception as e:  # noqa: BLE001 -- the original error matters more
        log(f"rebuild: {name}: could not abandon generation {number} ({e}); the next rebuild will")


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the arguments of :func:`rebuild_models`."""
    import argparse
    import getpass

    parser = argparse.ArgumentParser(prog="rebuild", description=rebuild.__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="read models to rebuild")
    parser.add_argument("--dry-run", action="store_true", help="build and check, but do not switch")
    parser.add_argument("--reason", default="", help="why (kept in the catalog)")
    parser.add_argument("--by", help="who asks (default: the current user)")
    args = parser.parse_args(argv)
    try:
        by = args.by or getpass.getuser()
    except (KeyError, OSError):
        by = "operator"
    return rebuild_models(Settings.load(), args.models, by=by, reason=args.reason, dry_run=args.dry_run)


def rebuild_models(settings: Settings, names: list[str], by: str, reason: str = "", dry_run: bool = False) -> int:
    """Rebuild each of ``names`` in turn (what ``main`` and ``eventlake rebuild`` run); 1 when any of them failed
    its checks or could not start, after trying the others."""
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-rebuild")
    failed = 0
    try:
        for name in names:
            try:
                outcome = rebuild(spark, settings, name, by=by, reason=reason, dry_run=dry_run)
            except RebuildError as e:
                print(f"eventlake rebuild: {e}", file=sys.stderr)
                for line in getattr(e, "lines", ()):
                    print(f"  {line}", file=sys.stderr)
                failed += 1
                continue
            f = outcome.fold
            print(f"rebuild: {name}: generation {outcome.generation} "
                  + ("is current" if outcome.switched else "checked (dry run, not switched)")
                  + f": {f.events:,} archived events folded at {f.events_per_second:,.0f} events/s, "
                    f"{outcome.caught_up_events:,} caught up from Kafka, {outcome.seconds:.0f}s in all")
    finally:
        spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
