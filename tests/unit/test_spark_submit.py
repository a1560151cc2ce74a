"""`eventlake spark-submit`'s packaging and line (issue 12), without starting Spark: the zip holds the layers the
apps import and nothing else, each app's launcher imports its code from the zip even where the checkout is
installed, and the line carries what a cluster needs (the zip, the jars, the settings in cluster deploy mode)."""
from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile

import pytest

from infra import spark_submit
from lakehouse.settings import PROJECT_ROOT, Settings
from spark_apps.session import OPENLINEAGE_SPARK, TOKEN_PROVIDER


@pytest.fixture
def settings(tmp_path) -> Settings:
    """Settings whose cache holds jars where `eventlake setup` puts them (empty files: nothing here runs Spark)."""
    s = Settings.load({}).replace(home=tmp_path / "home", cache_dir=tmp_path / "cache")
    (s.cache_dir / "ivy" / "jars").mkdir(parents=True)
    (s.cache_dir / "ivy" / "jars" / "io.delta_delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    (s.cache_dir / "spark-jars").mkdir()
    (s.cache_dir / "spark-jars" / f"{TOKEN_PROVIDER[1]}-{TOKEN_PROVIDER[2]}.jar").write_bytes(b"")
    (s.cache_dir / "spark-jars" / f"{OPENLINEAGE_SPARK[1]}-{OPENLINEAGE_SPARK[2]}.jar").write_bytes(b"")
    return s


def test_the_zip_holds_every_module_of_the_packaged_layers_and_not_the_cli(settings):
    built = spark_submit.package(settings)
    names = set(zipfile.ZipFile(built.zip_path).namelist())
    expected = {p.relative_to(PROJECT_ROOT).as_posix() for layer in spark_submit.PACKAGED
                for p in (PROJECT_ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= names
    assert built.modules == len(expected)
    assert not any(n.startswith(("eventlake/", "tests/", "bench/", "dags/")) or "__pycache__" in n for n in names)


@pytest.mark.parametrize("app", sorted(spark_submit.APPS))
def test_each_app_has_a_main_and_its_launcher_takes_the_code_from_the_zip(settings, app):
    module = importlib.import_module(spark_submit.APPS[app])
    assert callable(getattr(module, "main", None)), f"{module.__name__} has no main(argv)"
    built = spark_submit.package(settings)
    launcher = built.launchers[app].read_text()
    assert f"from {spark_submit.APPS[app]} import main" in launcher
    # The zip first on the path, as spark-submit puts --py-files: the app's module comes from it even though this
    # venv has the checkout installed (editable).
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(built.zip_path)!r}); "
                                                  f"import {spark_submit.APPS[app]} as m; print(m.__file__)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(built.zip_path) + "/"), probe.stdout


def test_a_cluster_mode_line_forwards_the_settings_to_the_driver_and_masks_secrets(settings):
    env = {"KAFKA_BOOTSTRAP_SERVERS": "kafka-0:9092", "EVENTLAKE_HOME": "/shared/eventlake",
           "EVENTLAKE_KAFKA_PASSWORD": "s3cret", "HOME": "/root", "PYSPARK_PYTHON": "./environment/bin/python"}
    line = spark_submit.submit_command(settings, "projection", ["--until-caught-up"], master="yarn",
                                       deploy_mode="cluster", env=env)
    confs = {line[i + 1] for i, arg in enumerate(line) if arg == "--conf"}
    assert "spark.yarn.appMasterEnv.KAFKA_BOOTSTRAP_SERVERS=kafka-0:9092" in confs
    assert "spark.yarn.appMasterEnv.EVENTLAKE_HOME=/shared/eventlake" in confs
    assert "spark.executorEnv.EVENTLAKE_HOME=/shared/eventlake" in confs
    assert "spark.pyspark.python=./environment/bin/python" in confs
    assert not any("HOME=/root" in c for c in confs)  # only eventlake's own settings travel
    assert line[line.index("--deploy-mode") + 1] == "cluster"
    assert line[line.index("--py-files") + 1].endswith(".zip")
    assert {j.rsplit("/", 1)[1] for j in line[line.index("--jars") + 1].split(",")} == {
        "io.delta_delta-spark_4.2_2.13-4.4.0.jar", f"{TOKEN_PROVIDER[1]}-{TOKEN_PROVIDER[2]}.jar"}
    assert line[-2:] == [str(spark_submit.package(settings).launchers["projection"]), "--until-caught-up"]
    shown = spark_submit.shown(line)
    assert "s3cret" not in shown and "EVENTLAKE_KAFKA_PASSWORD=***" in shown
    k8s = spark_submit.submit_command(settings, "rebuild", ["payments"], master="k8s://https://k8s:6443",
                                      deploy_mode="cluster", env=env)
    assert "spark.kubernetes.driverEnv.EVENTLAKE_HOME=/shared/eventlake" in k8s


def test_a_batch_jobs_line_carries_openlineages_listener_with_its_parent_and_a_streaming_apps_does_not(settings):
    parent = "eventlake/rebuild_read_model.rebuild_model.build/019b7c01-0400-7a02-a546-c246159a223c"
    confs = lambda line: dict(line[i + 1].split("=", 1) for i, arg in enumerate(line) if arg == "--conf")  # noqa: E731
    jars = lambda line: {j.rsplit("/", 1)[1] for j in line[line.index("--jars") + 1].split(",")}  # noqa: E731
    listener = f"{OPENLINEAGE_SPARK[1]}-{OPENLINEAGE_SPARK[2]}.jar"

    job = ["rebuild-build", "account_summary", "--dag", "rebuild_read_model", "--run-id", "manual__1"]
    line = spark_submit.submit_command(settings.replace(lineage_parent=parent), "airflow-job", job,
                                       master="spark://127.0.0.1:7077")
    assert listener in jars(line)  # on the driver's classpath before the app's code runs
    conf = confs(line)
    assert conf["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
    # A file of the application's own (the job and its model), never our emitter's events.jsonl.
    assert conf["spark.openlineage.transport.location"] == str(
        settings.home / "lineage" / "spark-eventlake-airflow-job-rebuild-build-account_summary.jsonl")
    # Its parent: the rebuild's run that the driver starts under the task's run (its id planned on both sides
    # from the task's run and the job), itself a child of the task's run.
    from spark_apps.rebuild import rebuild_run

    in_driver = rebuild_run(settings.replace(lineage_parent=parent), "account_summary")
    assert (in_driver.job, in_driver.parent.run_id) == ("rebuild.account_summary", parent.rsplit("/", 1)[1])
    assert (conf["spark.openlineage.parentJobNamespace"], conf["spark.openlineage.parentJobName"],
            conf["spark.openlineage.parentRunId"]) == (settings.lineage_namespace, "rebuild.account_summary",
                                                       in_driver.run_id)
    assert line[-len(job):] == job
    # A job that starts no run of ours (maintenance): the task's run is the application's parent.
    maintain = ["maintain", "payments", "--retention-hours", "168", "--dag", "maintenance", "--run-id", "manual__1"]
    conf = confs(spark_submit.submit_command(settings.replace(lineage_parent=parent), "airflow-job", maintain,
                                             master="spark://127.0.0.1:7077"))
    assert (conf["spark.openlineage.parentJobNamespace"], conf["spark.openlineage.parentJobName"],
            conf["spark.openlineage.parentRunId"]) == tuple(parent.split("/"))
    # A streaming app, or the listener turned off: neither its jar nor its settings.
    for streaming in ("projection", "fraud-detector"):
        line = spark_submit.submit_command(settings, streaming, ["--until-caught-up"])
        assert listener not in jars(line) and "spark.extraListeners" not in confs(line)
    # ... unless spark_lineage=all: the projection's run in the driver (planned under the task's run, as a job's)
    # is its application's parent; a detector starts none, so the task's run is.
    every = settings.replace(lineage_parent=parent, spark_lineage="all")
    line = spark_submit.submit_command(every, "projection", ["payments", "event_archive", "--until-caught-up"])
    conf = confs(line)
    assert listener in jars(line) and conf["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
    from lakehouse.lineage import Lineage
    from spark_apps.projection import projection_job_for

    job = "projection.payments+event_archive"
    assert projection_job_for(["payments", "event_archive"]) == job
    assert (conf["spark.openlineage.parentJobName"], conf["spark.openlineage.parentRunId"]) == (
        job, Lineage(every).planned(job).run_id)
    conf = confs(spark_submit.submit_command(every, "fraud-detector", ["--until-caught-up"]))
    assert (conf["spark.openlineage.parentJobName"], conf["spark.openlineage.parentRunId"]) == tuple(
        parent.split("/"))[1:]
    for off in (settings.replace(spark_lineage="off"), settings.replace(lineage="off")):
        line = spark_submit.submit_command(off, "rebuild", ["payments"])
        assert listener not in jars(line) and "spark.extraListeners" not in confs(line)
    # An odd argument is no path: the file's name keeps to safe characters.
    line = spark_submit.submit_command(settings, "rebuild", ["../x y"])
    assert confs(line)["spark.openlineage.transport.location"].endswith("/lineage/spark-eventlake-rebuild-.._x_y.jsonl")


def test_what_cannot_be_submitted_is_refused_with_the_reason(settings, tmp_path):
    with pytest.raises(spark_submit.SubmitError, match="unknown app 'nope'"):
        spark_submit.submit_command(settings, "nope")
    with pytest.raises(spark_submit.SubmitError, match="cluster deploy mode only on YARN and Kubernetes"):
        spark_submit.submit_command(settings, "projection", master="spark://127.0.0.1:7077", deploy_mode="cluster")
    bare = settings.replace(cache_dir=tmp_path / "empty-cache")
    with pytest.raises(spark_submit.SubmitError, match="run `eventlake setup` once"):
        spark_submit.submit_command(bare, "projection")


def test_a_yarn_line_takes_the_spark_settings_eventlake_yarn_up_wrote_next_to_the_hadoop_conf(settings, tmp_path):
    conf_dir = tmp_path / "hadoop-conf"
    conf_dir.mkdir()
    (conf_dir / "eventlake-spark.conf").write_text("# a comment\nspark.yarn.jars=local:/opt/spark/jars/*\n"
                                                  "spark.executor.memory=1g\n")
    env = {"HADOOP_CONF_DIR": str(conf_dir)}
    confs = lambda line: {line[i + 1] for i, arg in enumerate(line) if arg == "--conf"}  # noqa: E731
    line = spark_submit.submit_command(settings, "projection", master="yarn", env=env,
                                       conf={"spark.executor.memory": "2g"})
    assert "spark.yarn.jars=local:/opt/spark/jars/*" in confs(line)
    assert "spark.executor.memory=2g" in confs(line) and "spark.executor.memory=1g" not in confs(line)  # --conf wins
    assert not any("comment" in c for c in confs(line))
    # Another master, or no such file: nothing of it.
    assert not any(c.startswith("spark.yarn.jars") for c in confs(spark_submit.submit_command(
        settings, "projection", master="spark://127.0.0.1:7077", env=env)))
    assert not any(c.startswith("spark.yarn.jars") for c in confs(spark_submit.submit_command(
        settings, "projection", master="yarn", env={"HADOOP_CONF_DIR": str(tmp_path)})))
