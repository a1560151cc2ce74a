"""The DAGs' choice between Spark in the Airflow worker and a submission to a cluster (issue 46 part 4), without
Airflow or Spark: the connection `eventlake_spark` the local Airflow gets from the settings (none for a local
master; a given one wins), the master a connection names (read as the provider's hook reads it; a local one or
none: the worker), and what the submitting operator runs (the packaged `airflow-job` app's launcher, the zip, the
job's arguments, the project's Spark settings). The DAG wiring (which operator each way, under Airflow's own
DagBag) and a real run on the standalone cluster: tests/integration/test_dags_spark_cluster.py (heavy)."""
from __future__ import annotations

import json
import sys

import pytest

from infra import airflow, airflow_assets, airflow_spark, spark_submit
from lakehouse.settings import Settings
from spark_apps import airflow_jobs
from spark_apps.session import JVM_OPTIONS

ENV = f"AIRFLOW_CONN_{airflow_spark.SPARK_CONNECTION_ID.upper()}"


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.load({}).replace(home=tmp_path / "home", cache_dir=tmp_path / "cache")


def test_a_cluster_master_in_the_settings_is_airflows_spark_connection_and_a_local_one_is_none(settings):
    assert airflow_spark.spark_connection_env(settings.replace(spark_master="local[2]")) == {}
    assert ENV not in airflow.environment(settings.replace(spark_master="local[2]"), base={})
    cluster = settings.replace(spark_master="spark://127.0.0.1:17077")
    given = airflow.environment(cluster, base={})
    assert json.loads(given[ENV]) == {"conn_type": "spark", "host": "spark://127.0.0.1:17077"}
    conn = json.loads(given[ENV])
    assert airflow_spark.master_of(conn["conn_type"], conn["host"], None) == "spark://127.0.0.1:17077"
    # A connection the environment gives wins.
    assert airflow.environment(cluster, base={ENV: "spark://elsewhere:7077"})[ENV] == "spark://elsewhere:7077"


@pytest.mark.parametrize("conn_type, host, port, master", [
    ("spark", "spark://10.0.0.5:7077", None, "spark://10.0.0.5:7077"),  # the UI's way: the URL in the host
    ("spark", "spark://10.0.0.5", 7077, "spark://10.0.0.5:7077"),
    ("spark", "yarn", None, "yarn"),
    ("spark", "k8s://https://k8s:6443", None, "k8s://https://k8s:6443"),
    ("k8s", "https://k8s", 6443, "k8s://https://k8s:6443"),  # from a URI: the scheme is the type
    ("spark", "local[2]", None, None),  # a local master: the worker runs it
    ("spark", "", None, None),
    ("spark", None, None, None),
])
def test_the_master_a_connection_names_and_none_for_a_local_or_empty_one(conn_type, host, port, master):
    assert airflow_spark.master_of(conn_type, host, port) == master


def test_the_submission_runs_the_packaged_airflow_job_with_the_jobs_arguments_and_the_projects_settings(settings):
    args = ["rebuild-build", "payments", "--dag", "rebuild_read_model", "--run-id", "{{ run_id }}"]
    found = airflow_spark.submit_arguments(settings, "spark://127.0.0.1:17077", args, "eventlake-rebuild", env={})
    paths = spark_submit.package_paths(settings)
    assert found["conn_id"] == "eventlake_spark"
    assert found["application"] == str(paths.launchers["airflow-job"]) == str(
        settings.cache_dir / "dist" / "run_airflow_job.py")
    assert found["py_files"] == str(paths.zip_path)
    assert found["application_args"] == args and found["name"] == "eventlake-rebuild"
    assert found["driver_memory"] == settings.spark_driver_memory
    assert found["conf"] == {"spark.driver.extraJavaOptions": JVM_OPTIONS,
                             "spark.executor.extraJavaOptions": JVM_OPTIONS, "spark.pyspark.python": sys.executable}
    # The Python the environment names for the executors wins.
    assert airflow_spark.submit_arguments(settings, "spark://h:7077", args, "x", env={
        "PYSPARK_PYTHON": "/opt/venv/bin/python"})["conf"]["spark.pyspark.python"] == "/opt/venv/bin/python"
    # The app is one the packaging writes a launcher for, and the launcher's module takes those arguments.
    assert spark_submit.APPS[airflow_spark.APP] == airflow_jobs.__name__
    assert paths.launchers.keys() == spark_submit.package(settings).launchers.keys()


def test_the_submitted_job_refuses_an_unknown_job_and_a_missing_run(capsys):
    with pytest.raises(SystemExit):
        airflow_jobs.main(["fold-everything"])
    with pytest.raises(SystemExit):
        airflow_jobs.main(["rebuild-build", "payments", "--dag", "rebuild_read_model"])  # no --run-id
    assert "--run-id" in capsys.readouterr().err


def test_a_result_is_per_dag_run_and_model(settings):
    a = airflow_jobs.result_path(settings, "rebuild_read_model", "manual__2026-01-01T00:00:00+00:00", "payments")
    b = airflow_jobs.result_path(settings, "rebuild_read_model", "manual__2026-01-02T00:00:00+00:00", "payments")
    assert a != b and a.name == "payments.json" and settings.home in a.parents and ":" not in a.parent.name


def test_results_are_read_back_and_only_recent_runs_keep_theirs(settings):
    import os
    import time

    dag = "rebuild_read_model"
    airflow_jobs.write_result(settings, dag, "old_run", "payments", {"generation": 1})
    airflow_jobs.write_result(settings, dag, "recent_run", "payments", {"generation": 2})
    long_ago = time.time() - (airflow_jobs.RESULTS_KEPT_DAYS + 1) * 86_400
    os.utime(airflow_jobs.result_path(settings, dag, "old_run", "payments").parent, (long_ago, long_ago))
    airflow_jobs.write_result(settings, dag, "new_run", "payments", {"generation": 3})
    assert airflow_jobs.read_result(settings, dag, "new_run", "payments") == {"generation": 3}
    assert airflow_jobs.read_result(settings, dag, "recent_run", "payments") == {"generation": 2}
    with pytest.raises(FileNotFoundError):
        airflow_jobs.read_result(settings, dag, "old_run", "payments")


# -- Each DAG's submitted job: its arguments as Airflow renders them, read back by the app's own parser ----------

def _rendered(template_args: list[str], map_index: int) -> list[str]:
    """The job's arguments as the task renders them (Jinja, as Airflow does) in a run of 2026-01-02."""
    import datetime as dt

    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    context = {"ti": {"map_index": map_index}, "run_id": "scheduled__2026-01-02T00:00:00+00:00",
               "data_interval_start": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
               "data_interval_end": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc),
               "params": {"retention_hours": 200}}
    return [env.from_string(a).render(**context) for a in template_args]


@pytest.mark.parametrize("dag_id, models, job, options", [
    ("reprocess_windows", airflow_assets.WINDOWED, "reprocess-range",
     {"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-02T00:00:00+00:00"}),
    ("maintenance", airflow_assets.READ_MODELS, "maintain", {"retention_hours": 200}),
])
def test_each_dags_submitted_job_gets_its_tasks_model_and_run_and_the_app_reads_them(settings, dag_id, models, job,
                                                                                      options):
    template = airflow_spark.job_arguments(dag_id, airflow_spark.mapped_value(models))
    found = airflow_spark.submit_arguments(settings, "spark://127.0.0.1:17077", template, f"eventlake-{job}", env={})
    assert found["application"] == str(spark_submit.package_paths(settings).launchers["airflow-job"])
    assert found["application_args"] == template and template[0] == job
    assert len(models) > 1
    for index, model in enumerate(models):  # each mapped task submits its own model, for its own run's result
        args = airflow_jobs.parser().parse_args(_rendered(template, index))
        assert (args.job, args.name, args.dag, args.run_id) == (job, model, dag_id,
                                                                "scheduled__2026-01-02T00:00:00+00:00")
        assert {k: getattr(args, k) for k in options} == options
        assert airflow_jobs._refused(args) is None
    with pytest.raises(KeyError, match="submits no job"):
        airflow_spark.job_arguments("check_read_models", "payments")


def test_the_rebuild_submits_the_model_the_forms_list_names():
    template = airflow_spark.job_arguments("rebuild_read_model", "{{ models[ti.map_index] }}")
    import jinja2

    rendered = [jinja2.Template(a).render(models=["payments", "fraud_alerts"], ti={"map_index": 1}, run_id="r")
                for a in template]
    args = airflow_jobs.parser().parse_args(rendered)
    assert (args.job, args.name, args.dag, args.run_id) == ("rebuild-build", "fraud_alerts", "rebuild_read_model", "r")
    assert args.lineage_parent == ""  # no OpenLineage provider plugin: no parent
    # With Airflow's OpenLineage plugin, the task's run is the parent of the job's own lineage runs.
    parent = "eventlake/rebuild_read_model.rebuild_model.build/019ad0e4-5b7c-7d2e-9f3a-6c1b2d3e4f50"
    plugin = type("Plugin", (), {"lineage_parent_id": staticmethod(lambda ti: parent)})
    macros = type("Macros", (), {"OpenLineageProviderPlugin": plugin})
    rendered = [jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(a).render(
        models=["payments"], ti={"map_index": 0}, task_instance={}, run_id="r", macros=macros) for a in template]
    assert airflow_jobs.parser().parse_args(rendered).lineage_parent == parent


@pytest.mark.parametrize("argv, reason", [
    (["reprocess-range", "account_summary", "--from", "2026-01-01", "--to", "2026-01-02"],
     "reprocess-range: read model account_summary has no time windows to reprocess"),
    (["reprocess-range", "merchant_minute_volume", "--from", "yesterday", "--to", "2026-01-02"],
     "reprocess-range: --from 'yesterday' is not a time"),
    (["reprocess-range", "merchant_minute_volume", "--from", "2026-01-02", "--to", "2026-01-01"],
     "is not before --to"),
    (["reprocess-range", "merchant_minute_volume", "--from", "2026-01-01"], "--to"),
    (["maintain", "payments", "--retention-hours", "24"],
     "maintain: --retention-hours 24: below Delta's default retention of 168 hours"),
    (["maintain", "no_such_model", "--retention-hours", "168"], "maintain: unknown read model 'no_such_model'"),
    (["maintain", "payments", "--retention-hours", "a week"], "invalid int value: 'a week'"),
])
def test_a_bad_argument_of_a_job_is_refused_before_spark_with_the_reason(settings, monkeypatch, capsys, argv,
                                                                         reason):
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    with pytest.raises(SystemExit) as exited:
        airflow_jobs.main([*argv, "--dag", "d", "--run-id", "r"])
    assert exited.value.code == 2
    assert reason in capsys.readouterr().err
    assert not (settings.home / "airflow-jobs").exists()  # nothing ran, nothing written


def test_a_day_with_nothing_to_reprocess_is_skipped_without_spark_and_its_result_written(settings, monkeypatch):
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    args = ["reprocess-range", "merchant_minute_volume", "--from", "2026-01-01T00:00:00+00:00", "--to",
            "2026-01-02T00:00:00+00:00", "--dag", "reprocess_windows", "--run-id", "scheduled__2026-01-02"]
    stale = airflow_jobs.result_path(Settings.load(role="reader"), "reprocess_windows", "scheduled__2026-01-02",
                                     "merchant_minute_volume")
    airflow_jobs.write_result(Settings.load(role="reader"), "reprocess_windows", "scheduled__2026-01-02",
                              "merchant_minute_volume", {"table_version": 7})  # an earlier attempt's
    assert stale.exists()
    assert airflow_jobs.main(args) == 0
    assert airflow_jobs.read_result(Settings.load(role="reader"), "reprocess_windows", "scheduled__2026-01-02",
                                    "merchant_minute_volume") == {
        "read_model": "merchant_minute_volume", "skipped": "no event applied yet", "late_folded": 0}


def test_the_backfills_submitted_job_names_the_reference_table_and_its_run_and_refuses_another(settings):
    from read_models.catalog import DIM_MERCHANT_TABLE

    template = airflow_spark.job_arguments("backfill_reference", DIM_MERCHANT_TABLE)
    args = airflow_jobs.parser().parse_args(_rendered(template, 0))
    assert (args.job, args.name, args.dag, args.run_id) == ("backfill", DIM_MERCHANT_TABLE, "backfill_reference",
                                                            "scheduled__2026-01-02T00:00:00+00:00")
    assert airflow_jobs._refused(args) is None
    other = airflow_jobs.parser().parse_args(["backfill", "dim_customer", "--dag", "d", "--run-id", "r"])
    assert "unknown reference table 'dim_customer'" in airflow_jobs._refused(other)
