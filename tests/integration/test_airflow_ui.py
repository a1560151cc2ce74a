"""The DAGs driven the way users drive them: Airflow's real services (`airflow standalone`: api-server, scheduler,
dag-processor, triggerer) on eventlake's DAGs. `rebuild_read_model` unpaused and triggered with a conf through
Airflow's REST API, as the UI's trigger form does: the run succeeds and readers see the new generation (issue 9).
`load_merchants` triggered the same way with a source, refusing a bad one, then started by its AssetWatcher when a
producer drops the landing folder's flag file (issue 46): each load's asset event on `dim_merchant` carries its
Delta version and counts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb
from lakehouse.tables import read_table
from infra import airflow
from read_models.catalog import DIM_MERCHANT_TABLE, Catalog
from reference_data.loads import LANDED_MARKER, landing_folder
from reference_data.samples import write_sample_merchants
from spark_apps.projection import Projection
from tests.conftest import _free_port
from tests.domain_helpers import events_for
from tests.integration.services import WORKTREE, service_env
from tests.integration.test_rebuild import publish
from tests.oracle import assert_matches_oracle

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

AIRFLOW = str(Path(sys.executable).parent / "airflow")


class AirflowApi:
    """Airflow's REST API (v2) as the UI calls it: a JWT from /auth/token, then JSON requests."""

    def __init__(self, base: str, password_file: Path):
        self.base = base
        self.password_file = password_file
        self.token = None

    def login(self) -> None:
        password = json.loads(self.password_file.read_text())["admin"]
        self.token = self.call("POST", "/auth/token", {"username": "admin", "password": password},
                               auth=False)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.base + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")


def wait_for(what: str, condition, timeout_s: float, log_path: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (urllib.error.URLError, ConnectionError, OSError, KeyError, json.JSONDecodeError):
            value = None
        if value:
            return value
        time.sleep(2)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
    pytest.fail(f"{what}: not within {timeout_s:.0f}s; airflow standalone's log tail:\n{tail}")


@pytest.fixture
def airflow_standalone(settings, tmp_path):
    """`airflow standalone` on eventlake's DAGs with this test's settings, on free ports; stopped (its whole
    session) at the end."""
    env = airflow.environment(settings, base=service_env(settings))
    port = _free_port()
    env.update(AIRFLOW__API__PORT=str(port), AIRFLOW__API__HOST="127.0.0.1",
               # Task workers talk to the API server's execution API: on this port, not the default 8080.
               AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
               AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(_free_port()),
               AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(_free_port()),
               AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="True")
    log_path = tmp_path / "airflow-standalone.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen([AIRFLOW, "standalone"], cwd=WORKTREE, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        api = AirflowApi(f"http://127.0.0.1:{port}", airflow.airflow_home(settings) /
                         "simple_auth_manager_passwords.json.generated")
        wait_for("the API server answering", lambda: api.call("GET", "/api/v2/monitor/health", auth=False),
                 300, log_path)
        api.login()
        yield api, log_path
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # standalone and every component it started
        except ProcessLookupError:
            pass
        process.wait(30)


def test_rebuild_read_model_triggered_through_the_rest_api_switches_readers_to_the_new_generation(
        spark, settings, airflow_standalone):
    api, log_path = airflow_standalone
    events = events_for(GeneratorConfig(accounts=8, commands=100, seed=41, run_id="airflow-ui"))
    publish(settings, events)
    Projection(spark, settings, log=lambda *_: None).run_until_caught_up()
    _, before = query_duckdb(settings, "SELECT * FROM account_summary ORDER BY account_id")

    dag = wait_for("the dag-processor parsing rebuild_read_model",
                   lambda: api.call("GET", "/api/v2/dags/rebuild_read_model"), 180, log_path)
    assert dag["is_paused"]  # as every new DAG: a person unpauses it first
    api.call("PATCH", "/api/v2/dags/rebuild_read_model", {"is_paused": False})
    run = api.call("POST", "/api/v2/dags/rebuild_read_model/dagRuns",
                   {"logical_date": None, "conf": {"read_models": ["account_summary"], "dry_run": False}})
    run_path = f"/api/v2/dags/rebuild_read_model/dagRuns/{run['dag_run_id']}"

    def finished():
        state = api.call("GET", run_path)["state"]
        return state if state in ("success", "failed") else None

    state = wait_for("the rebuild_read_model run finishing", finished, 1200, log_path)
    tasks = api.call("GET", f"{run_path}/taskInstances")["task_instances"]
    assert state == "success", [(t["task_id"], t.get("map_index"), t["state"]) for t in tasks]
    assert {t["state"] for t in tasks} <= {"success", "skipped"}

    assert Catalog(settings).current("account_summary").number == 2
    assert query_duckdb(settings, "SELECT * FROM account_summary ORDER BY account_id")[1] == before
    assert_matches_oracle(spark, settings, events, models=[read_models.get("account_summary")])


def _finished(api: AirflowApi, run_path: str):
    state = api.call("GET", run_path)["state"]
    return state if state in ("success", "failed") else None


def test_load_merchants_from_the_rest_api_and_from_the_landing_flag_each_announce_dim_merchants_version(
        settings, airflow_standalone):
    api, log_path = airflow_standalone
    landing = landing_folder(settings)
    # Not landed: unpaused, the DAG runs its latest daily slot at once, and that run loads the newest landed file.
    first = write_sample_merchants(settings.home / "incoming" / "merchants-20261207T0100.csv", 20)
    dag = wait_for("the dag-processor parsing load_merchants",
                   lambda: api.call("GET", "/api/v2/dags/load_merchants"), 180, log_path)
    assert dag["is_paused"]
    api.call("PATCH", "/api/v2/dags/load_merchants", {"is_paused": False})

    def trigger(conf: dict) -> tuple[str, str]:
        run = api.call("POST", "/api/v2/dags/load_merchants/dagRuns", {"logical_date": None, "conf": conf})
        run_path = f"/api/v2/dags/load_merchants/dagRuns/{run['dag_run_id']}"
        return run["dag_run_id"], wait_for("the load_merchants run finishing", lambda: _finished(api, run_path),
                                           600, log_path)

    def announced(run_id: str) -> list[dict]:
        events = api.call("GET", "/api/v2/assets/events?limit=100")["asset_events"]
        return [e["extra"] for e in events if e["source_dag_id"] == "load_merchants" and e["source_run_id"] == run_id]

    # The asset graph as the UI draws it: the landing folder -> load_merchants -> dim_merchant -> backfill (the
    # landing folder's watcher is proven below, by the run its flag starts).
    def parsed():  # every DAG file parsed: the graph has both ends of dim_merchant
        graph = {a["name"]: a for a in api.call("GET", "/api/v2/assets?limit=100")["assets"]}
        return graph if graph.get("dim_merchant", {}).get("scheduled_dags") else None

    graph = wait_for("the asset graph", parsed, 180, log_path)
    landed, dimension = graph["merchants_landed"], graph["dim_merchant"]
    assert {d["dag_id"] for d in landed["scheduled_dags"]} == {"load_merchants"}
    assert {(t["dag_id"], t["task_id"]) for t in dimension["producing_tasks"]} == {("load_merchants", "merge_merchants")}
    assert "backfill_reference" in {d["dag_id"] for d in dimension["scheduled_dags"]}

    # 1. From the trigger form: a source named in the conf.
    run_id, state = trigger({"source": str(first)})
    assert state == "success"
    [extra] = announced(run_id)
    assert (extra["delta_version"], extra["status"], extra["inserted"], extra["changed"]) == (0, "loaded", 20, 0)
    assert len(read_table(settings.table_path(DIM_MERCHANT_TABLE))) == 20

    # 2. A bad source: the check task fails the run, nothing is loaded, no asset event.
    bad = first.parent / "bad.csv"
    bad.write_text("merchant_id,name,mcc,country,risk_level\nm1,A,5411,US,low\nm1,B,5411,US,low\n")
    run_id, state = trigger({"source": str(bad)})
    assert state == "failed"
    tasks = {t["task_id"]: t["state"] for t in api.call(
        "GET", f"/api/v2/dags/load_merchants/dagRuns/{run_id}/taskInstances")["task_instances"]}
    assert tasks == {"stage_merchants": "success", "check_merchants": "failed", "merge_merchants": "upstream_failed"}
    assert announced(run_id) == []
    assert len(read_table(settings.table_path(DIM_MERCHANT_TABLE))) == 20

    # 3. A producer drops a newer file, then the flag: the triggerer's watcher starts a run that loads it.
    write_sample_merchants(landing / "merchants-20261207T0200.csv", 25)  # the same 20 and five more
    (landing / LANDED_MARKER).write_text("")

    def watcher_run():
        runs = api.call("GET", "/api/v2/dags/load_merchants/dagRuns")["dag_runs"]
        return next((r for r in runs if r["run_type"] == "asset_triggered"), None)

    run = wait_for("the landing flag starting a load_merchants run", watcher_run, 300, log_path)
    run_path = f"/api/v2/dags/load_merchants/dagRuns/{run['dag_run_id']}"
    assert wait_for("the asset-triggered run finishing", lambda: _finished(api, run_path), 600, log_path) == "success"
    assert not (landing / LANDED_MARKER).exists()  # the trigger took the flag, never the data
    [extra] = announced(run["dag_run_id"])
    assert (extra["delta_version"], extra["inserted"], extra["unchanged"]) == (1, 5, 20)
    assert extra["source"].endswith("merchants-20261207T0200.csv")
    current = [r for r in read_table(settings.table_path(DIM_MERCHANT_TABLE)).to_pylist() if r["is_current"]]
    assert len(current) == 25
