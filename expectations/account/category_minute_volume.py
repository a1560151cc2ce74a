"""Expectations of ``category_minute_volume``: one row per category and whole event-time minute, a category that is
an MCC (four digits) or the unknown one, counts that add up."""
from __future__ import annotations

from read_models.account.category_minute_volume import UNKNOWN_CATEGORY

TABLE = "category_minute_volume"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    df["window_seconds"] = (df["window_end"] - df["window_start"]).dt.total_seconds()
    df["window_start_second"] = df["window_start"].dt.second + df["window_start"].dt.microsecond


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="merchant_category"),
        e.ExpectColumnValuesToMatchRegex(column="merchant_category", regex=rf"^([0-9]{{4}}|{UNKNOWN_CATEGORY})$"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["merchant_category", "window_start"]),
        e.ExpectColumnValuesToBeInSet(column="window_seconds", value_set=[60.0]),
        e.ExpectColumnValuesToBeInSet(column="window_start_second", value_set=[0]),
        e.ExpectColumnValuesToBeBetween(column="payments", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="amount_minor", min_value=0),
    ]
