"""``merchant_minute_volume``: authorized payments per merchant per event-time minute.

A watermark bounds which windows still change: the end of the minute of the newest event time seen, each
event's time capped by when it was recorded and projected (one payment dated 9998 cannot move it past the
clock; ``spark_apps.merge.windowed_watermark``), minus ``watermark_delay``:
a late payment inside it updates its window; one older than the watermark is not applied here but
recorded in the ``late_events`` table, so nothing is lost and reprocessing can fold it in.
Amounts are summed in minor units as they come (one currency per merchant is assumed).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import WINDOWED_SUM, ReadModel

__all__ = ["MODEL"]

EVENT_TYPES = ("PaymentAuthorized",)


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("merchant_id", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType()),
        StructField("payments", LongType()),
        StructField("amount_minor", LongType()),
        StructField("updated_at", TimestampType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    start = F.date_trunc("minute", F.col("occurred_at"))
    return (events.groupBy("merchant_id", start.alias("window_start"))
            .agg(F.count(F.lit(1)).alias("payments"), F.sum("amount_minor").cast("long").alias("amount_minor"),
                 F.max("recorded_at").alias("updated_at"))
            .withColumn("window_end", F.col("window_start") + F.expr("INTERVAL 1 MINUTE")))


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT merchant_id, date_trunc('minute', occurred_at) AS window_start, count(*) AS payments,
       sum(amount_minor) AS amount_minor, max(recorded_at) AS updated_at,
       date_trunc('minute', occurred_at) + INTERVAL 1 MINUTE AS window_end
FROM events GROUP BY merchant_id, date_trunc('minute', occurred_at)
"""


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    """Every authorized payment counted once in its minute: what the table plus ``late_events`` must add up to."""
    seen: set[str] = set()
    rows: dict[tuple, dict[str, Any]] = defaultdict(lambda: {"payments": 0, "amount_minor": 0})
    for e in events:
        if e.event_type not in EVENT_TYPES or e.event_id in seen:
            continue
        seen.add(e.event_id)
        start = parse_time(e.occurred_at, "occurred_at").replace(second=0, microsecond=0, tzinfo=None)
        row = rows[(e.payload["merchant_id"], start)]
        row["payments"] += 1
        row["amount_minor"] += e.payload["amount_minor"]
    return dict(rows)


MODEL = ReadModel(
    name="merchant_minute_volume",
    key=("merchant_id", "window_start"),
    event_types=EVENT_TYPES,
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=WINDOWED_SUM,
    python_fold=python_fold,
    merge_update={"payments": "t.payments + s.payments", "amount_minor": "t.amount_minor + s.amount_minor",
                  "updated_at": "greatest(t.updated_at, s.updated_at)"},
    merge_insert={"merchant_id": "s.merchant_id", "window_start": "s.window_start", "window_end": "s.window_end",
                  "payments": "s.payments", "amount_minor": "s.amount_minor", "updated_at": "s.updated_at"},
    event_time="occurred_at",
    watermark_delay="10 minutes",
    stats_columns=("merchant_id", "window_start", "window_end"),
    description="authorized payments and amount per merchant per event-time minute, with a watermark",
)
