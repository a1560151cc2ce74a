"""Check every read model against its Great Expectations suite (`expectations/`), one task per table.

A task fails when its table breaks an expectation; its log names the expectation, how many rows break it and
a few of their values. A table that does not exist yet fails its task with what to run first. With the
`reconcile` parameter on, each task also compares its table with a plain-Python fold of the archived log up to
the table's position and fails when they differ (about a minute per million events). Where the tables are
comes from the workers' environment (`EVENTLAKE_HOME`, `EVENTLAKE_CONFIG`), as for every eventlake command.
The same checks run from a shell: `eventlake check [--reconcile] [NAMES]`.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from expectations import SUITES  # names only: Great Expectations and the tables are touched by the tasks


@dag(dag_id="check_read_models", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, max_active_runs=1, doc_md=__doc__, tags=["eventlake", "data-quality"],
     params={"reconcile": Param(False, type="boolean",
                                description="also compare each table with a fold of the archived log")})
def check_read_models():
    @task(map_index_template="{{ table }}")  # each mapped task shows its table's name in the UI
    def check_read_model(name: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from eventlake.settings import Settings
        from expectations.checks import verdict

        context = get_current_context()
        context["table"] = name
        result = verdict(Settings.load(), name, reconcile=context["params"]["reconcile"])
        print("\n".join(result.lines()))
        if result.failed:
            raise AirflowFailException("\n".join(result.lines()))
        return result.summary()

    check_read_model.expand(name=list(SUITES))


check_read_models()
