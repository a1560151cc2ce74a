"""Expectations of ``category_minute_volume``: one row per category and whole event-time minute, a category that is
an MCC (four digits) or the unknown one, counts that add up."""
from __future__ import annotations

from expectations.windows import window_columns, whole_minutes
from read_models.account.category_minute_volume import UNKNOWN_CATEGORY

TABLE = "category_minute_volume"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    window_columns(df)


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="merchant_category"),
        e.ExpectColumnValuesToMatchRegex(column="merchant_category", regex=rf"^([0-9]{{4}}|{UNKNOWN_CATEGORY})$"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["merchant_category", "window_start"]),
        *whole_minutes(gx),
        e.ExpectColumnValuesToBeBetween(column="payments", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="amount_minor", min_value=0),
    ]
