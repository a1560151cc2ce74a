"""``category_minute_volume``: authorized payments per merchant category (MCC) per event-time minute.

The category is the merchant's as of the payment's time (``dim_merchant``, joined by ``read_models.enrichment``
as ``payments`` joins it); a payment whose merchant the dimension did not know when it was projected counts
under ``UNKNOWN_CATEGORY`` until the backfill moves it to its category (a reprocess of its windows).
Windows, watermark and late events as for ``merchant_minute_volume`` (the windowed-sum strategy).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from event_store.envelope import EventEnvelope, parse_time
from read_models.enrichment import MERCHANT_TABLE, MerchantHistory
from read_models.spec import WINDOWED_SUM, ReadModel

__all__ = ["MODEL", "UNKNOWN_CATEGORY"]

EVENT_TYPES = ("PaymentAuthorized",)
# The key of a payment whose merchant has no category at its time (an MCC is four digits: no clash).
UNKNOWN_CATEGORY = "unknown"


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("merchant_category", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType()),
        StructField("payments", LongType()),
        StructField("amount_minor", LongType()),
        StructField("updated_at", TimestampType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    start = F.date_trunc("minute", F.col("occurred_at"))
    category = F.coalesce(F.col("merchant_category"), F.lit(UNKNOWN_CATEGORY))
    return (events.groupBy(category.alias("merchant_category"), start.alias("window_start"))
            .agg(F.count(F.lit(1)).alias("payments"), F.sum("amount_minor").cast("long").alias("amount_minor"),
                 F.max("recorded_at").alias("updated_at"))
            .withColumn("window_end", F.col("window_start") + F.expr("INTERVAL 1 MINUTE")))


# The same fold in SQL, for the rebuild and the Python engine (``ReadModel.fold_sql``).
FOLD_SQL = f"""
SELECT coalesce(merchant_category, '{UNKNOWN_CATEGORY}') AS merchant_category,
       date_trunc('minute', occurred_at) AS window_start, count(*) AS payments,
       sum(amount_minor) AS amount_minor, max(recorded_at) AS updated_at,
       date_trunc('minute', occurred_at) + INTERVAL 1 MINUTE AS window_end
FROM events GROUP BY coalesce(merchant_category, '{UNKNOWN_CATEGORY}'), date_trunc('minute', occurred_at)
"""


def python_fold(events: Iterable[EventEnvelope], reference: Mapping[str, list] | None = None
                ) -> dict[tuple, dict[str, Any]]:
    """Every authorized payment counted once in its category's minute."""
    merchants = MerchantHistory((reference or {}).get(MERCHANT_TABLE, ()))
    seen: set[str] = set()
    rows: dict[tuple, dict[str, Any]] = defaultdict(lambda: {"payments": 0, "amount_minor": 0})
    for e in events:
        if e.event_type not in EVENT_TYPES or e.event_id in seen:
            continue
        seen.add(e.event_id)
        at = parse_time(e.occurred_at, "occurred_at")
        category = merchants.attributes(e.payload["merchant_id"], at)["merchant_category"] or UNKNOWN_CATEGORY
        row = rows[(category, at.replace(second=0, microsecond=0, tzinfo=None))]
        row["payments"] += 1
        row["amount_minor"] += e.payload["amount_minor"]
    return dict(rows)


MODEL = ReadModel(
    name="category_minute_volume",
    key=("merchant_category", "window_start"),
    event_types=EVENT_TYPES,
    reference_tables=(MERCHANT_TABLE,),
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=WINDOWED_SUM,
    python_fold=python_fold,
    merge_update={"payments": "t.payments + s.payments", "amount_minor": "t.amount_minor + s.amount_minor",
                  "updated_at": "greatest(t.updated_at, s.updated_at)"},
    merge_insert={"merchant_category": "s.merchant_category", "window_start": "s.window_start",
                  "window_end": "s.window_end", "payments": "s.payments", "amount_minor": "s.amount_minor",
                  "updated_at": "s.updated_at"},
    event_time="occurred_at",
    watermark_delay="10 minutes",
    stats_columns=("merchant_category", "window_start", "window_end"),
    description="authorized payments and amount per merchant category (MCC, as of the payment) per event-time "
                "minute, with a watermark",
)
