"""Test helpers for the IoT read models: device event envelopes written by hand, and the same events as rows of
``event_archive`` (a pyarrow table with the archive's columns) for the models' ``fold_sql`` in DuckDB."""
from __future__ import annotations

import datetime as dt
import uuid

from event_store.account.schemas import EVENTS as ACCOUNT_EVENTS
from event_store.envelope import EventEnvelope
from event_store.iot.schemas import EVENTS as IOT_EVENTS
from lakehouse.tables import plain

DAY = "2026-03-01T"


def event(device: str, version: int, kind: str, at: str, payload: dict | None = None, recorded: str | None = None,
          event_id: str | None = None) -> EventEnvelope:
    """A device event; ``at``/``recorded`` are times of day ("12:00:10"); recorded defaults to a second per
    version after noon (log order)."""
    recorded = recorded or (dt.datetime(2026, 3, 1, 13) + dt.timedelta(seconds=version)).strftime("%H:%M:%S")
    return EventEnvelope(
        event_id=event_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{device}/{version}/{kind}")), event_type=kind,
        schema_version=1, aggregate_type="device", aggregate_id=device, aggregate_version=version,
        occurred_at=f"{DAY}{at}.000Z", recorded_at=f"{DAY}{recorded}.000Z", command_id=f"c-{device}-{version}",
        correlation_id=f"c-{device}-{version}", causation_id=f"c-{device}-{version}", payload=payload or {})


def registered(device: str, version: int = 1, at: str = "12:00:00", low: int = 0, high: int = 50_000,
               heartbeat_s: int = 60) -> EventEnvelope:
    return event(device, version, "DeviceRegistered", at, {
        "site_id": f"site-{device}", "sensor_kind": "temperature", "unit": "C", "range_min_milli": low,
        "range_max_milli": high, "heartbeat_interval_s": heartbeat_s})


def reading(device: str, version: int, reading_id: str, value_milli: int, at: str) -> EventEnvelope:
    return event(device, version, "ReadingRecorded", at,
                 {"reading_id": reading_id, "value_milli": value_milli, "unit": "C"})


def anomaly(device: str, version: int, rule: str, at: str, reading_id: str | None = None) -> EventEnvelope:
    return event(device, version, "TelemetryAnomalyDetected", at,
                 {"rule": rule, "reading_id": reading_id, "evidence": f"{rule} at {at}"})


def archive_table(events: list[EventEnvelope], domains_events: tuple = (ACCOUNT_EVENTS, IOT_EVENTS)):
    """``events`` as rows of ``event_archive``: the envelope's columns (times as UTC timestamps), every payload
    field of every event type flattened into a column of its name, and the Kafka position (log order)."""
    import pyarrow as pa

    from event_store.envelope import parse_time

    payload = {}
    for schemas in domains_events:  # each domain's event schemas, in its registration order
        for fields in schemas.values():
            for name, spec in fields.items():
                payload[name] = pa.int64() if spec.kind is int else pa.string()
    ts = pa.timestamp("us", tz="UTC")
    columns = [("event_id", pa.string()), ("event_type", pa.string()), ("schema_version", pa.int32()),
               ("aggregate_type", pa.string()), ("aggregate_id", pa.string()), ("aggregate_version", pa.int64()),
               ("occurred_at", ts), ("recorded_at", ts), ("command_id", pa.string()), ("correlation_id", pa.string()),
               ("causation_id", pa.string()), *payload.items(), ("kafka_topic", pa.string()),
               ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())]
    rows = []
    for offset, e in enumerate(events):
        row = {name: getattr(e, name) for name in ("event_id", "event_type", "schema_version", "aggregate_type",
                                                    "aggregate_id", "aggregate_version", "command_id",
                                                    "correlation_id", "causation_id")}
        row.update(occurred_at=parse_time(e.occurred_at, "occurred_at"),
                   recorded_at=parse_time(e.recorded_at, "recorded_at"),
                   kafka_topic="eventlake.events", kafka_partition=0, kafka_offset=offset)
        row.update({name: e.payload.get(name) for name in payload})
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=pa.schema(columns))


def duckdb_rows(sql: str, tables: dict, key: tuple[str, ...]) -> dict[tuple, dict]:
    """Run ``sql`` in DuckDB (UTC) over the named pyarrow tables -> {key tuple: row}, times as naive UTC."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for name, table in tables.items():
            con.register(name, table)
        rows = con.sql(sql).arrow()
        rows = rows.read_all() if hasattr(rows, "read_all") else rows
        rows = rows.to_pylist()
    finally:
        con.close()
    return {tuple(row[k] for k in key): row for row in ({c: plain(v) for c, v in r.items()} for r in rows)}
