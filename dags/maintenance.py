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
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from infra import airflow_assets as assets  # names only: Spark and the tables are touched by the tasks

_DEFAULT_RETENTION_HOURS = 168  # spark_apps.maintenance.DEFAULT_RETENTION_HOURS (not imported at parse time)


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
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from lakehouse import metrics
        from lakehouse.settings import Settings
        from spark_apps.maintenance import MaintenanceError, maintain
        from spark_apps.session import build_session

        context = get_current_context()
        context["read_model"] = name
        settings = Settings.load(role="reader")
        log = lambda line: print(line, flush=True)  # noqa: E731
        spark = build_session(settings, app_name=f"eventlake-maintenance-{name}", log=log)
        try:
            report = maintain(spark, settings, name, int(context["params"]["retention_hours"]),
                              by=f"airflow maintenance/{context['run_id']}", log=log)
        except MaintenanceError as e:
            raise AirflowFailException(str(e)) from None
        finally:
            spark.stop()
        print("\n".join(report.lines()), flush=True)
        metrics.push(settings, "maintenance", {"read_model": name}, report.samples(), log)
        if report.skipped:
            raise AirflowSkipException(report.skipped)
        if report.current is not None and (report.optimized or report.vacuumed or report.dropped):
            assets.record_written(context, "maintenance", name, {
                **assets.table_version(settings, name, report.current), "kept": report.kept,
                "dropped": report.dropped, "problems": len(report.problems)})
        return {"name": name, "current": report.current, "kept": report.kept, "dropped": report.dropped,
                "problems": report.problems}

    maintain_read_model.expand(name=list(assets.READ_MODELS))


maintenance()
