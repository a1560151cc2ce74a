"""Expectations of ``merchant_minute_volume``: one row per merchant and whole event-time minute, counts that add up."""
from __future__ import annotations

TABLE = "merchant_minute_volume"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    df["window_seconds"] = (df["window_end"] - df["window_start"]).dt.total_seconds()
    df["window_start_second"] = df["window_start"].dt.second + df["window_start"].dt.microsecond


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="merchant_id"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["merchant_id", "window_start"]),
        e.ExpectColumnValuesToBeInSet(column="window_seconds", value_set=[60.0]),
        e.ExpectColumnValuesToBeInSet(column="window_start_second", value_set=[0]),
        e.ExpectColumnValuesToBeBetween(column="payments", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="amount_minor", min_value=0),
    ]
