"""The sequence gate: the events every read model of a projection applies, decided once per batch.

The vectorised twin of ``read_models.sequence`` (its pure rule, which the tests and the reconciliation use):
each aggregate's events once, in version order, without a gap; a different event at a version already taken
is a version conflict and goes to the dead letters naming both event ids; events after a gap wait in
``_sequence_held/<projection>`` until the gap is filled. Because every model of the projection reads the
same admitted events, no model can count an event another one ignores.

With ``sequence_gate = "auto"`` (the default) a projection takes the ledger's gate (below) while its ledger is
small and the heads' once the ledger holds ``sequence_heads_from_mb`` on disk (``GateChoice``): both give the same
verdicts; the ledger's is cheaper on a small ledger, the heads' flat in the log's length.

With ``sequence_gate = "heads"`` a batch is judged against the **heads** of its own aggregates (``_sequence_heads/<projection>``: per aggregate
its last admitted version and that event's id), never against every event ever admitted, so its cost does not
grow with the log (issue 42). What each case needs:

- a record continuing its head (version head+1 ..) is new: an id derives from its record's own fields
  (``event_store.decider.event_id_for``), so a record whose id is its derivation cannot repeat an admitted
  event at another version. The derivation is checked here, vectorised;
- a record at a version at or below its head: the same id as the event holding that version is a duplicate, a
  different one a conflict. At the head the heads table names the holder; below it (a replay, a forged
  record: never on the common path) the ledger is read for those (aggregate, version) keys only;
- a record whose id is not its derivation (a forged copy of another event, an older release's id) is looked up
  by id in the ledger: only such ids, only in a batch that has one.
Left as before: a derived id that a non-derived record carried first (a forger who computed a future event's
id) is not looked up, so the real event counts; the handler counts it as a repeat.

Bookkeeping per projection: ``_sequence/<projection>``, the ledger of admitted (aggregate_id,
aggregate_version, event_id) with the batch that admitted them, kept for its other readers (the Python
engine's index, rebuilds, the lookups above); and the heads table, MERGEd once per batch with the batch's
transaction id after the ledger append. The heads table's row with the empty aggregate id holds the ledger
version the heads reflect: ledger commits after it (the Python engine's batches, which append to the ledger
only) are read from the ledger's commit log, only their added files; anything else there (an overwrite by a
rebuild, an expired log) rebuilds the heads from the whole ledger once. A batch re-run after a crash is judged
against the heads from before its first run (a head it moved keeps its previous version; its own ledger rows
are left out of the catch-up and the lookups), so it admits the same events again; the writes are idempotent.
"""
from __future__ import annotations

from typing import NamedTuple

from event_store.decider import EVENT_ID_NAMESPACE
from lakehouse.settings import SettingsError
from read_models.catalog import DEAD_LETTER_TABLE, heads_table, held_table, ledger_table

__all__ = ["ledger_schema", "heads_schema", "admit", "Admission", "VERSION_CONFLICT", "derived_id",
           "HEADS_SYNC_ROW", "GateChoice", "SEQUENCE_GATES"]

# How the reason of a version conflict's dead letter starts (a conflict quarantines nothing: the first event
# at a version counts, on both sides).
VERSION_CONFLICT = "version conflict"
# The heads table's row holding (as its aggregate_version) the ledger version the heads reflect: no aggregate
# id is empty (event_store.fields.NOT_BLANK).
HEADS_SYNC_ROW = ""
SEQUENCE_GATES = ("auto", "ledger", "heads")
# event_store.decider's namespace of event ids (uuid5): derived_id computes event_id_for in Spark.
_EVENT_ID_NAMESPACE = EVENT_ID_NAMESPACE.bytes


def ledger_schema():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    return StructType([StructField("aggregate_id", StringType()), StructField("aggregate_version", LongType()),
                       StructField("event_id", StringType()), StructField("kafka_partition", IntegerType()),
                       StructField("kafka_offset", LongType()), StructField("admitted_by", StringType())])


def heads_schema():
    """One row per aggregate: its head (last admitted version and event id), the batch that moved it there and
    the head before that batch (what a re-run of that batch is judged against)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("aggregate_id", StringType()), StructField("aggregate_version", LongType()),
                       StructField("event_id", StringType()), StructField("admitted_by", StringType()),
                       StructField("previous_version", LongType()), StructField("previous_event_id", StringType())])


class Admission(NamedTuple):
    events: object  # the admitted events (a DataFrame of event rows)
    conflicts: int
    waiting: int


def derived_id(F):
    """A column: ``event_id_for(aggregate_type, aggregate_id, aggregate_version, command_id)`` of each row."""
    name = F.concat_ws("/", "aggregate_type", "aggregate_id", F.col("aggregate_version").cast("string"),
                       "command_id")
    h = F.sha1(F.concat(F.lit(bytearray(_EVENT_ID_NAMESPACE)), F.encode(name, "UTF-8")))
    # RFC 4122: version 5 in the high nibble of byte 6, variant 10 in the top bits of byte 8.
    variant = F.element_at(F.array(*(F.lit(c) for c in "89ab")),
                           F.conv(F.substring(h, 17, 1), 16, 10).cast("int").bitwiseAND(3) + 1)
    return F.concat(F.substring(h, 1, 8), F.lit("-"), F.substring(h, 9, 4), F.lit("-5"), F.substring(h, 14, 3),
                    F.lit("-"), variant, F.substring(h, 18, 3), F.lit("-"), F.substring(h, 21, 12))


class GateChoice:
    """Which gate a projection's batches take under ``sequence_gate = "auto"``: the heads' once its heads table
    exists (a run before took it: for good, whatever the ledger's size after a rebuild) or its ledger holds
    ``sequence_heads_from_mb`` on disk, else the ledger's. Looked at on a query's first batch and every
    ``EVERY`` batches after (the ledger's size from its Delta log: no Spark job); the gates give the same verdicts,
    so a switch between batches, or a re-run after a crash under the other gate, changes no row."""

    EVERY = 100

    def __init__(self):
        self._gate: str | None = None
        self._looked_at = -1

    def gate(self, ctx, projection: str) -> str:
        setting = ctx.settings.sequence_gate
        if setting not in SEQUENCE_GATES:
            raise SettingsError(f"setting sequence_gate={setting!r} (EVENTLAKE_SEQUENCE_GATE): expected one of "
                                f"{', '.join(SEQUENCE_GATES)}")
        if setting != "auto":
            return setting
        if self._gate != "heads" and (self._gate is None or ctx.batch_id >= self._looked_at + self.EVERY):
            self._looked_at = ctx.batch_id
            try:
                if _has_heads(ctx, projection):  # taken before: the ledger's size need not be read
                    heads = True
                else:
                    mb = ledger_mb(ctx, projection)
                    heads = mb >= ctx.settings.sequence_heads_from_mb
                    if heads:
                        ctx.log(f"{projection}: batch {ctx.batch_id}: the sequence gate reads the heads of the "
                                f"batch's aggregates from now on (its ledger holds {mb:,.0f} MB; "
                                f"sequence_heads_from_mb={ctx.settings.sequence_heads_from_mb})")
            except Exception as e:  # noqa: BLE001 -- a log delta-rs cannot read: the ledger's gate, as before
                ctx.log(f"{projection}: batch {ctx.batch_id}: the size of the sequence ledger could not be read "
                        f"({type(e).__name__}: {e}); the ledger's gate for the next {self.EVERY} batches")
                heads = False
            self._gate = "heads" if heads else "ledger"
        return self._gate


def ledger_mb(ctx, projection: str) -> float:
    """The size on disk of ``projection``'s ledger's current files, in MB (0 when it has none yet)."""
    from deltalake.exceptions import TableNotFoundError

    from lakehouse.storage import delta_table

    try:
        table = delta_table(ctx.path(ledger_table(projection)))
    except TableNotFoundError:
        return 0.0
    return sum(table.get_add_actions(flatten=True).column("size_bytes").to_pylist()) / 2 ** 20


def _has_heads(ctx, projection: str) -> bool:
    from deltalake.exceptions import TableNotFoundError

    from lakehouse.storage import delta_table

    try:
        delta_table(ctx.path(heads_table(projection)))
    except TableNotFoundError:
        return False
    return True


def admit(ctx, events, projection: str, gate: str | None = None) -> Admission:
    """The events of this batch (valid event rows, ``spark_apps.events``) that the read models apply.

    Two gates give the same verdicts (tests/integration/test_sequence_heads.py runs the heads gate, the
    projection tests the default, the ledger's while their ledgers are small): ``"ledger"`` joins the batch with
    the whole ledger; ``"heads"`` reads only its aggregates' heads, flat in the log's length but with more Spark
    jobs per batch, slower on a small ledger (bench/sequence_gate.py, bench/README.md; issue 42). ``gate``: the
    one to take (``GateChoice.gate``); None: the setting ``sequence_gate``, "auto" as ``GateChoice`` decides
    afresh."""
    gate = gate or GateChoice().gate(ctx, projection)
    return _admit_by_heads(ctx, events, projection) if gate == "heads" else _admit_by_ledger(ctx, events, projection)


def _admit_by_ledger(ctx, events, projection: str) -> Admission:
    """The gate of ``sequence_gate = "ledger"``: the batch's ids and heads from a join with the whole ledger."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_apps.merge import may_repeat, rows_or_none

    spark = ctx.spark
    admitted_by = f"{ctx.app_id}/{ctx.batch_id}"
    ledger = spark.read.format("delta").load(ctx.path(ledger_table(projection)))
    held = rows_or_none(spark, ctx.path(held_table(projection)))
    candidates = events if held is None else events.unionByName(held)
    with ctx.timed("sequence: check"):
        if held is not None or may_repeat(candidates, "event_id"):
            # The first record with an id in log order counts (a repeat under another version is no new event).
            first = Window.partitionBy("event_id").orderBy("kafka_partition", "kafka_offset")
            candidates = (candidates.withColumn("_once", F.row_number().over(first))
                          .filter("_once = 1").drop("_once"))
        # An id an earlier batch admitted counts once, wherever its repeat claims to be: a replay at its own
        # version, or a forged copy under another one. A batch re-run after a crash keeps its own admissions.
        ids = candidates.select("event_id")
        admitted_before = (ledger.filter(F.col("admitted_by") != admitted_by).select("event_id")
                           .join(ids, "event_id", "left_semi"))
        # Materialised once: the ledger is read here and only here. Left as a plan, every reader of the admitted
        # events (the ledger append, each read model) would scan the whole ledger again.
        candidates = candidates.join(admitted_before, "event_id", "left_anti").localCheckpoint(eager=True)
        # The heads of this batch's aggregates only: the ledger's other rows are dropped before the aggregation.
        heads = (ledger.join(candidates.select("aggregate_id").distinct(), "aggregate_id", "left_semi")
                 .groupBy("aggregate_id").agg(F.max("aggregate_version").alias("_head")))
        # An aggregate continues its head simply when its versions are head+1 .. last, each once: as many
        # events as distinct versions (else two events share a version: a conflict, even when the count alone
        # would look like a run, as {1, 1', 3} does) and as many as the run is long (else a gap).
        runs = candidates.groupBy("aggregate_id").agg(
            F.min("aggregate_version").alias("_first"), F.max("aggregate_version").alias("_last"),
            F.count(F.lit(1)).alias("_n"), F.count_distinct("aggregate_version").alias("_versions"))
        slow_keys = (runs.join(heads, "aggregate_id", "left")
                     .filter((F.col("_first") != F.coalesce("_head", F.lit(0)) + 1)
                             | (F.col("_n") != F.col("_versions"))
                             | (F.col("_n") != F.col("_last") - F.col("_first") + 1))
                     .select("aggregate_id").persist(StorageLevel.MEMORY_AND_DISK))
        slow = slow_keys.count()
    try:
        if slow == 0 and held is None:  # the common path: everything continues its aggregate's head
            with ctx.timed("sequence: ledger"):
                ctx.append(_ledger_rows(candidates, admitted_by, F), ledger_table(projection))
            return Admission(candidates, 0, 0)
        with ctx.timed("sequence: ranked"):
            fast = candidates.join(F.broadcast(slow_keys) if slow < 100_000 else slow_keys, "aggregate_id",
                                   "left_anti")
            mine = candidates.join(slow_keys, "aggregate_id", "left_semi")
            known = (ledger.join(slow_keys, "aggregate_id", "left_semi")
                     .select("aggregate_id", "aggregate_version", F.col("event_id").alias("_holder"),
                             F.col("admitted_by").alias("_admitted_by")))
            mine = mine.join(known, ["aggregate_id", "aggregate_version"], "left")
            # A version taken in an earlier batch: the same event again (a duplicate; handed on again only when
            # this very batch admitted it before a crash), or a different event (a conflict).
            again = mine.filter((F.col("_holder") == F.col("event_id")) & (F.col("_admitted_by") == admitted_by))
            old_conflicts = mine.filter(F.col("_holder").isNotNull() & (F.col("_holder") != F.col("event_id")))
            new = mine.filter(F.col("_holder").isNull()).drop("_holder", "_admitted_by")
            # A version first seen now: the first record (partition, offset) takes it; the others conflict.
            first = Window.partitionBy("aggregate_id", "aggregate_version").orderBy("kafka_partition", "kafka_offset")
            new = (new.withColumn("_rank", F.row_number().over(first))
                   .withColumn("_holder", F.first("event_id").over(first)))
            new_conflicts = new.filter(F.col("_rank") > 1)
            takers = new.filter(F.col("_rank") == 1).drop("_rank", "_holder")
            order = Window.partitionBy("aggregate_id").orderBy("aggregate_version")
            takers = (takers.join(heads, "aggregate_id", "left")
                      .withColumn("_contiguous", F.col("aggregate_version")
                                  == F.coalesce("_head", F.lit(0)) + F.row_number().over(order))
                      .drop("_head").persist(StorageLevel.MEMORY_AND_DISK))
            columns = events.columns
            conflicts = (old_conflicts.select(*columns, "_holder")
                         .unionByName(new_conflicts.select(*columns, "_holder"))
                         .persist(StorageLevel.MEMORY_AND_DISK))
            admitted = (fast.select(*columns)
                        .unionByName(takers.filter("_contiguous").select(*columns))
                        .unionByName(again.select(*columns)))
            # Computed once, before the ledger and the held table change below, and cut from the tables it was
            # computed from: recomputed afterwards (a cache is not guaranteed to be used, e.g. by the models'
            # own sessions), the held events would be gone and the rest judged against this batch's admissions.
            admitted = admitted.localCheckpoint(eager=True)
            conflict_count = conflicts.count()
            waiting = takers.filter(~F.col("_contiguous")).select(*columns)
            waiting_count = waiting.count()
        try:
            if conflict_count:
                _dead_letter_conflicts(ctx, conflicts, columns, F)
            with ctx.timed("sequence: ledger"):
                # Both kinds of new admission: aggregates that simply continued (fast) and the sorted ones.
                newly = fast.select(*columns).unionByName(takers.filter("_contiguous").select(*columns))
                ctx.append(_ledger_rows(newly, admitted_by, F), ledger_table(projection))
            if waiting_count or held is not None:
                ctx.append(waiting, held_table(projection), mode="overwrite")
        finally:
            takers.unpersist()
            conflicts.unpersist()
        return Admission(admitted, conflict_count, waiting_count)
    finally:
        slow_keys.unpersist()


def _admit_by_heads(ctx, events, projection: str) -> Admission:
    """The gate of ``sequence_gate = "heads"``: the batch judged against its own aggregates' heads."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_apps.merge import may_repeat, rows_or_none

    spark = ctx.spark
    admitted_by = f"{ctx.app_id}/{ctx.batch_id}"
    ledger_path = ctx.path(ledger_table(projection))
    ledger = spark.read.format("delta").load(ledger_path)
    earlier = ledger.filter(F.col("admitted_by") != admitted_by)  # a re-run leaves its own admissions out
    held = rows_or_none(spark, ctx.path(held_table(projection)))
    candidates = events if held is None else events.unionByName(held)
    with ctx.timed("sequence: check"):
        if held is not None or may_repeat(candidates, "event_id"):
            # The first record with an id in log order counts (a repeat under another version is no new event).
            first = Window.partitionBy("event_id").orderBy("kafka_partition", "kafka_offset")
            candidates = (candidates.withColumn("_once", F.row_number().over(first))
                          .filter("_once = 1").drop("_once"))
        keys = candidates.select("aggregate_id").distinct()
        caught_up = _Heads.read(ctx, projection, ledger_path, admitted_by, F)
        heads = caught_up.before(keys)  # (aggregate_id, _head, _head_id): this batch's aggregates only
        # An id that is not its record's derivation may repeat an event admitted anywhere: looked up by id.
        candidates = candidates.withColumn("_derived", F.coalesce(F.col("event_id") == derived_id(F), F.lit(False)))
        foreign = candidates.filter(~F.col("_derived")).select("event_id")
        if foreign.limit(1).count():
            admitted_before = (earlier.select("event_id")
                               .join(F.broadcast(foreign.distinct()), "event_id", "left_semi"))
            candidates = candidates.join(admitted_before, "event_id", "left_anti")
        # Materialised once, with its heads: read here and only here (every reader of the admitted events, the
        # ledger append and each read model, would otherwise compute them again).
        candidates = (candidates.drop("_derived").join(F.broadcast(heads), "aggregate_id", "left")
                      .withColumn("_head", F.coalesce("_head", F.lit(0)))
                      .localCheckpoint(eager=True))
        # An aggregate continues its head simply when its versions are head+1 .. last, each once: as many
        # events as distinct versions (else two events share a version: a conflict, even when the count alone
        # would look like a run, as {1, 1', 3} does) and as many as the run is long (else a gap).
        runs = candidates.groupBy("aggregate_id").agg(
            F.first("_head").alias("_head"),
            F.min("aggregate_version").alias("_first"), F.max("aggregate_version").alias("_last"),
            F.count(F.lit(1)).alias("_n"), F.count_distinct("aggregate_version").alias("_versions"))
        slow_keys = (runs.filter((F.col("_first") != F.col("_head") + 1)
                                 | (F.col("_n") != F.col("_versions"))
                                 | (F.col("_n") != F.col("_last") - F.col("_first") + 1))
                     .select("aggregate_id").persist(StorageLevel.MEMORY_AND_DISK))
        slow = slow_keys.count()
    columns = events.columns
    try:
        if slow == 0 and held is None:  # the common path: everything continues its aggregate's head
            admitted = candidates.select(*columns)
            with ctx.timed("sequence: ledger"):
                ctx.append(_ledger_rows(admitted, admitted_by, F), ledger_table(projection))
            with ctx.timed("sequence: heads"):
                caught_up.write(_moved(candidates, F))
            return Admission(admitted, 0, 0)
        with ctx.timed("sequence: ranked"):
            fast = candidates.join(F.broadcast(slow_keys) if slow < 100_000 else slow_keys, "aggregate_id",
                                   "left_anti")
            mine = candidates.join(slow_keys, "aggregate_id", "left_semi")
            # Who holds a version at or below its head: the head's event, or (below it) the ledger's row.
            at_head = mine.filter(F.col("aggregate_version") == F.col("_head")).select(
                "aggregate_id", "aggregate_version", F.col("_head_id").alias("_holder"))
            below = mine.filter(F.col("aggregate_version") < F.col("_head")).select(
                "aggregate_id", "aggregate_version").distinct()
            known = at_head.distinct()
            if below.limit(1).count():
                known = known.unionByName(
                    earlier.join(F.broadcast(below), ["aggregate_id", "aggregate_version"], "left_semi")
                    .select("aggregate_id", "aggregate_version", F.col("event_id").alias("_holder")))
            mine = mine.join(known, ["aggregate_id", "aggregate_version"], "left")
            # A version taken in an earlier batch: the same event again (a duplicate) or a different one (a
            # conflict).
            old_conflicts = mine.filter(F.col("_holder").isNotNull() & (F.col("_holder") != F.col("event_id")))
            new = mine.filter(F.col("_holder").isNull()).drop("_holder")
            # A version first seen now: the first record (partition, offset) takes it; the others conflict.
            first = Window.partitionBy("aggregate_id", "aggregate_version").orderBy("kafka_partition", "kafka_offset")
            new = (new.withColumn("_rank", F.row_number().over(first))
                   .withColumn("_holder", F.first("event_id").over(first)))
            new_conflicts = new.filter(F.col("_rank") > 1)
            order = Window.partitionBy("aggregate_id").orderBy("aggregate_version")
            takers = (new.filter(F.col("_rank") == 1).drop("_rank", "_holder")
                      .withColumn("_contiguous", F.col("aggregate_version") == F.col("_head")
                                  + F.row_number().over(order))
                      .persist(StorageLevel.MEMORY_AND_DISK))
            conflicts = (old_conflicts.select(*columns, "_holder")
                         .unionByName(new_conflicts.select(*columns, "_holder"))
                         .persist(StorageLevel.MEMORY_AND_DISK))
            newly = fast.unionByName(takers.filter("_contiguous").drop("_contiguous"))
            # Computed once, before the ledger, the heads and the held table change below, and cut from the
            # tables it was computed from: recomputed afterwards (a cache is not guaranteed to be used, e.g. by
            # the models' own sessions), the held events would be gone and the rest judged against this batch's
            # admissions.
            newly = newly.localCheckpoint(eager=True)
            admitted = newly.select(*columns)
            conflict_count = conflicts.count()
            waiting = takers.filter(~F.col("_contiguous")).select(*columns)
            waiting_count = waiting.count()
        try:
            if conflict_count:
                _dead_letter_conflicts(ctx, conflicts, columns, F)
            with ctx.timed("sequence: ledger"):
                ctx.append(_ledger_rows(admitted, admitted_by, F), ledger_table(projection))
            with ctx.timed("sequence: heads"):
                caught_up.write(_moved(newly, F))
            if waiting_count or held is not None:
                ctx.append(waiting, held_table(projection), mode="overwrite")
        finally:
            takers.unpersist()
            conflicts.unpersist()
        return Admission(admitted, conflict_count, waiting_count)
    finally:
        slow_keys.unpersist()


def _moved(admitted, F):
    """Per aggregate this batch admitted events of: its new head and the head before the batch."""
    return admitted.groupBy("aggregate_id").agg(
        F.max("aggregate_version").alias("aggregate_version"),
        F.max_by("event_id", "aggregate_version").alias("event_id"),
        F.first("_head").alias("previous_version"), F.first("_head_id").alias("previous_event_id"))


class _Heads:
    """The heads table of one projection, caught up with the ledger for this batch."""

    def __init__(self, ctx, projection, path, table, catch_up, rebuilt, admitted_by, F):
        self.ctx, self.projection, self.path, self.table = ctx, projection, path, table
        self.catch_up, self.rebuilt, self.admitted_by, self.F = catch_up, rebuilt, admitted_by, F

    @classmethod
    def read(cls, ctx, projection: str, ledger_path: str, admitted_by: str, F) -> "_Heads":
        from delta.tables import DeltaTable

        spark = ctx.spark
        path = ctx.path(heads_table(projection))
        # Deletion vectors: a batch's MERGE marks the rows it replaces instead of rewriting every file holding
        # one of its aggregates.
        (DeltaTable.createIfNotExists(spark).location(path).addColumns(heads_schema())
         .property("delta.dataSkippingStatsColumns", "aggregate_id")
         .property("delta.enableDeletionVectors", "true").execute())
        table = spark.read.format("delta").load(path)
        synced = table.filter(F.col("aggregate_id") == HEADS_SYNC_ROW).select("aggregate_version").collect()
        synced = synced[0][0] if synced else -1
        latest = DeltaTable.forPath(spark, ledger_path).history(1).select("version").collect()[0][0]
        catch_up, rebuilt = None, False
        if latest != synced:
            catch_up = _appended_since(spark, ledger_path, synced, latest) if 0 <= synced < latest else None
            if catch_up is None:  # no heads yet, an overwrite of the ledger, or its commit log expired
                ctx.log(f"{projection}: batch {ctx.batch_id}: the sequence heads reflect ledger version {synced}, "
                        f"the ledger is at {latest}: heads read from the whole ledger once")
                catch_up, rebuilt = spark.read.format("delta").load(ledger_path), True
            catch_up = catch_up.select("aggregate_id", "aggregate_version", "event_id", "admitted_by")
        return cls(ctx, projection, path, None if rebuilt else table, catch_up, rebuilt, admitted_by, F)

    def before(self, keys):
        """(aggregate_id, _head, _head_id) of the aggregates in ``keys`` as they stood before this batch."""
        F = self.F
        parts = []
        if self.table is not None:
            mine = self.table.join(F.broadcast(keys), "aggregate_id", "left_semi")
            moved_here = F.col("admitted_by") == self.admitted_by  # by this batch's first run
            parts.append(mine.select(
                "aggregate_id",
                F.when(moved_here, F.col("previous_version")).otherwise(F.col("aggregate_version")).alias("_v"),
                F.when(moved_here, F.col("previous_event_id")).otherwise(F.col("event_id")).alias("_id")))
        if self.catch_up is not None:
            parts.append(self.catch_up.filter(F.col("admitted_by") != self.admitted_by)
                         .join(F.broadcast(keys), "aggregate_id", "left_semi")
                         .select("aggregate_id", F.col("aggregate_version").alias("_v"), F.col("event_id").alias("_id")))
        if not parts:
            return keys.select("aggregate_id", F.lit(None).cast("long").alias("_head"),
                               F.lit(None).cast("string").alias("_head_id")).limit(0)
        rows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        return (rows.filter(F.col("_v").isNotNull())
                .groupBy("aggregate_id").agg(F.max("_v").alias("_head"), F.max_by("_id", "_v").alias("_head_id"))
                .localCheckpoint(eager=True))

    def write(self, moved) -> None:
        """The heads after this batch (``moved``: ``_moved`` of its admissions, plus what the ledger gained
        from other writers) and the ledger version they reflect, in one idempotent write (transaction id =
        the batch)."""
        from delta.tables import DeltaTable

        F, ctx, spark = self.F, self.ctx, self.ctx.spark
        ledger_path = ctx.path(ledger_table(self.projection))
        version = DeltaTable.forPath(spark, ledger_path).history(1).select("version").collect()[0][0]
        rows = moved.withColumn("admitted_by", F.lit(self.admitted_by))
        if self.catch_up is not None:
            gained = (self.catch_up.groupBy("aggregate_id").agg(
                F.max("aggregate_version").alias("aggregate_version"),
                F.max_by("event_id", "aggregate_version").alias("event_id"),
                F.max_by("admitted_by", "aggregate_version").alias("admitted_by"))
                .join(rows.select("aggregate_id"), "aggregate_id", "left_anti")
                .withColumn("previous_version", F.lit(None).cast("long"))
                .withColumn("previous_event_id", F.lit(None).cast("string")))
            rows = rows.unionByName(gained)
        sync = spark.createDataFrame([(HEADS_SYNC_ROW, version, None, self.admitted_by, None, None)], heads_schema())
        rows = rows.select(*heads_schema().fieldNames()).unionByName(sync)
        name = heads_table(self.projection)
        if self.rebuilt:  # read from the whole ledger: replaces whatever the table held
            ctx.append(rows, name, mode="overwrite")
            return
        with ctx.dml(name):
            (DeltaTable.forPath(spark, self.path).alias("t").merge(rows.alias("s"), "t.aggregate_id = s.aggregate_id")
             .whenMatchedUpdateAll("s.aggregate_version > t.aggregate_version")
             .whenNotMatchedInsertAll().execute())


def _appended_since(spark, ledger_path: str, synced: int, latest: int):
    """The ledger rows committed after version ``synced`` up to ``latest``, read from the files those commits
    added; None when a commit did anything but append or compact (an overwrite) or is gone from the log."""
    from urllib.parse import unquote

    from pyspark.sql import functions as F

    base = ledger_path.rstrip("/")
    commits = [f"{base}/_delta_log/{v:020d}.json" for v in range(synced + 1, latest + 1)]
    try:
        actions = spark.read.json(commits)
    except Exception:  # noqa: BLE001 -- a commit file gone (log expiry): the caller reads the whole ledger
        return None
    if "remove" in actions.columns and actions.filter(F.col("remove.dataChange")).limit(1).count():
        return None
    if "metaData" in actions.columns and actions.filter(F.col("metaData").isNotNull()).limit(1).count():
        return None
    if "add" not in actions.columns:
        return spark.createDataFrame([], ledger_schema())
    paths = [r[0] for r in actions.filter(F.col("add.dataChange")).select("add.path").collect()]
    if not paths:
        return spark.createDataFrame([], ledger_schema())
    files = [p if "://" in p else f"{base}/{unquote(p)}" for p in paths]
    return spark.read.schema(ledger_schema()).parquet(*files)


def _ledger_rows(events, admitted_by: str, F):
    return events.select("aggregate_id", "aggregate_version", "event_id", "kafka_partition", "kafka_offset",
                         F.lit(admitted_by).alias("admitted_by"))


def _dead_letter_conflicts(ctx, conflicts, columns, F) -> None:
    """Version conflicts to the projection's dead letters, with the event as JSON and both event ids."""
    from spark_apps.events import split_checked

    checked = conflicts.select(
        *columns,
        F.format_string(VERSION_CONFLICT + ": version %d of aggregate %s is already taken by event %s; this is a "
                        "different event (%s), applied to no read model", F.col("aggregate_version"),
                        F.col("aggregate_id"), F.col("_holder"), F.col("event_id")).alias("_reason"),
        F.to_json(F.struct(*columns)).cast("binary").alias("_raw"), F.col("aggregate_id").alias("_key"))
    _, dead = split_checked(checked)
    ctx.append(dead, DEAD_LETTER_TABLE, writer="sequence")
