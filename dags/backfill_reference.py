"""Bring the read models that join reference data in line with it: after every load of `dim_merchant` (its Asset
event) and every 30 minutes (rows of a minute that was still open wait for a later run).

A payment projected before its merchant was loaded has null merchant columns, and counts under the `unknown`
category of `category_minute_volume`; a rebuild now would give it the merchant's version as of its time (the first
one, for a payment older than the merchant's load). The task finds those rows (DuckDB over the table's files), sets
them in one MERGE and reprocesses the closed minutes they count in (Spark in the worker, started only when a minute
needs it), then announces an update of each read model it committed to (`eventlake://warehouse/<read model>`,
through the alias `read_models_backfilled`, the Delta version in the extra): `check_read_models` runs on it.
A run with nothing to do changes nothing. The task's log lists what differed, what was set and what waits.
The same from a shell: `eventlake backfill` (`--dry-run` to count only).

**On a Spark cluster.** Where the Airflow connection `eventlake_spark` names a Spark master, the task `backfill` is
the Spark provider's `SparkSubmitOperator` submitting the project's packaged `airflow-job` app (the same code:
spark_apps/airflow_jobs.py; the driver's output in the task's log), and `backfilled` reads what it did and announces
the asset events.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from infra import airflow_assets as assets  # names only: Spark and the tables are touched by the task
from infra import airflow_spark
from lakehouse.settings import Settings
from read_models.catalog import DIM_MERCHANT_TABLE

# A Spark master named by the connection `eventlake_spark`: the backfill is submitted to it; None: it runs in the
# worker.
_MASTER = airflow_spark.cluster_master()


def _announce(context, result: dict) -> dict:
    """Each read model the backfill committed to gets its asset event (in either mode)."""
    settings = Settings.load(role="reader")
    for name in result["versions"]:
        extra = {**assets.table_version(settings, name), "rows_set": result["updated"].get(name, 0),
                 "minutes_reprocessed": result["windows"].get(name, 0)}
        assets.record_written(context, "backfill_reference", name, extra)
    return result


@dag(dag_id="backfill_reference", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     max_active_runs=1,
     schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("*/30 * * * *", timezone="UTC"),
                                  assets=assets.table_asset(DIM_MERCHANT_TABLE)),
     doc_md=__doc__, tags=["eventlake", "reference-data"])
def backfill_reference():
    @task(outlets=[assets.alias(assets.BACKFILLED)])
    def backfill_read_models() -> dict:
        from infra.airflow_lineage import task_settings
        from spark_apps.airflow_jobs import backfill_models

        context = get_current_context()  # the backfill's lineage runs children of this task's
        return _announce(context, backfill_models(task_settings(), "backfill_reference",
                                                  context["run_id"]))

    @task(outlets=[assets.alias(assets.BACKFILLED)])
    def backfilled() -> dict:
        """What the submitted backfill did (a submitted job returns no XCom), and its asset events."""
        from airflow.sdk.exceptions import AirflowFailException

        from spark_apps.airflow_jobs import read_result

        context = get_current_context()
        try:
            result = read_result(Settings.load(role="reader"), "backfill_reference", context["run_id"],
                                 DIM_MERCHANT_TABLE)
        except FileNotFoundError:
            raise AirflowFailException("the submitted backfill wrote no result; see the backfill task's log") from None
        return _announce(context, result)

    if _MASTER is None:
        backfill_read_models()
    else:
        submitted = airflow_spark.submit_job(
            "backfill", airflow_spark.job_arguments("backfill_reference", DIM_MERCHANT_TABLE),
            settings=Settings.load(role="reader"), master=_MASTER, name="eventlake-backfill")
        submitted >> backfilled()


backfill_reference()
