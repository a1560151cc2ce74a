"""The DAGs' Spark work submitted to a cluster (issue 46 part 4): with the Airflow connection `eventlake_spark`
(the local Airflow gets it from EVENTLAKE_SPARK_MASTER) the rebuild's `build` is the Spark provider's
SparkSubmitOperator running the packaged `airflow-job` app; without it the task starts Spark in the worker. The
rebuild DAG run with `airflow dags test` on the standalone cluster (`eventlake spark-cluster up`) builds the same
generation, row for row, as the run in the worker, with the driver's output in the task's log and the lock
handed from the submitted build to `check` and `switch`. `reprocess_windows` and `maintenance` are wired the same
way (their task graphs both ways, under Airflow's own DagBag); their runs in the worker are
tests/integration/test_reprocess.py and test_maintenance.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from infra import airflow_assets as assets
from infra import airflow_spark
from infra.airflow import environment
from projection_core.rebuild_lock import lock_path
from read_models.catalog import Catalog
from tests.domain_helpers import events_for
from tests.integration.test_dags import EVENTLAKE, eventlake_env, output
from tests.integration.test_rebuild import project, publish
from tests.integration.test_spark_standalone import spark_cluster  # noqa: F401 -- the module's cluster fixture
from tests.oracle import assert_matches_oracle

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REBUILT = ["account_summary", "merchant_minute_volume"]


def _tasks(env: dict, dag_id: str = "rebuild_read_model", dag_file: str = "rebuild_read_model.py") -> dict:
    code = ("import json; from airflow.dag_processing.dagbag import DagBag; from infra.airflow import DAGS_FOLDER\n"
            f"bag = DagBag(dag_folder=str(DAGS_FOLDER / {dag_file!r}))\n"
            "assert not bag.import_errors, bag.import_errors\n"
            f"dag = bag.dags[{dag_id!r}]\n"
            "print(json.dumps({t.task_id: [type(t).__name__, sorted(t.upstream_task_ids),"
            " {k: getattr(t, k, None) for k in ('application', 'application_args', 'py_files', '_conn_id',"
            " 'max_active_tis_per_dag', 'map_index_template')} | {'outlets': sorted(o.name for o in t.outlets)}]"
            " for t in dag.tasks}))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_build_is_submitted_where_the_connection_names_a_master_and_runs_in_the_worker_without(settings):
    local = _tasks(environment(settings, base=eventlake_env(settings)))
    assert {t: kind for t, (kind, _, _) in local.items()} == {
        "choose_read_models": "_PythonDecoratedOperator", "rebuild_model.build": "_PythonDecoratedOperator",
        "rebuild_model.check": "_PythonDecoratedOperator", "rebuild_model.switch": "_PythonDecoratedOperator"}

    on_cluster = _tasks(environment(settings.replace(spark_master="spark://127.0.0.1:7077"),
                                    base={**eventlake_env(settings), "EVENTLAKE_SPARK_MASTER": "spark://127.0.0.1:7077"}))
    kind, upstream, fields = on_cluster["rebuild_model.build"]
    assert kind == "EventlakeSparkSubmitOperator" and upstream == ["choose_read_models"]
    assert fields["_conn_id"] == "eventlake_spark" and fields["application"].endswith("run_airflow_job.py")
    assert fields["application_args"][0] == "rebuild-build" and "{{ run_id }}" in fields["application_args"]
    assert on_cluster["rebuild_model.built"][1] == ["choose_read_models", "rebuild_model.build"]
    assert on_cluster["rebuild_model.check"][1] == ["rebuild_model.built"]
    assert on_cluster["rebuild_model.switch"][1] == ["rebuild_model.check"]


def _cluster_env(settings) -> dict:
    return environment(settings.replace(spark_master="spark://127.0.0.1:7077"),
                       base={**eventlake_env(settings), "EVENTLAKE_SPARK_MASTER": "spark://127.0.0.1:7077"})


def test_the_reprocess_is_submitted_where_the_connection_names_a_master_and_runs_in_the_worker_without(settings):
    local = _tasks(environment(settings, base=eventlake_env(settings)), "reprocess_windows", "reprocess_windows.py")
    assert {t: (kind, up, fields["outlets"]) for t, (kind, up, fields) in local.items()} == {
        "reprocess_read_model": ("DecoratedMappedOperator", [], [assets.REPROCESSED])}

    on_cluster = _tasks(_cluster_env(settings), "reprocess_windows", "reprocess_windows.py")
    assert {t: (kind, up, fields["outlets"]) for t, (kind, up, fields) in on_cluster.items()} == {
        "reprocess_read_model.check_waiting": ("_PythonDecoratedOperator", [], []),
        "reprocess_read_model.reprocess": ("EventlakeSparkSubmitOperator", ["reprocess_read_model.check_waiting"], []),
        # The asset event comes from the task that reads the submitted job's result.
        "reprocess_read_model.reprocessed": ("_PythonDecoratedOperator", ["reprocess_read_model.reprocess"],
                                             [assets.REPROCESSED])}
    fields = on_cluster["reprocess_read_model.reprocess"][2]
    assert fields["_conn_id"] == "eventlake_spark" and fields["application"].endswith("run_airflow_job.py")
    assert fields["application_args"] == airflow_spark.job_arguments(
        "reprocess_windows", airflow_spark.mapped_value(assets.WINDOWED))
    assert fields["application_args"][0] == "reprocess-range" and "{{ run_id }}" in fields["application_args"]
    assert fields["map_index_template"] == airflow_spark.mapped_value(assets.WINDOWED)


def test_the_maintenance_is_submitted_where_the_connection_names_a_master_and_runs_in_the_worker_without(settings):
    local = _tasks(environment(settings, base=eventlake_env(settings)), "maintenance", "maintenance.py")
    assert {t: (kind, up, fields["outlets"]) for t, (kind, up, fields) in local.items()} == {
        "maintain_read_model": ("DecoratedMappedOperator", [], [assets.MAINTAINED])}

    on_cluster = _tasks(_cluster_env(settings), "maintenance", "maintenance.py")
    assert {t: (kind, up, fields["outlets"]) for t, (kind, up, fields) in on_cluster.items()} == {
        "maintain_read_model.maintain": ("EventlakeSparkSubmitOperator", [], []),
        "maintain_read_model.maintained": ("_PythonDecoratedOperator", ["maintain_read_model.maintain"],
                                           [assets.MAINTAINED])}
    fields = on_cluster["maintain_read_model.maintain"][2]
    assert fields["_conn_id"] == "eventlake_spark" and fields["application"].endswith("run_airflow_job.py")
    assert fields["application_args"] == airflow_spark.job_arguments(
        "maintenance", airflow_spark.mapped_value(assets.READ_MODELS))
    assert "{{ params.retention_hours }}" in fields["application_args"]
    # One model at a time, as in the worker: the models share the cluster with the live projection.
    assert fields["max_active_tis_per_dag"] == 1 == local["maintain_read_model"][2]["max_active_tis_per_dag"]


def _rows(spark, settings, name: str, generation: int) -> list:
    table = Catalog(settings).generation(name, generation).table
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).collect())


def test_the_rebuild_dag_on_the_standalone_cluster_builds_what_the_worker_builds(spark, settings,
                                                                                 spark_cluster):  # noqa: F811
    master, _web = spark_cluster
    events = events_for(GeneratorConfig(accounts=10, commands=160, seed=46, run_id="cluster", late_rate=0.05),
                        flag_every=9)
    publish(settings, events[:-25])
    project(spark, settings)
    publish(settings, events[-25:])  # in Kafka, not yet archived: each build catches them up

    def dags_test(env: dict) -> subprocess.CompletedProcess:
        conf = json.dumps({"read_models": REBUILT, "dry_run": False})
        return subprocess.run([EVENTLAKE, "airflow", "dags", "test", "rebuild_read_model", "-c", conf], env=env,
                              capture_output=True, text=True, timeout=1500)

    in_worker = dags_test(eventlake_env(settings))
    assert in_worker.returncode == 0, output(in_worker)[-6000:]
    assert "Spark-Submit cmd" not in output(in_worker)

    on_cluster = dags_test({**eventlake_env(settings), "EVENTLAKE_SPARK_MASTER": master,
                            "EVENTLAKE_SPARK_DRIVER_MEMORY": "1g"})
    text = output(on_cluster)
    assert on_cluster.returncode == 0, text[-8000:]
    # The provider's operator submitted the packaged app to the cluster; the driver's output is in the task log.
    assert "Spark-Submit cmd" in text and f"--master {master}" in text, text[-8000:]
    assert "eventlake: airflow-job: code from" in text and "eventlake-" in text and ".zip" in text
    assert text.count("built on the cluster") == len(REBUILT), text[-8000:]
    assert "catch-up [2/2]" in text

    catalog = Catalog(settings)
    assert {n: catalog.current(n).number for n in read_models.REGISTRY} == {
        n: 3 if n in REBUILT else 1 for n in read_models.REGISTRY}
    for name in REBUILT:  # generation 2 built in the worker, 3 on the cluster, from the same log
        assert _rows(spark, settings, name, 3) == _rows(spark, settings, name, 2), name
    assert_matches_oracle(spark, settings, events, models=[read_models.get(n) for n in REBUILT])
    assert not any(lock_path(settings, n).exists() for n in REBUILT)

    # OpenLineage's Spark listener in the submitted driver (its jar on the submission's --jars): the Spark
    # application's run is a child of the driver's rebuild run (its id planned by the submitting task too), a child
    # of the build task's run that submitted it; a query names the generation's table it wrote.
    from lakehouse.lineage import events_file, read_events, spark_events_file

    ours = [e for e in read_events(events_file(settings)) if e["eventType"] == "START"]
    builds = {e["run"]["runId"] for e in ours if e["job"]["name"] == "rebuild_read_model.rebuild_model.build"}
    for name in REBUILT:
        rebuilds = {e["run"]["runId"] for e in ours if e["job"]["name"] == f"rebuild.{name}"
                    and e["run"]["facets"]["parent"]["run"]["runId"] in builds}
        spark_runs = read_events(spark_events_file(settings, f"eventlake-airflow-job-rebuild-build-{name}"))
        parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in spark_runs
                   if "parent" in e["run"].get("facets", {})}
        assert len(parents & rebuilds) == 1, (name, parents, rebuilds)  # (the queries' parent: the application)
        written = {o["name"] for e in spark_runs for o in e.get("outputs", [])}
        assert str(Catalog(settings).generation(name, 3).table) in written, (name, written)
