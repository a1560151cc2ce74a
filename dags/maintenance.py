"""Daily maintenance of the read models' Delta tables and generations (issue 9), one task per read model.

`maintain_read_model` (mapped; the UI shows the model's name), under the model's rebuild lock:
- drops the generations beyond the last two: never the current one nor the rollback target, so
  `eventlake rollback NAME` keeps working;
- OPTIMIZE (compaction) of the current and followed generations' tables and their bookkeeping;
- VACUUM of the same with a retention of at least Delta's default, 7 days (`retention_hours`; less is refused):
  a rollback switches to another generation, not to an old version of a table, so it does not need more, and
  readers and writers in flight need no less.

A model whose rebuild is running is skipped (its task shows "skipped" with who holds the lock). Runs daily,
without catch-up (a missed day is simply done the next day). Logic: spark_apps/maintenance.py.

**Assets.** A model whose tables were compacted, vacuumed or had generations dropped announces an update of its
Asset (`eventlake://warehouse/<read model>`) through the alias `read_models_maintained`, its extra the current
generation, its table's Delta version after the run and the generations kept and dropped (`check_read_models`
runs on it: the rows are the same, the files are not). A skipped model announces nothing.

**On a Spark cluster.** Where the Airflow connection `eventlake_spark` names a Spark master, each model's work is
the group `maintain_read_model`: `maintain` is the Spark provider's `SparkSubmitOperator` submitting the project's
packaged `airflow-job` app (the same steps under the same lock, the driver's output in the task's log), and
`maintained` reads what it did, skips a model left alone and announces the asset event; without it,
`maintain_read_model` starts Spark in the worker (infra/airflow_spark.py). Both run the same code:
spark_apps/airflow_jobs.py.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task, task_group

from infra import airflow_assets as assets  # names only: Spark and the tables are touched by the tasks
from infra import airflow_spark
from lakehouse.settings import Settings

_DAG_ID = "maintenance"
_DEFAULT_RETENTION_HOURS = 168  # spark_apps.maintenance.DEFAULT_RETENTION_HOURS (not imported at parse time)
# A Spark master named by the connection `eventlake_spark`: the maintenance is submitted to it; None: it runs in
# the worker.
_MASTER = airflow_spark.cluster_master()


def _announce(context, settings: Settings, result: dict) -> dict:
    """A model left alone is skipped; one whose tables changed announces its asset event (in either mode)."""
    from airflow.sdk.exceptions import AirflowSkipException

    if result["skipped"]:
        raise AirflowSkipException(result["skipped"])
    if result["changed"]:
        assets.record_written(context, "maintenance", result["name"], {
            **assets.table_version(settings, result["name"], result["current"]), "kept": result["kept"],
            "dropped": result["dropped"], "problems": len(result["problems"])})
    return result


@dag(dag_id="maintenance", schedule="@daily", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     max_active_runs=1, doc_md=__doc__, tags=["eventlake", "maintenance"],
     params={"retention_hours": Param(_DEFAULT_RETENTION_HOURS, type="integer", minimum=_DEFAULT_RETENTION_HOURS,
                                      title="VACUUM retention (hours)",
                                      description="files no table version of the last this-many hours needs are "
                                                  "deleted; at least Delta's default of 168 (7 days)")})
def maintenance():
    # One model at a time: each task starts Spark, and models share the machine with the live projection.
    @task(map_index_template="{{ read_model }}", max_active_tis_per_dag=1, outlets=[assets.alias(assets.MAINTAINED)])
    def maintain_read_model(name: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from infra.airflow_lineage import task_settings
        from spark_apps.airflow_jobs import maintain_model
        from spark_apps.maintenance import MaintenanceError

        context = get_current_context()
        context["read_model"] = name
        settings = task_settings()  # its Spark runs' lineage children of this task's run
        try:
            result = maintain_model(settings, name, int(context["params"]["retention_hours"]), _DAG_ID,
                                    context["run_id"])
        except MaintenanceError as e:
            raise AirflowFailException(str(e)) from None
        return _announce(context, settings, result)

    @task_group(group_id="maintain_read_model")
    def maintain_on_cluster(name: str):
        @task(map_index_template="{{ read_model }}", outlets=[assets.alias(assets.MAINTAINED)])
        def maintained(name: str) -> dict:
            """What the submitted maintenance did (a submitted job returns no XCom), and its asset event."""
            from airflow.sdk.exceptions import AirflowFailException

            from spark_apps.airflow_jobs import read_result

            context = get_current_context()
            context["read_model"] = name
            settings = Settings.load(role="reader")
            try:
                result = read_result(settings, _DAG_ID, context["run_id"], name)
            except FileNotFoundError:
                raise AirflowFailException(f"{name}: the submitted maintenance wrote no result; see the maintain "
                                           "task's log") from None
            return _announce(context, settings, result)

        model = airflow_spark.mapped_value(assets.READ_MODELS)  # this mapped group's read model
        submitted = airflow_spark.submit_job(
            "maintain", airflow_spark.job_arguments(_DAG_ID, model), settings=Settings.load(role="reader"),
            master=_MASTER, name="eventlake-maintenance", map_index_template=model, max_active_tis_per_dag=1)
        submitted >> maintained(name)

    if _MASTER is None:
        maintain_read_model.expand(name=list(assets.READ_MODELS))
    else:
        maintain_on_cluster.expand(name=list(assets.READ_MODELS))


maintenance()
