"""Check every read model against its Great Expectations suite (`expectations/`), one task per table.

A task fails when its table breaks an expectation; its log names the expectation, how many rows break it and
a few of their values. A table that does not exist yet fails its task with what to run first. Where the tables
are comes from the workers' environment (`EVENTLAKE_HOME`, `EVENTLAKE_CONFIG`), as for every eventlake command.
The same checks run from a shell: `eventlake check [NAMES]`.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task

from expectations import SUITES  # names only: Great Expectations and the tables are touched by the tasks


@dag(dag_id="check_read_models", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, max_active_runs=1, doc_md=__doc__, tags=["eventlake", "data-quality"])
def check_read_models():
    @task(map_index_template="{{ table }}")  # each mapped task shows its table's name in the UI
    def check_read_model(name: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from eventlake.settings import Settings
        from expectations.checks import TableMissing, check_table

        get_current_context()["table"] = name
        try:
            report = check_table(Settings.load(), name)
        except TableMissing as e:
            raise AirflowFailException(str(e)) from None
        print("\n".join(report.lines()))
        if not report.success:
            raise AirflowFailException("\n".join(report.lines()))
        return {"table": name, "rows": report.rows, "delta_version": report.delta_version,
                "expectations": report.evaluated}

    check_read_model.expand(name=list(SUITES))


check_read_models()
