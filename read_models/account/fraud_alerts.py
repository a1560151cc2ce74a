"""``fraud_alerts``: one row per payment and fraud rule that fired (from FraudSuspected; insert-once)."""
from __future__ import annotations

from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import INSERT_ONCE, ReadModel

__all__ = ["MODEL"]

EVENT_TYPES = ("FraudSuspected",)


def _schema():
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("payment_id", StringType(), False),
        StructField("account_id", StringType()),
        StructField("rule", StringType(), False),
        StructField("occurred_at", TimestampType()),
        StructField("detected_at", TimestampType()),
        StructField("evidence", StringType()),
        StructField("event_id", StringType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    return events.select("payment_id", F.col("aggregate_id").alias("account_id"), "rule", "occurred_at",
                         F.col("recorded_at").alias("detected_at"), "evidence", "event_id")


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT payment_id, aggregate_id AS account_id, rule, occurred_at, recorded_at AS detected_at, evidence, event_id
FROM events
"""


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.event_type not in EVENT_TYPES:
            continue
        key = (e.payload["payment_id"], e.payload["rule"])
        if key in rows:
            continue
        rows[key] = {"payment_id": key[0], "account_id": e.aggregate_id, "rule": key[1],
                     "occurred_at": parse_time(e.occurred_at, "occurred_at").replace(tzinfo=None),
                     "detected_at": parse_time(e.recorded_at, "recorded_at").replace(tzinfo=None),
                     "evidence": e.payload.get("evidence"), "event_id": e.event_id}
    return rows


MODEL = ReadModel(
    name="fraud_alerts",
    key=("payment_id", "rule"),
    event_types=EVENT_TYPES,
    personal_columns=("evidence",),
    subject_column="account_id",
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=INSERT_ONCE,
    python_fold=python_fold,
    description="one row per payment and fraud rule that fired, with the evidence",
)
