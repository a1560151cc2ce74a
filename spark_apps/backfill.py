"""``reference_data.backfill`` with its windowed minutes reprocessed on Spark (``spark_apps.reprocess``): the session
is started only when some minute needs it, and stopped at the end. What ``eventlake backfill`` and the
``backfill_reference`` DAG run."""
from __future__ import annotations

from typing import Callable

from lakehouse.lineage import Lineage
from lakehouse.settings import Settings
from reference_data.backfill import Backfill, backfill

__all__ = ["backfill_with_spark"]


def backfill_with_spark(settings: Settings, names: list[str] | None = None, *, dry_run: bool = False, by: str = "",
                        log: Callable[[str], None] = print) -> Backfill:
    spark = None
    run = Lineage.for_settings(settings).planned("backfill")  # the backfill's run: the Spark application's parent

    def reprocess(name, start, end):
        nonlocal spark
        from spark_apps.reprocess import reprocess_closed
        from spark_apps.session import build_session

        if spark is None:
            spark = build_session(settings, app_name="eventlake-backfill", job=True, lineage_parent=run)
        return reprocess_closed(spark, settings, name, start, end, by=by, log=log)

    try:
        return backfill(settings, names, dry_run=dry_run, reprocess=reprocess, by=by, log=log,
                        lineage_run_id=run.run_id)
    finally:
        if spark is not None:
            spark.stop()
