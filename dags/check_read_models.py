"""Check every read model against its Great Expectations suite (`expectations/`), one task per table.

A task fails when its table breaks an expectation; its log names the expectation, how many rows break it and
a few of their values. A table that does not exist yet fails its task with what to run first. With the
`reconcile` parameter on, each task also compares its table with a plain-Python fold of the archived log up to
the table's position and fails when they differ (about a minute per million events). One more task per
cross-model check (`check_models_agree`, e.g. `payments_match_account_summary`) fails when read models derived
from the same events disagree, naming the accounts and the numbers; tables caught mid-batch are "not compared"
(no failure). Where the tables are comes from the workers' environment (`EVENTLAKE_HOME`, `EVENTLAKE_CONFIG`),
as for every eventlake command.
Each task also publishes its validation to Great Expectations **Data Docs**, a static HTML site under the
eventlake home (`<EVENTLAKE_HOME>/data_docs/index.html`, named in the task's log): open it in a browser to see
each suite's recent results, expectation by expectation.
The same checks run from a shell: `eventlake check [--reconcile] [NAMES]`.

**When.** Hourly, and whenever a rebuild, a reprocess or maintenance writes a read model it checks (an asset
event on that read model's Asset: `eventlake://warehouse/<read model>`). Each `check_read_model` that passes
emits an asset event on `read_model_checks` whose extra names the table, its generation's Delta version checked,
its rows and the expectations failed.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import AssetAny, Param, dag, get_current_context, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from expectations import CROSS_MODEL_CHECKS, SUITES  # names only: Great Expectations and the tables are touched by the tasks
from infra import airflow_assets as assets

CHECKS = assets.asset(assets.READ_MODEL_CHECKS)


@dag(dag_id="check_read_models", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("@hourly", timezone="UTC"),
                                  assets=AssetAny(*assets.read_model_assets(list(SUITES)))),
     catchup=False, max_active_runs=1, doc_md=__doc__, tags=["eventlake", "data-quality"],
     params={"reconcile": Param(False, type="boolean",
                                description="also compare each table with a fold of the archived log")})
def check_read_models():
    @task(map_index_template="{{ table }}", outlets=[CHECKS])  # each mapped task shows its table in the UI
    def check_read_model(name: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from expectations.checks import verdict
        from infra.airflow_lineage import task_settings
        from lakehouse import metrics

        context = get_current_context()
        context["table"] = name
        settings = task_settings()  # the check's lineage run a child of this task's
        result = verdict(settings, name, reconcile=context["params"]["reconcile"])
        print("\n".join(result.lines()))
        metrics.push(settings, "check_read_models", {"table": name}, result.samples())
        if result.report is not None and result.report.data_docs:
            print(f"Data Docs of every suite: file://{result.report.data_docs_index}")
        if result.failed:
            raise AirflowFailException("\n".join(result.lines()))
        context["outlet_events"][CHECKS].extra = result.summary()  # the Delta version checked
        return result.summary()

    @task(map_index_template="{{ check }}")
    def check_models_agree(name: str) -> dict:
        """A cross-model check (expectations/cross_model.py, registered by its domain): read models derived from the
        same events agree."""
        from airflow.sdk.exceptions import AirflowFailException

        from expectations import check_agreement
        from lakehouse.settings import Settings

        get_current_context()["check"] = name
        result = check_agreement(Settings.load(role="reader"), name)
        print("\n".join(result.lines()))
        if result.failed:
            raise AirflowFailException("\n".join(result.lines()))
        return result.summary()

    check_read_model.expand(name=list(SUITES))
    check_models_agree.expand(name=list(CROSS_MODEL_CHECKS))


check_read_models()
