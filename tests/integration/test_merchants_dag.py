"""The load_merchants DAG: it parses with its three tasks, its schedule (cron or the landing flag's AssetWatcher)
and its outlet; `airflow dags test` runs it on a landed file and its asset event carries the Delta version and the
counts (heavy: Airflow in a subprocess)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.airflow import environment
from lakehouse.lineage import events_file, read_events
from lakehouse.settings import PROJECT_ROOT, Settings
from lakehouse.tables import read_table
from read_models.catalog import DIM_MERCHANT_TABLE
from reference_data.loads import landing_folder
from reference_data.samples import write_sample_merchants
from tests.integration.test_dags import dags_test, output

PARSE = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={path!r})
dag = bag.dags.get("load_merchants")
print(json.dumps({{"errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "tasks": sorted(t.task_id for t in dag.tasks) if dag else None,
                  "outlets": [a.name for a in dag.get_task("merge_merchants").outlets] if dag else None,
                  "params": sorted(dag.params) if dag else None,
                  "schedule": type(dag.timetable).__name__ if dag else None,
                  "watchers": [w.name for _, a in dag.timetable.asset_condition.iter_assets()
                               for w in a.watchers] if dag else None}}))
"""


def test_the_dag_parses_with_its_tasks_schedule_watcher_and_outlet(tmp_path):
    env = environment(Settings(home=tmp_path))
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    code = PARSE.format(path=str(PROJECT_ROOT / "dags" / "load_merchants.py"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, output(proc)[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"errors": {}, "tasks": ["check_merchants", "merge_merchants", "stage_merchants"],
                     "outlets": ["dim_merchant"], "params": ["conn_id", "full", "source"], "schedule": "AssetOrTimeSchedule",
                     "watchers": ["merchants_ready_flag"]}


@pytest.mark.heavy
def test_a_run_loads_the_newest_landed_file_and_a_bad_source_fails_the_check_task(tmp_path):
    settings = Settings(home=tmp_path / "home")
    write_sample_merchants(landing_folder(settings) / "merchants-1.csv", 20)
    proc = dags_test(settings, "load_merchants")
    assert proc.returncode == 0, output(proc)[-5000:]
    assert "20 inserted, 0 changed, 0 closed, 0 unchanged; dim_merchant at Delta version 0" in output(proc)
    assert len(read_table(settings.table_path(DIM_MERCHANT_TABLE))) == 20
    # One lineage graph: Airflow's OpenLineage provider wrote the task's run beside ours (the same file, the same
    # namespace), and our load's run names it as its parent.
    events = read_events(events_file(settings))
    task = [e for e in events if e["job"]["name"] == "load_merchants.merge_merchants" and e["eventType"] == "START"]
    [load] = [e for e in events if e["job"]["name"] == "load_merchants" and e["eventType"] == "START"]
    assert len(task) == 1 and task[0]["job"]["namespace"] == load["job"]["namespace"] == settings.lineage_namespace
    parent = load["run"]["facets"]["parent"]
    assert (parent["job"]["name"], parent["run"]["runId"]) == ("load_merchants.merge_merchants", task[0]["run"]["runId"])
    bad = tmp_path / "bad.csv"
    bad.write_text("merchant_id,name,mcc,country,risk_level\nm1,A,5411,US,low\nm1,B,5411,US,low\n")
    proc = dags_test(settings, "load_merchants", {"source": str(bad)})
    assert proc.returncode != 0 and "failed 1 expectation(s) of suite merchants_staged" in output(proc)
    assert len(read_table(settings.table_path(DIM_MERCHANT_TABLE))) == 20  # nothing loaded
    assert Path(bad).exists()
