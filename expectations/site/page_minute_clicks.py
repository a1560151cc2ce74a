"""Expectations of ``page_minute_clicks``: one row per site, page and whole event-time minute, a page that is a
URL path, and at least one view in every row."""
from __future__ import annotations

from event_store.site.schemas import PAGE_PATTERN
from expectations.windows import window_columns, whole_minutes

TABLE = "page_minute_clicks"
_PAGE_REGEX = "^" + PAGE_PATTERN.removeprefix(r"\A").removesuffix(r"\Z") + "$"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    window_columns(df)


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="site_id"),
        e.ExpectColumnValuesToNotBeNull(column="page"),
        e.ExpectColumnValuesToNotBeNull(column="window_start"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["site_id", "page", "window_start"]),
        *whole_minutes(gx),
        # The schema's pattern, anchored as the other suites anchor theirs: a page here was accepted as a path.
        e.ExpectColumnValuesToMatchRegex(column="page", regex=_PAGE_REGEX),
        # A window's row exists because a view was folded into it.
        e.ExpectColumnValuesToBeBetween(column="views", min_value=1),
    ]
