"""``device_minute_readings``: readings per device per event-time minute: count, min, max and sum.

Values are integer thousandths of the device's unit (``value_milli``), so ``sum_value_milli / readings`` is the
exact average and sums do not depend on the order readings are added in. A window is the minute of the reading's
``measured_at`` (the event's ``occurred_at``), whenever the reading arrived.

A watermark bounds which windows still change, as for ``merchant_minute_volume`` (the windowed-sum strategy,
``spark_apps.merge``): a late reading inside it updates its window; one older than the watermark is not applied
here but recorded in ``late_events`` and folded in by reprocessing. Count and sum add up across batches; min and
max combine with ``least``/``greatest`` (``merge_update``), which are as order-free as a sum: a window's row is
the same whatever batches its readings came in.
"""
from __future__ import annotations

from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import WINDOWED_SUM, ReadModel

__all__ = ["MODEL", "EVENT_TYPES"]

EVENT_TYPES = ("ReadingRecorded",)


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("device_id", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType()),
        StructField("unit", StringType()),
        StructField("readings", LongType()),
        StructField("min_value_milli", LongType()),
        StructField("max_value_milli", LongType()),
        StructField("sum_value_milli", LongType()),
        StructField("updated_at", TimestampType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    start = F.date_trunc("minute", F.col("occurred_at"))
    return (events.groupBy(F.col("aggregate_id").alias("device_id"), start.alias("window_start"))
            .agg(F.max("unit").alias("unit"), F.count(F.lit(1)).alias("readings"),
                 F.min("value_milli").cast("long").alias("min_value_milli"),
                 F.max("value_milli").cast("long").alias("max_value_milli"),
                 F.sum("value_milli").cast("long").alias("sum_value_milli"),
                 F.max("recorded_at").alias("updated_at"))
            .withColumn("window_end", F.col("window_start") + F.expr("INTERVAL 1 MINUTE")))


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT aggregate_id AS device_id, date_trunc('minute', occurred_at) AS window_start, max(unit) AS unit,
       count(*) AS readings, min(value_milli) AS min_value_milli, max(value_milli) AS max_value_milli,
       sum(value_milli) AS sum_value_milli, max(recorded_at) AS updated_at,
       date_trunc('minute', occurred_at) + INTERVAL 1 MINUTE AS window_end
FROM events GROUP BY aggregate_id, date_trunc('minute', occurred_at)
"""

MERGE_UPDATE = {
    "unit": "coalesce(t.unit, s.unit)",
    "readings": "t.readings + s.readings",
    "min_value_milli": "least(t.min_value_milli, s.min_value_milli)",
    "max_value_milli": "greatest(t.max_value_milli, s.max_value_milli)",
    "sum_value_milli": "t.sum_value_milli + s.sum_value_milli",
    "updated_at": "greatest(t.updated_at, s.updated_at)",
}
MERGE_INSERT = {
    "device_id": "s.device_id", "window_start": "s.window_start", "window_end": "s.window_end", "unit": "s.unit",
    "readings": "s.readings", "min_value_milli": "s.min_value_milli", "max_value_milli": "s.max_value_milli",
    "sum_value_milli": "s.sum_value_milli", "updated_at": "s.updated_at",
}


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    """Every reading counted once in its minute: what the table plus ``late_events`` must add up to."""
    seen: set[str] = set()
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.event_type not in EVENT_TYPES or e.event_id in seen:
            continue
        seen.add(e.event_id)
        start = parse_time(e.occurred_at, "occurred_at").replace(second=0, microsecond=0, tzinfo=None)
        value = e.payload["value_milli"]
        row = rows.get((e.aggregate_id, start))
        if row is None:
            rows[(e.aggregate_id, start)] = {"unit": e.payload["unit"], "readings": 1, "min_value_milli": value,
                                             "max_value_milli": value, "sum_value_milli": value}
            continue
        row["unit"] = max(row["unit"], e.payload["unit"])  # one unit per device; max() as the SQL folds
        row["readings"] += 1
        row["min_value_milli"] = min(row["min_value_milli"], value)
        row["max_value_milli"] = max(row["max_value_milli"], value)
        row["sum_value_milli"] += value
    return rows


MODEL = ReadModel(
    name="device_minute_readings",
    key=("device_id", "window_start"),
    event_types=EVENT_TYPES,
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=WINDOWED_SUM,
    python_fold=python_fold,
    merge_update=MERGE_UPDATE,
    merge_insert=MERGE_INSERT,
    event_time="occurred_at",
    watermark_delay="10 minutes",
    stats_columns=("device_id", "window_start", "window_end"),
    description="readings per device per event-time minute: count, min, max, sum (exact averages), watermark",
)
