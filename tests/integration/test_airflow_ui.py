"""A rebuild driven the way users drive it (issue 9): Airflow's real services (`airflow standalone`: api-server,
scheduler, dag-processor, triggerer) on eventlake's DAGs; `rebuild_read_model` unpaused and triggered with a conf
through Airflow's REST API, as the UI's trigger form does; the run succeeds and readers see the new generation."""
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
from infra import airflow
from read_models.catalog import Catalog
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
