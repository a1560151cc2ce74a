"""Expectations of ``device_status``: one row per registered device, a valid registration, counts that fit the
version, and event time that never runs behind the last reading recorded."""
from __future__ import annotations

from event_store.iot import STATUSES
from event_store.iot.schemas import HEARTBEAT_MAX_S, VALUE_MAX_MILLI

TABLE = "device_status"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    df["range_width_milli"] = df["range_max_milli"] - df["range_min_milli"]
    # Every event is a version: the registration, each reading and anomaly, a decommission, a quarantine resolved.
    df["versions_beyond_counts"] = df["version"] - 1 - df["readings_count"] - df["anomalies_count"]
    # The newest measured_at is never older than the last recorded reading's (null when the device has none).
    df["seen_after_last_reading_s"] = (df["last_seen_at"] - df["last_reading_at"]).dt.total_seconds()
    df["last_reading_iff_readings"] = (df["readings_count"] > 0) == (
        df["last_reading_id"].notna() & df["last_reading_at"].notna() & df["last_seen_at"].notna()
        & df["last_value_milli"].notna())


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="device_id"),
        e.ExpectColumnValuesToBeUnique(column="device_id"),
        # A row starts at the device's first event (DeviceRegistered), so the registration is always there.
        e.ExpectColumnValuesToNotBeNull(column="site_id"),
        e.ExpectColumnValuesToNotBeNull(column="sensor_kind"),
        e.ExpectColumnValuesToNotBeNull(column="unit"),
        e.ExpectColumnValuesToBeInSet(column="status", value_set=list(STATUSES)),
        e.ExpectColumnValuesToBeBetween(column="range_width_milli", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="heartbeat_interval_s", min_value=1, max_value=HEARTBEAT_MAX_S),
        e.ExpectColumnValuesToBeBetween(column="last_value_milli", min_value=-VALUE_MAX_MILLI,
                                        max_value=VALUE_MAX_MILLI),
        e.ExpectColumnValuesToBeBetween(column="version", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="readings_count", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="anomalies_count", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="versions_beyond_counts", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="seen_after_last_reading_s", min_value=0),
        e.ExpectColumnValuesToBeInSet(column="last_reading_iff_readings", value_set=[True]),
    ]
