"""Test helpers for the site read models: site event envelopes written by hand, and the same events as rows of
``event_archive`` (a pyarrow table with the archive's columns, the site's payload columns among them) for the
models' ``fold_sql`` in DuckDB (``tests.iot_events.duckdb_rows`` runs it)."""
from __future__ import annotations

import datetime as dt
import uuid

from event_store.account.schemas import EVENTS as ACCOUNT_EVENTS
from event_store.envelope import EventEnvelope
from event_store.iot.schemas import EVENTS as IOT_EVENTS
from event_store.site.schemas import EVENTS as SITE_EVENTS

DAY = "2026-03-01T"


def event(site_id: str, version: int, kind: str, at: str, payload: dict | None = None, recorded: str | None = None,
          event_id: str | None = None) -> EventEnvelope:
    """A site event; ``at``/``recorded`` are times of day ("12:00:10"); recorded defaults to a second per version
    after 13:00 (log order)."""
    recorded = recorded or (dt.datetime(2026, 3, 1, 13) + dt.timedelta(seconds=version)).strftime("%H:%M:%S")
    return EventEnvelope(
        event_id=event_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"site/{site_id}/{version}/{kind}")),
        event_type=kind, schema_version=1, aggregate_type="site", aggregate_id=site_id, aggregate_version=version,
        occurred_at=f"{DAY}{at}.000Z", recorded_at=f"{DAY}{recorded}.000Z", command_id=f"c-{site_id}-{version}",
        correlation_id=f"c-{site_id}-{version}", causation_id=f"c-{site_id}-{version}", payload=payload or {})


def registered(site_id: str, version: int = 1, at: str = "12:00:00") -> EventEnvelope:
    return event(site_id, version, "SiteRegistered", at, {"site_name": f"Site {site_id}",
                                                          "host": f"{site_id}.example.com"})


def viewed(site_id: str, version: int, view_id: str, page: str, visitor: str, at: str) -> EventEnvelope:
    return event(site_id, version, "PageViewed", at, {"view_id": view_id, "page": page, "visitor_id": visitor})


def archive_table(events: list[EventEnvelope]):
    """``events`` as rows of ``event_archive``: the envelope's columns (times as UTC timestamps), every payload
    field of every domain's event types flattened into a column of its name, and the Kafka position (log order)."""
    import pyarrow as pa

    from event_store.envelope import parse_time

    payload = {}
    for schemas in (ACCOUNT_EVENTS, IOT_EVENTS, SITE_EVENTS):
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
