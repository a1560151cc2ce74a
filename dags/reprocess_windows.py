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
"""
from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable

from infra import airflow_assets as assets  # names only: Spark and the tables are touched by the tasks


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

        from lakehouse import metrics
        from lakehouse.settings import Settings
        from spark_apps.reprocess import ReprocessError, ReprocessRefused, late_events_waiting, reprocess
        from spark_apps.session import build_session

        context = get_current_context()
        context["table"] = name
        start, end = context["data_interval_start"], context["data_interval_end"]
        settings = Settings.load(role="reader")
        try:
            waiting, watermark = late_events_waiting(settings, name, start, end)
        except ReprocessError as e:
            raise AirflowFailException(str(e)) from None
        if waiting == 0 and watermark is not None and watermark >= end:
            print(f"reprocess: {name}: no late event of {start:%Y-%m-%dT%H:%M}Z .. {end:%Y-%m-%dT%H:%M}Z waits to be "
                  f"folded in and its windows are closed (watermark {watermark:%Y-%m-%dT%H:%M:%S}Z): skipped",
                  flush=True)
            return {"read_model": name, "skipped": "no late events waiting", "late_folded": 0}
        if waiting == 0 and watermark is None:  # e.g. a domain that has sent no event yet
            print(f"reprocess: {name}: no event applied yet (no watermark) and no late event waiting: nothing to "
                  f"recompute, skipped", flush=True)
            return {"read_model": name, "skipped": "no event applied yet", "late_folded": 0}
        spark = build_session(settings, app_name=f"eventlake-reprocess-{name}")
        try:
            outcome = reprocess(spark, settings, name, start, end, by=f"airflow reprocess_windows {context['run_id']}",
                                log=lambda line: print(line, flush=True))
        except ReprocessError as e:  # bad input: trying again cannot help
            raise AirflowFailException(str(e)) from None
        except ReprocessRefused as e:  # e.g. windows not closed yet: a later retry or clear may succeed
            raise RuntimeError(str(e)) from None
        finally:
            spark.stop()
        metrics.push(settings, "reprocess_windows", {"read_model": name}, outcome.samples())
        if outcome.table_version is not None:  # a commit: the read model changed
            assets.record_written(context, "reprocess_windows", name, {
                "delta_version": outcome.table_version, "generation": outcome.generation,
                "interval_start": start.isoformat(), "interval_end": end.isoformat(),
                "windows_changed": outcome.windows_changed, "late_folded": outcome.late_folded})
        return {"read_model": name, "generation": outcome.generation, "windows": outcome.windows,
                "windows_changed": outcome.windows_changed, "late_folded": outcome.late_folded,
                "table_version": outcome.table_version, "seconds": round(outcome.seconds, 1)}

    reprocess_read_model.expand(name=list(assets.WINDOWED))


reprocess_windows()
