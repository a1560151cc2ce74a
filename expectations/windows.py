"""What every windowed read model's suite checks of its windows (``window_start``, ``window_end``): each row one
whole event-time minute. A windowed model's suite calls ``window_columns`` in its ``derived_columns`` and puts
``whole_minutes(gx)`` among its expectations."""
from __future__ import annotations

__all__ = ["window_columns", "whole_minutes"]


def window_columns(df) -> None:
    """The columns ``whole_minutes`` compares with (added to the checked frame, never written): the window's
    length in seconds, and the second (with its microseconds) its start falls on."""
    df["window_seconds"] = (df["window_end"] - df["window_start"]).dt.total_seconds()
    df["window_start_second"] = df["window_start"].dt.second + df["window_start"].dt.microsecond


def whole_minutes(gx) -> list:
    """Each window is 60 seconds long and starts on a whole minute."""
    e = gx.expectations
    return [e.ExpectColumnValuesToBeInSet(column="window_seconds", value_set=[60.0]),
            e.ExpectColumnValuesToBeInSet(column="window_start_second", value_set=[0])]
