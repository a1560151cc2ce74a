"""Fold late events back into their windows, one day at a time: each daily run reprocesses its own data interval
(`data_interval_start` .. `data_interval_end`) of every windowed read model (e.g. `merchant_minute_volume`).

A task recomputes the windows of its interval from the event archive, late events included, and replaces exactly
that range of the model's current generation in one Delta commit (none when nothing differs, so re-running a day
is safe); the late events it folded in get `late_events.reprocessed_at`. The task log shows each step and a
summary (windows replaced, late events folded in, seconds).
A closed day with no late event waiting is skipped without starting Spark (the log says so), so a catch-up over
months of quiet days is quick, and so is a model with no event applied yet (a domain that has sent none). A day
whose windows are not all closed yet (the watermark has not passed its end) fails its task with the watermark in
the log; the run can be cleared later. With `catchup=True` every day since the start date gets its run, oldest
first, one at a time. Where the tables are comes from the workers' environment (`EVENTLAKE_HOME`,
`EVENTLAKE_CONFIG`), as for every eventlake command.
The same from a shell: `eventlake reprocess merchant_minute_volume --from 2026-01-01 --to 2026-01-02`.

**Assets.** A task that committed a replace announces an update of its read model's Asset
(`eventlake://warehouse/<read model>`) through the alias `read_models_reprocessed`, its extra the Delta version it
committed, the generation and the interval; a skipped day or one where nothing differed announces nothing.
`check_read_models` runs on it.

**On a Spark cluster.** Where the Airflow connection `eventlake_spark` names a Spark master, each model's work is
the group `reprocess_read_model`: `check_waiting` skips a quiet closed day without starting Spark (the rest of
the group is skipped with it), `reprocess` is the Spark provider's `SparkSubmitOperator` submitting the project's
packaged `airflow-job` app (the same steps, the driver's output in the task's log), and `reprocessed` reads what
it did and announces the asset event; without it, `reprocess_read_model` starts Spark in the worker
(infra/airflow_spark.py). Both run the same code: spark_apps/airflow_jobs.py.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task, task_group
from airflow.timetables.interval import CronDataIntervalTimetable

from infra import airflow_assets as assets  # names only: Spark and the tables are touched by the tasks
from infra import airflow_spark
from lakehouse.settings import Settings

_DAG_ID = "reprocess_windows"
# A Spark master named by the connection `eventlake_spark`: the reprocess is submitted to it; None: it runs in
# the worker.
_MASTER = airflow_spark.cluster_master()


def _announce(context, result: dict) -> dict:
    """A reprocess that committed a replace announces its read model's asset event (in either mode)."""
    if result.get("table_version") is not None:  # a commit: the read model changed
        assets.record_written(context, "reprocess_windows", result["read_model"], {
            "delta_version": result["table_version"], "generation": result["generation"],
            "interval_start": result["interval_start"], "interval_end": result["interval_end"],
            "windows_changed": result["windows_changed"], "late_folded": result["late_folded"]})
    return result


# A data interval of one day per run: a plain "@daily" (Airflow 3's CronTriggerTimetable) gives each run an
# empty interval (start = end = the run's time).
@dag(dag_id="reprocess_windows", schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=True, max_active_runs=1,
     doc_md=__doc__, tags=["eventlake", "reprocess"])
def reprocess_windows():
    # Each mapped task shows its read model's name in the UI.
    @task(map_index_template="{{ table }}", outlets=[assets.alias(assets.REPROCESSED)])
    def reprocess_read_model(name: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from infra.airflow_lineage import task_settings
        from spark_apps.airflow_jobs import reprocess_range
        from spark_apps.reprocess import ReprocessError, ReprocessRefused

        context = get_current_context()
        context["table"] = name
        try:  # its Spark runs' lineage children of this task's run
            result = reprocess_range(task_settings(), name, context["data_interval_start"],
                                     context["data_interval_end"], _DAG_ID, context["run_id"])
        except ReprocessError as e:  # bad input: trying again cannot help
            raise AirflowFailException(str(e)) from None
        except ReprocessRefused as e:  # e.g. windows not closed yet: a later retry or clear may succeed
            raise RuntimeError(str(e)) from None
        return _announce(context, result)

    @task_group(group_id="reprocess_read_model")
    def reprocess_on_cluster(name: str):
        @task(map_index_template="{{ table }}")
        def check_waiting(name: str) -> None:
            """A closed day with no late event waiting is skipped here, without submitting (delta-rs reads)."""
            from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

            from spark_apps.airflow_jobs import reprocess_skipped
            from spark_apps.reprocess import ReprocessError

            context = get_current_context()
            context["table"] = name
            try:
                skipped = reprocess_skipped(Settings.load(role="reader"), name, context["data_interval_start"],
                                            context["data_interval_end"])
            except ReprocessError as e:
                raise AirflowFailException(str(e)) from None
            if skipped is not None:
                raise AirflowSkipException(f"{name}: {skipped['skipped']}")

        @task(map_index_template="{{ table }}", outlets=[assets.alias(assets.REPROCESSED)])
        def reprocessed(name: str) -> dict:
            """What the submitted reprocess did (a submitted job returns no XCom), and its asset event."""
            from airflow.sdk.exceptions import AirflowFailException

            from spark_apps.airflow_jobs import read_result

            context = get_current_context()
            context["table"] = name
            try:
                result = read_result(Settings.load(role="reader"), _DAG_ID, context["run_id"], name)
            except FileNotFoundError:
                raise AirflowFailException(f"{name}: the submitted reprocess wrote no result; see the reprocess "
                                           "task's log") from None
            return _announce(context, result)

        model = airflow_spark.mapped_value(assets.WINDOWED)  # this mapped group's read model
        submitted = airflow_spark.submit_job(
            "reprocess", airflow_spark.job_arguments(_DAG_ID, model), settings=Settings.load(role="reader"),
            master=_MASTER, name="eventlake-reprocess", map_index_template=model)
        check_waiting(name) >> submitted >> reprocessed(name)

    if _MASTER is None:
        reprocess_read_model.expand(name=list(assets.WINDOWED))
    else:
        reprocess_on_cluster.expand(name=list(assets.WINDOWED))


reprocess_windows()
