"""Load merchants (reference data) into `dim_merchant`, kept as SCD type 2 history: extract and stage -> check ->
merge, one task each (the logic is `reference_data.loads`, the same code as `eventlake load merchants`).

**When.** Daily at 03:00 UTC, and whenever a producer drops the flag file `_READY` into the landing folder
(`<EVENTLAKE_HOME>/landing/merchants`) after its merchants file: an Asset with an `AssetWatcher` on the standard
provider's `DirectoryFileDeleteTrigger` (the trigger deletes the file it finds, so it watches the flag, never the
data). Without a `source` parameter a run loads the newest file of the landing folder (by name).

**What.** `source`: a CSV or JSON-lines file (a path or a storage URI) or a database URL (`sqlite:////path/ref.db`,
`postgresql://...`); or `conn_id`: an Airflow connection (sqlite, postgres) whose table `merchants` to load; `full`: a full extract (a merchant missing from it is closed). `stage_merchants` streams the
source into a staging Delta table; `check_merchants` runs its Great Expectations suite and, on failure, quarantines
the batch with its report (`<warehouse>/_quarantine/merchants/<load>`) and fails with the reasons in its log;
`merge_merchants` runs the SCD2 MERGE and emits an asset event on `dim_merchant` whose extra carries the Delta version
and the counts (inserted, changed, closed, unchanged). The same content twice loads once (a ledger by content hash).
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from infra import airflow_assets as assets  # the Assets' names and URIs, one place for every DAG
from lakehouse.settings import Settings
from read_models.catalog import DIM_MERCHANT_TABLE
from reference_data.loads import landing_folder

DIM_MERCHANT = assets.table_asset(DIM_MERCHANT_TABLE)
LANDED = assets.landed_merchants(Settings.load())


@dag(dag_id="load_merchants", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=LANDED),
     max_active_runs=1, doc_md=__doc__, tags=["eventlake", "reference-data"],
     params={"source": Param("", type="string", description="a file, a storage URI or a database URL "
                                                            "(empty: the newest file in the landing folder)"),
             "conn_id": Param("", type="string", description="an Airflow connection (sqlite or postgres) whose "
                                                             "merchants table to load, instead of source"),
             "full": Param(False, type="boolean", description="a full extract: merchants missing from it are closed")})
def load_merchants():
    @task
    def stage_merchants() -> dict:
        from dataclasses import asdict

        from airflow.sdk.exceptions import AirflowSkipException

        from reference_data.loads import newest_landed, stage

        settings = Settings.load(role="reader")
        params = get_current_context()["params"]
        source = params["source"] or newest_landed(settings)
        if params["conn_id"]:
            from airflow.sdk import BaseHook

            from reference_data.extract import database_url

            c = BaseHook.get_connection(params["conn_id"])
            source = database_url(c.conn_id, c.conn_type, c.host, c.schema, c.login, c.password, c.port)
        if not source:
            raise AirflowSkipException(f"no merchants file in {landing_folder(settings)} and no source given")
        staged = stage(settings, source, full=params["full"])
        print(f"staged {staged.rows:,} rows of {staged.source} at {staged.path} (content {staged.content_hash[:12]})")
        return asdict(staged)

    @task
    def check_merchants(staged: dict) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from reference_data.loads import MerchantsRefused, Staged, check, loaded_before

        settings = Settings.load(role="reader")
        batch = Staged(**staged)
        if loaded_before(settings, batch.content_hash) is not None:
            print(f"{batch.source}: this content was loaded before; nothing to check")
            return staged
        try:
            check(settings, batch)
        except MerchantsRefused as e:
            raise AirflowFailException("\n".join([str(e), *e.lines])) from None
        print(f"{batch.source}: passed its suite")
        return staged

    @task(outlets=[DIM_MERCHANT])
    def merge_merchants(staged: dict) -> dict:
        from infra.airflow_lineage import task_settings
        from reference_data.loads import Staged, merge

        report = merge(task_settings(), Staged(**staged))  # its lineage run a child of this task's
        print("\n".join(report.lines()))
        get_current_context()["outlet_events"][DIM_MERCHANT].extra = {
            "delta_version": report.version, "load_id": report.load_id, "status": report.status,
            "source": report.source, **report.counts}
        return report.summary()

    merge_merchants(check_merchants(stage_merchants()))


load_merchants()
