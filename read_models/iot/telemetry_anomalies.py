"""``telemetry_anomalies``: one row per anomaly found on a device (from TelemetryAnomalyDetected; insert-once).

The key is (device_id, rule, occurred_at): a finding's event time, which the detector derives from what it
found (the measured_at of the reading that completed an out-of-range run; the moment a silent device's heartbeat
ran out, ``event_store.iot.telemetry_rules``). A silence has no reading, so ``reading_id`` cannot be in the key.
"""
from __future__ import annotations

from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import INSERT_ONCE, ReadModel

__all__ = ["MODEL", "EVENT_TYPES"]

EVENT_TYPES = ("TelemetryAnomalyDetected",)


def _schema():
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("device_id", StringType(), False),
        StructField("rule", StringType(), False),
        StructField("occurred_at", TimestampType(), False),
        StructField("reading_id", StringType()),
        StructField("detected_at", TimestampType()),
        StructField("evidence", StringType()),
        StructField("event_id", StringType()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    return events.select(F.col("aggregate_id").alias("device_id"), "rule", "occurred_at", "reading_id",
                         F.col("recorded_at").alias("detected_at"), "evidence", "event_id")


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT aggregate_id AS device_id, rule, occurred_at, reading_id, recorded_at AS detected_at, evidence, event_id
FROM events
"""


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.event_type not in EVENT_TYPES:
            continue
        occurred_at = parse_time(e.occurred_at, "occurred_at").replace(tzinfo=None)
        key = (e.aggregate_id, e.payload["rule"], occurred_at)
        if key in rows:
            continue
        rows[key] = {"device_id": key[0], "rule": key[1], "occurred_at": occurred_at,
                     "reading_id": e.payload.get("reading_id"),
                     "detected_at": parse_time(e.recorded_at, "recorded_at").replace(tzinfo=None),
                     "evidence": e.payload.get("evidence"), "event_id": e.event_id}
    return rows


MODEL = ReadModel(
    name="telemetry_anomalies",
    key=("device_id", "rule", "occurred_at"),
    event_types=EVENT_TYPES,
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=INSERT_ONCE,
    python_fold=python_fold,
    stats_columns=("device_id", "rule", "occurred_at"),
    description="one row per anomaly found on a device (out-of-range run, silence), with the evidence",
)
