"""The one idempotent MERGE used by every current-state read model.

Per batch and read model:
1. the batch's events plus the events still waiting from earlier batches, deduplicated by ``event_id``;
2. per key, only the events that continue the row's version without a gap (v+1, v+2, ...) are folded;
   later ones wait in a small ``_pending`` Delta table until the gap is filled;
3. MERGE with a version guard (``s.first_version = t.version + 1``): a re-run batch, a duplicate or a
   replay of the whole log matches no row and changes nothing;
4. Delta's idempotent-write ids (txnAppId = the projection and model, txnVersion = the batch id) make a
   re-run of an already committed batch a no-op at the table level as well.
The target is written before the pending table, so a crash between the two only leaves pending events
that the next run drops as already applied.
"""
from __future__ import annotations

from pathlib import Path

from read_models.spec import CURRENT_STATE_BY_VERSION, ReadModel

__all__ = ["apply_current_state", "ensure_table", "idempotent_write"]


def ensure_table(spark, path: Path, schema) -> None:
    from delta.tables import DeltaTable

    DeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema).execute()


class idempotent_write:
    """Context manager: DML in this session (MERGE) carries Delta's txnAppId/txnVersion."""

    def __init__(self, spark, app_id: str, version: int):
        self.conf, self.app_id, self.version = spark.conf, app_id, version

    def __enter__(self):
        self.conf.set("spark.databricks.delta.write.txnAppId", self.app_id)
        self.conf.set("spark.databricks.delta.write.txnVersion", str(self.version))

    def __exit__(self, *exc):
        self.conf.unset("spark.databricks.delta.write.txnAppId")
        self.conf.unset("spark.databricks.delta.write.txnVersion")


def apply_current_state(spark, model: ReadModel, events, table_path: Path, pending_path: Path,
                        app_id: str, batch_id: int) -> dict[str, int]:
    """Fold ``events`` (valid event rows of any type) into ``model``'s table; returns counts for progress."""
    from delta.tables import DeltaTable
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if model.merge_strategy != CURRENT_STATE_BY_VERSION:
        raise ValueError(f"read model {model.name}: merge strategy {model.merge_strategy!r} is not "
                         f"{CURRENT_STATE_BY_VERSION!r}")
    mine = events.filter(F.col("event_type").isin(*model.event_types))
    pending = spark.read.format("delta").load(str(pending_path))
    had_pending = not pending.isEmpty()
    candidates = (mine.unionByName(pending) if had_pending else mine)
    # MERGE must never see two source rows for one key: dedup by event id, then by (key, version).
    candidates = candidates.dropDuplicates(["event_id"]).dropDuplicates(["aggregate_id", "aggregate_version"])
    current = (spark.read.format("delta").load(str(table_path))
               .select(F.col(model.key).alias("aggregate_id"), F.col("version").alias("_current")))
    window = Window.partitionBy("aggregate_id").orderBy("aggregate_version")
    ranked = (candidates.join(current, "aggregate_id", "left")
              .withColumn("_current", F.coalesce("_current", F.lit(0)))
              .filter(F.col("aggregate_version") > F.col("_current"))
              .withColumn("_contiguous", F.col("aggregate_version") == F.col("_current") + F.row_number().over(window))
              .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        counts = ranked.groupBy("_contiguous").count().collect()  # also materialises the cache
        applied = sum(r["count"] for r in counts if r["_contiguous"])
        waiting = sum(r["count"] for r in counts if not r["_contiguous"])
        if applied:
            changes = model.fold(ranked.filter("_contiguous"))
            with idempotent_write(spark, f"{app_id}/{model.name}", batch_id):
                (DeltaTable.forPath(spark, str(table_path)).alias("t")
                 .merge(changes.alias("s"), f"t.{model.key} = s.{model.key}")
                 .whenMatchedUpdate(condition="s.first_version = t.version + 1", set=dict(model.merge_update))
                 .whenNotMatchedInsert(condition="s.first_version = 1", values=dict(model.merge_insert))
                 .execute())
        if waiting or had_pending:
            (ranked.filter(~F.col("_contiguous")).drop("_current", "_contiguous")
             .write.format("delta").mode("overwrite")
             .option("txnAppId", f"{app_id}/{model.name}/pending").option("txnVersion", batch_id)
             .save(str(pending_path)))
    finally:
        ranked.unpersist()
    return {"applied": applied, "waiting": waiting}
