"""Expectations of ``telemetry_anomalies``: one row per device, rule and finding time."""
from __future__ import annotations

TABLE = "telemetry_anomalies"


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="device_id"),
        e.ExpectColumnValuesToNotBeNull(column="occurred_at"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["device_id", "rule", "occurred_at"]),
        # Not only the detector's rules (event_store.iot.telemetry_rules.RULES): a person may flag a device too.
        e.ExpectColumnValuesToNotBeNull(column="rule"),
        e.ExpectColumnValuesToMatchRegex(column="rule", regex=r"\S"),
        e.ExpectColumnValuesToNotBeNull(column="event_id"),
    ]
