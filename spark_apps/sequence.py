"""The sequence gate: the events every read model of a projection applies, decided once per batch.

The vectorised twin of ``read_models.sequence`` (its pure rule, which the tests and the reconciliation use):
each aggregate's events once, in version order, without a gap; a different event at a version already taken
is a version conflict and goes to the dead letters naming both event ids; events after a gap wait in
``_sequence_held/<projection>`` until the gap is filled. Because every model of the projection reads the
same admitted events, no model can count an event another one ignores.

Bookkeeping per projection: ``_sequence/<projection>``, the ledger of admitted (aggregate_id,
aggregate_version, event_id) with the batch that admitted them; an event id it holds counts once, whatever
version a later record with that id claims. The ledger is written before the read models,
so a batch re-run after a crash finds its own admissions there (``admitted_by``) and hands them on again; the
models' writes are idempotent. Common path (every aggregate's events continue its head without a repeat):
one aggregation of the batch and one of the ledger's heads, no sort, no window.
"""
from __future__ import annotations

from typing import NamedTuple

from read_models.catalog import DEAD_LETTER_TABLE, held_table, ledger_table

__all__ = ["ledger_schema", "admit", "Admission", "VERSION_CONFLICT"]

# How the reason of a version conflict's dead letter starts (a conflict quarantines nothing: the first event
# at a version counts, on both sides).
VERSION_CONFLICT = "version conflict"


def ledger_schema():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    return StructType([StructField("aggregate_id", StringType()), StructField("aggregate_version", LongType()),
                       StructField("event_id", StringType()), StructField("kafka_partition", IntegerType()),
                       StructField("kafka_offset", LongType()), StructField("admitted_by", StringType())])


class Admission(NamedTuple):
    events: object  # the admitted events (a DataFrame of event rows)
    conflicts: int
    waiting: int


def admit(ctx, events, projection: str) -> Admission:
    """The events of this batch (valid event rows, ``spark_apps.events``) that the read models apply."""
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
