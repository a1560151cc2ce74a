"""Expectations of ``merchant_minute_volume``: one row per merchant and whole event-time minute, counts that add up."""
from __future__ import annotations

from expectations.windows import window_columns, whole_minutes

TABLE = "merchant_minute_volume"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    window_columns(df)


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="merchant_id"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["merchant_id", "window_start"]),
        *whole_minutes(gx),
        e.ExpectColumnValuesToBeBetween(column="payments", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="amount_minor", min_value=0),
    ]
