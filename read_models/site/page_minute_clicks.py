"""``page_minute_clicks``: page views per site, page and event-time minute (clicks per page per minute).

A window is the minute of the view's ``viewed_at`` (the event's ``occurred_at``), whenever the view arrived. A
watermark bounds which windows still change, as for ``merchant_minute_volume`` and ``device_minute_readings`` (the
windowed-sum strategy, ``spark_apps.merge``): a late view inside it updates its window; one older than the watermark
is not applied here but recorded in ``late_events`` and folded in by reprocessing. Each event counts once (the
strategy's applied-ids ledger); a view re-sent under a new command_id is a new event and counts again, so senders
derive the command_id from the site and the view id.

Views only, no distinct visitors: the windowed-sum MERGE adds a batch's partial row to the stored one, and a
distinct count does not add up (a visitor seen in two batches would be counted twice; the sum of per-batch
distinct counts is only an upper bound). An exact count needs every window's set of visitors, which the table
would then have to hold (a row per site, page, minute and visitor: an insert-once model, counted at query time),
and an approximate one a mergeable sketch (HyperLogLog) that is not a plain column of this strategy. Either is a
model of its own, not a column here.
"""
from __future__ import annotations

from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import WINDOWED_SUM, ReadModel

__all__ = ["MODEL", "EVENT_TYPES"]

EVENT_TYPES = ("PageViewed",)


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("site_id", StringType(), False),
        StructField("page", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType()),
        StructField("views", LongType()),
        StructField("updated_at", TimestampType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    start = F.date_trunc("minute", F.col("occurred_at"))
    return (events.groupBy(F.col("aggregate_id").alias("site_id"), F.col("page"), start.alias("window_start"))
            .agg(F.count(F.lit(1)).alias("views"), F.max("recorded_at").alias("updated_at"))
            .withColumn("window_end", F.col("window_start") + F.expr("INTERVAL 1 MINUTE")))


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT aggregate_id AS site_id, page, date_trunc('minute', occurred_at) AS window_start, count(*) AS views,
       max(recorded_at) AS updated_at, date_trunc('minute', occurred_at) + INTERVAL 1 MINUTE AS window_end
FROM events GROUP BY aggregate_id, page, date_trunc('minute', occurred_at)
"""

MERGE_UPDATE = {
    "views": "t.views + s.views",
    "updated_at": "greatest(t.updated_at, s.updated_at)",
}
MERGE_INSERT = {
    "site_id": "s.site_id", "page": "s.page", "window_start": "s.window_start", "window_end": "s.window_end",
    "views": "s.views", "updated_at": "s.updated_at",
}


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    """Every view counted once in its page's minute: what the table plus ``late_events`` must add up to."""
    seen: set[str] = set()
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.event_type not in EVENT_TYPES or e.event_id in seen:
            continue
        seen.add(e.event_id)
        start = parse_time(e.occurred_at, "occurred_at").replace(second=0, microsecond=0, tzinfo=None)
        key = (e.aggregate_id, e.payload["page"], start)
        row = rows.setdefault(key, {"views": 0})
        row["views"] += 1
    return rows


MODEL = ReadModel(
    name="page_minute_clicks",
    key=("site_id", "page", "window_start"),
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
    stats_columns=("site_id", "page", "window_start", "window_end"),
    description="page views per site, page and event-time minute (clicks per page per minute), watermark",
)
