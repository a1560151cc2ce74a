"""Expectations of ``device_minute_readings``: one row per device and whole event-time minute, a minimum that is
not above the maximum, and a sum between count x minimum and count x maximum."""
from __future__ import annotations

from expectations.windows import window_columns, whole_minutes

TABLE = "device_minute_readings"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    window_columns(df)
    df["spread_milli"] = df["max_value_milli"] - df["min_value_milli"]
    # Python integers: count x value can pass 2^63 for values near the bound, where int64 would wrap.
    df["sum_above_floor"] = [None if s is None or n is None or m is None else int(s) - int(n) * int(m) for s, n, m in
                             zip(df["sum_value_milli"].tolist(), df["readings"].tolist(),
                                 df["min_value_milli"].tolist())]
    df["sum_below_ceiling"] = [None if s is None or n is None or m is None else int(n) * int(m) - int(s) for s, n, m
                               in zip(df["sum_value_milli"].tolist(), df["readings"].tolist(),
                                      df["max_value_milli"].tolist())]


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="device_id"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["device_id", "window_start"]),
        *whole_minutes(gx),
        e.ExpectColumnValuesToNotBeNull(column="unit"),
        # A window's row exists because a reading was folded into it.
        e.ExpectColumnValuesToBeBetween(column="readings", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="spread_milli", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="sum_above_floor", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="sum_below_ceiling", min_value=0),
    ]
