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
from tests.iot_events import archive_table as iot_archive_table

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
    """``events`` as rows of ``event_archive`` with the account's, the device's and the site's payload columns
    (``tests.iot_events.archive_table``)."""
    return iot_archive_table(events, (ACCOUNT_EVENTS, IOT_EVENTS, SITE_EVENTS))
