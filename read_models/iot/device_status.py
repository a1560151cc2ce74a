"""``device_status``: one row per registered device, its current state (current state by version).

It consumes every device event (even those that change no column, such as DeviceQuarantineResolved) so that
``version`` is the last applied ``aggregate_version`` and versions are applied without gaps.

Readings arrive late and out of order (``measured_at`` is their event time; the log's order is the order the
handler recorded them), so two different "latest" columns are kept, and they differ after a late reading:

- ``last_value_milli``, ``last_reading_id``, ``last_reading_at``: the reading recorded *last*, i.e. the
  ``ReadingRecorded`` with the highest ``aggregate_version`` (log order), and its ``measured_at``;
- ``last_seen_at``: the *newest* ``measured_at`` of any reading of the device (event time), whatever order the
  readings were recorded in. A late reading never moves it back.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from event_store.envelope import EventEnvelope, parse_time
from event_store.iot import DeviceState, evolve
from read_models.spec import CURRENT_STATE_BY_VERSION, ReadModel, version_range

__all__ = ["MODEL", "EVENT_TYPES"]

EVENT_TYPES = ("DeviceRegistered", "ReadingRecorded", "DeviceDecommissioned", "TelemetryAnomalyDetected",
               "DeviceQuarantineResolved")
_STATUS_EVENTS = ("DeviceRegistered", "DeviceDecommissioned")


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("device_id", StringType(), False),
        StructField("site_id", StringType()),
        StructField("sensor_kind", StringType()),
        StructField("unit", StringType()),
        StructField("range_min_milli", LongType()),
        StructField("range_max_milli", LongType()),
        StructField("heartbeat_interval_s", LongType()),
        StructField("status", StringType()),
        StructField("last_value_milli", LongType()),
        StructField("last_reading_id", StringType()),
        StructField("last_reading_at", TimestampType()),
        StructField("last_seen_at", TimestampType()),
        StructField("readings_count", LongType()),
        StructField("anomalies_count", LongType()),
        StructField("version", LongType()),
        StructField("updated_at", TimestampType()),
    ])


def _fold(events):
    """Events -> one row of changes per device (vectorised; no Python per row). Columns a batch does not touch
    are null (counts: 0), and the MERGE keeps the row's values for them."""
    from pyspark.sql import functions as F

    kind = F.col("event_type")
    version = F.col("aggregate_version")
    reading = kind == "ReadingRecorded"
    registered = kind == "DeviceRegistered"

    def latest(cond, value):
        # The value carried by the highest-versioned event that matches cond (null when none does).
        return F.max_by(value, F.when(cond, version))

    def count(cond):
        return F.sum(F.when(cond, F.lit(1)).otherwise(F.lit(0))).cast("long")

    return events.groupBy(F.col("aggregate_id").alias("device_id")).agg(
        *version_range(),
        latest(registered, F.col("site_id")).alias("site_id"),
        latest(registered, F.col("sensor_kind")).alias("sensor_kind"),
        latest(registered, F.col("unit")).alias("unit"),
        latest(registered, F.col("range_min_milli")).alias("range_min_milli"),
        latest(registered, F.col("range_max_milli")).alias("range_max_milli"),
        latest(registered, F.col("heartbeat_interval_s")).alias("heartbeat_interval_s"),
        latest(kind.isin(*_STATUS_EVENTS),
               F.when(kind == "DeviceDecommissioned", F.lit("decommissioned")).otherwise(F.lit("active")))
        .alias("status"),
        latest(reading, F.col("value_milli")).alias("last_value_milli"),
        latest(reading, F.col("reading_id")).alias("last_reading_id"),
        latest(reading, F.col("occurred_at")).alias("last_reading_at"),
        F.max(F.when(reading, F.col("occurred_at"))).alias("last_seen_at"),
        count(reading).alias("readings_count"),
        count(kind == "TelemetryAnomalyDetected").alias("anomalies_count"),
        F.max_by("recorded_at", version).alias("updated_at"),
    )


def _latest(column: str, types: tuple[str, ...]) -> str:
    kinds = ", ".join(f"'{t}'" for t in types)
    return f"arg_max_null({column}, aggregate_version) FILTER (WHERE event_type IN ({kinds}))"


_REGISTERED = ("DeviceRegistered",)
_READING = ("ReadingRecorded",)

# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = f"""
SELECT aggregate_id AS device_id,
       min(aggregate_version) AS first_version, max(aggregate_version) AS version, count(*) AS _events,
       {_latest("site_id", _REGISTERED)} AS site_id,
       {_latest("sensor_kind", _REGISTERED)} AS sensor_kind,
       {_latest("unit", _REGISTERED)} AS unit,
       {_latest("range_min_milli", _REGISTERED)} AS range_min_milli,
       {_latest("range_max_milli", _REGISTERED)} AS range_max_milli,
       {_latest("heartbeat_interval_s", _REGISTERED)} AS heartbeat_interval_s,
       {_latest("CASE WHEN event_type = 'DeviceDecommissioned' THEN 'decommissioned' ELSE 'active' END",
                _STATUS_EVENTS)} AS status,
       {_latest("value_milli", _READING)} AS last_value_milli,
       {_latest("reading_id", _READING)} AS last_reading_id,
       {_latest("occurred_at", _READING)} AS last_reading_at,
       max(occurred_at) FILTER (WHERE event_type = 'ReadingRecorded') AS last_seen_at,
       count(*) FILTER (WHERE event_type = 'ReadingRecorded') AS readings_count,
       count(*) FILTER (WHERE event_type = 'TelemetryAnomalyDetected') AS anomalies_count,
       arg_max_null(recorded_at, aggregate_version) AS updated_at
FROM events GROUP BY aggregate_id
"""

# The "last reading" columns move together: from the batch when it has a reading (its versions all follow the
# row's), else kept. ``last_seen_at`` is the newest event time of both (greatest skips a null side).
_HAS_READING = "s.readings_count > 0"
MERGE_UPDATE = {
    "site_id": "coalesce(s.site_id, t.site_id)",
    "sensor_kind": "coalesce(s.sensor_kind, t.sensor_kind)",
    "unit": "coalesce(s.unit, t.unit)",
    "range_min_milli": "coalesce(s.range_min_milli, t.range_min_milli)",
    "range_max_milli": "coalesce(s.range_max_milli, t.range_max_milli)",
    "heartbeat_interval_s": "coalesce(s.heartbeat_interval_s, t.heartbeat_interval_s)",
    "status": "coalesce(s.status, t.status)",
    "last_value_milli": f"CASE WHEN {_HAS_READING} THEN s.last_value_milli ELSE t.last_value_milli END",
    "last_reading_id": f"CASE WHEN {_HAS_READING} THEN s.last_reading_id ELSE t.last_reading_id END",
    "last_reading_at": f"CASE WHEN {_HAS_READING} THEN s.last_reading_at ELSE t.last_reading_at END",
    "last_seen_at": "greatest(t.last_seen_at, s.last_seen_at)",
    "readings_count": "t.readings_count + s.readings_count",
    "anomalies_count": "t.anomalies_count + s.anomalies_count",
    "version": "s.version",
    "updated_at": "s.updated_at",
}
MERGE_INSERT = {
    "device_id": "s.device_id",
    "site_id": "s.site_id",
    "sensor_kind": "s.sensor_kind",
    "unit": "s.unit",
    "range_min_milli": "s.range_min_milli",
    "range_max_milli": "s.range_max_milli",
    "heartbeat_interval_s": "s.heartbeat_interval_s",
    "status": "coalesce(s.status, 'active')",
    "last_value_milli": "s.last_value_milli",
    "last_reading_id": "s.last_reading_id",
    "last_reading_at": "s.last_reading_at",
    "last_seen_at": "s.last_seen_at",
    "readings_count": "s.readings_count",
    "anomalies_count": "s.anomalies_count",
    "version": "s.version",
    "updated_at": "s.updated_at",
}


def _naive(value: str, what: str):
    return parse_time(value, what).replace(tzinfo=None)


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    """The oracle: dedup by event_id, apply each device's versions 1, 2, ... in order, stop at a gap."""
    seen: set[str] = set()
    by_device: dict[str, dict[int, EventEnvelope]] = defaultdict(dict)
    for e in events:
        if e.event_id in seen or e.event_type not in EVENT_TYPES:
            continue
        seen.add(e.event_id)
        by_device[e.aggregate_id].setdefault(e.aggregate_version, e)
    rows = {}
    for device_id, versions in by_device.items():
        state, updated_at = DeviceState(device_id), None
        last: EventEnvelope | None = None
        last_seen = None
        while state.version + 1 in versions:
            event = versions[state.version + 1]
            state = evolve(state, event)
            updated_at = _naive(event.recorded_at, "recorded_at")
            if event.event_type == "ReadingRecorded":
                last = event
                measured = _naive(event.occurred_at, "occurred_at")
                last_seen = measured if last_seen is None else max(last_seen, measured)
        if state.version == 0:
            continue
        rows[(device_id,)] = {
            "device_id": device_id, "site_id": state.site_id, "sensor_kind": state.sensor_kind,
            "unit": state.unit, "range_min_milli": state.range_min_milli if state.registered else None,
            "range_max_milli": state.range_max_milli if state.registered else None,
            "heartbeat_interval_s": state.heartbeat_interval_s if state.registered else None,
            "status": state.status,
            "last_value_milli": None if last is None else last.payload["value_milli"],
            "last_reading_id": None if last is None else last.payload["reading_id"],
            "last_reading_at": None if last is None else _naive(last.occurred_at, "occurred_at"),
            "last_seen_at": last_seen, "readings_count": state.readings_recorded,
            "anomalies_count": state.anomalies_detected, "version": state.version, "updated_at": updated_at,
        }
    return rows


MODEL = ReadModel(
    name="device_status",
    key=("device_id",),
    event_types=EVENT_TYPES,
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_update=MERGE_UPDATE,
    merge_insert=MERGE_INSERT,
    merge_strategy=CURRENT_STATE_BY_VERSION,
    python_fold=python_fold,
    stats_columns=("device_id", "site_id", "status", "last_seen_at"),
    description="one row per device: registration, status, last reading recorded, last seen (event time), counts",
)
