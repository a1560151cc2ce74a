"""``reference_data.backfill`` with its windowed minutes reprocessed on Spark (``spark_apps.reprocess``): the session
is started only when some minute needs it, and stopped at the end. What ``eventlake backfill`` and the
``backfill_reference`` DAG run."""
from __future__ import annotations

from typing import Callable

from lakehouse.settings import Settings
from reference_data.backfill import Backfill, backfill

__all__ = ["backfill_with_spark"]


def backfill_with_spark(settings: Settings, names: list[str] | None = None, *, dry_run: bool = False, by: str = "",
                        log: Callable[[str], None] = print) -> Backfill:
    spark = None

    def reprocess(name, start, end):
        nonlocal spark
        from spark_apps.reprocess import reprocess_closed
        from spark_apps.session import build_session

        if spark is None:
            spark = build_session(settings, app_name="eventlake-backfill", job=True)
        return reprocess_closed(spark, settings, name, start, end, by=by, log=log)

    try:
        return backfill(settings, names, dry_run=dry_run, reprocess=reprocess, by=by, log=log)
    finally:
        if spark is not None:
            spark.stop()
