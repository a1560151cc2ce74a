"""OpenLineage run events of eventlake's own jobs (lakehouse.lineage), through openlineage-python's real file
transport: dataset names as Spark's listener and Airflow's provider give them, START then COMPLETE or FAIL, a
parent run, and emission that never stops a job."""
import pytest

from lakehouse.lineage import Dataset, Lineage, database, events_file, kafka_topic, read_events, table
from lakehouse.settings import Settings, SettingsError


def _named(datasets):
    return [(d["namespace"], d["name"]) for d in datasets]


def _settings(tmp_path, **kw):
    return Settings.load({}).replace(home=tmp_path / "home", kafka_bootstrap_servers="b1:9092,b2:9092", **kw)


def test_datasets_are_named_as_openlineage_names_them(tmp_path):
    settings = _settings(tmp_path)
    assert kafka_topic(settings, "eventlake.events") == Dataset("kafka://b1:9092", "eventlake.events")
    assert table(tmp_path / "w" / ".." / "w" / "payments") == Dataset("file", str(tmp_path / "w" / "payments"))
    assert table("s3a://lake/warehouse/payments") == Dataset("s3://lake", "/warehouse/payments")
    assert table("hdfs://nn:8020/eventlake/warehouse/t") == Dataset("hdfs://nn:8020", "/eventlake/warehouse/t")
    assert table("file:///data/t") == Dataset("file", "/data/t")
    assert database("sqlite:////srv/ref/merchants.db", "merchants") == Dataset("sqlite:///srv/ref/merchants.db",
                                                                                "merchants")
    assert database("postgresql+psycopg2://u:***@db.example:5433/ref", "merchants") == Dataset(
        "postgres://db.example:5433", "ref.public.merchants")
    assert database("postgresql://u@db/ref", "sales.merchants") == Dataset("postgres://db:5432", "ref.sales.merchants")


def test_a_run_is_a_start_then_a_complete_with_its_datasets_and_its_parent(tmp_path):
    settings = _settings(tmp_path)
    lineage = Lineage.for_settings(settings, log=lambda *_: None)
    parent = lineage.start("rebuild", [table(tmp_path / "archive")], job_type="JOB")
    with lineage.running("rebuild.fold", [table(tmp_path / "archive")], [table(tmp_path / "payments")],
                         parent=parent) as child:
        pass
    lineage.complete(parent)
    events = read_events(events_file(settings))
    assert [(e["eventType"], e["job"]["name"]) for e in events] == [
        ("START", "rebuild"), ("START", "rebuild.fold"), ("COMPLETE", "rebuild.fold"), ("COMPLETE", "rebuild")]
    start = events[1]
    assert start["job"]["namespace"] == "eventlake" and start["run"]["runId"] == child.run_id
    assert start["run"]["facets"]["parent"]["run"]["runId"] == parent.run_id
    parent_job = start["run"]["facets"]["parent"]["job"]
    assert (parent_job["namespace"], parent_job["name"]) == ("eventlake", "rebuild")
    assert _named(start["inputs"]) == [("file", str(tmp_path / "archive"))]
    assert _named(start["outputs"]) == [("file", str(tmp_path / "payments"))]
    assert start["job"]["facets"]["jobType"]["processingType"] == "BATCH"


def test_a_parent_from_elsewhere_is_every_runs_parent_unless_one_is_given(tmp_path):
    # An Airflow task's run, as its OpenLineage provider names it (a job name holding dots and a slash).
    run_id = "019ad0e4-5b7c-7d2e-9f3a-6c1b2d3e4f50"
    settings = _settings(tmp_path, lineage_parent=f"airflow/rebuild_read_model.rebuild_model/build/{run_id}")
    lineage = Lineage(settings, log=lambda *_: None)
    with lineage.running("rebuild.payments") as child:
        with lineage.running("rebuild.payments.fold", parent=child):
            pass
    starts = [e for e in read_events(events_file(settings)) if e["eventType"] == "START"]
    facet = starts[0]["run"]["facets"]["parent"]
    assert (facet["job"]["namespace"], facet["job"]["name"], facet["run"]["runId"]) == (
        "airflow", "rebuild_read_model.rebuild_model/build", run_id)
    assert starts[1]["run"]["facets"]["parent"]["run"]["runId"] == child.run_id
    # A planned run (the parent of the Spark application it runs in) starts under the id it was given, the same
    # in every process under that parent; without a parent each plan is a new run.
    planned = lineage.planned("reprocess.payments")
    with lineage.running("reprocess.payments", run_id=planned.run_id):
        pass
    start = [e for e in read_events(events_file(settings)) if e["eventType"] == "START"][-1]
    assert start["run"]["runId"] == planned.run_id == Lineage(settings).planned("reprocess.payments").run_id
    assert start["run"]["facets"]["parent"]["run"]["runId"] == run_id
    assert planned.run_id != lineage.planned("rebuild.payments").run_id
    alone = Lineage(_settings(tmp_path / "alone"), log=lambda *_: None)
    assert alone.planned("backfill").run_id != alone.planned("backfill").run_id
    for bad in ("no-slashes", "airflow/job/not-a-uuid"):
        with pytest.raises(SettingsError, match=f"lineage_parent='{bad}'.*<namespace>/<job>/<run id, a UUID>"):
            Lineage(_settings(tmp_path, lineage_parent=bad))


def test_a_failed_run_ends_as_fail_with_its_error_and_the_error_goes_on(tmp_path):
    settings = _settings(tmp_path, lineage_namespace="prod")
    lineage = Lineage(settings, log=lambda *_: None)
    with pytest.raises(ValueError, match="bad batch"):
        with lineage.running("projection", job_type="SERVICE"):
            raise ValueError("bad batch")
    start, end = read_events(events_file(settings))
    assert start["job"]["facets"]["jobType"]["processingType"] == "STREAMING"
    assert end["eventType"] == "FAIL" and end["job"]["namespace"] == "prod"
    assert end["run"]["facets"]["errorMessage"]["message"] == "bad batch"


def test_off_emits_nothing_and_a_bad_setting_is_refused(tmp_path):
    settings = _settings(tmp_path, lineage="off")
    lineage = Lineage(settings)
    lineage.complete(lineage.start("handler"))
    assert not lineage.enabled and not events_file(settings).exists()
    with pytest.raises(SettingsError, match="lineage='yes'.*expected on or off"):
        Lineage(_settings(tmp_path, lineage="yes"))


def test_a_transport_that_fails_is_said_once_and_the_job_goes_on(tmp_path):
    settings = _settings(tmp_path)
    lines = []
    lineage = Lineage(settings, log=lines.append)
    events_file(settings).unlink(missing_ok=True)
    events_file(settings).mkdir(parents=True)  # a directory where the file should be: every write fails
    for _ in range(3):
        lineage.complete(lineage.start("handler"))
    assert len(lines) == 1 and "could not be emitted" in lines[0] and "the job goes on" in lines[0]


def test_a_line_cut_short_by_a_kill_is_skipped_when_read(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"eventType": "START"}\n{"eventType": "COMP')
    assert read_events(path) == [{"eventType": "START"}]


def test_the_batch_jobs_spark_sessions_carry_the_listener_with_the_tasks_run_as_parent(tmp_path):
    from spark_apps.session import OPENLINEAGE_SPARK, spark_lineage_conf

    jar = tmp_path / "cache" / "spark-jars" / f"{OPENLINEAGE_SPARK[1]}-{OPENLINEAGE_SPARK[2]}.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"")  # in the cache already: nothing is fetched
    parent = "eventlake/reprocess_windows.reprocess_read_model/019b7c01-0400-7a02-a546-c246159a223c"
    settings = _settings(tmp_path, cache_dir=tmp_path / "cache", lineage_parent=parent)
    conf = spark_lineage_conf(settings, "eventlake-reprocess-payments")
    assert conf["spark.jars"] == str(jar)
    assert conf["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
    # A file per application: never the one our emitter appends to.
    assert conf["spark.openlineage.transport.location"] == str(
        settings.home / "lineage" / "spark-eventlake-reprocess-payments.jsonl") != str(events_file(settings))
    assert (conf["spark.openlineage.parentJobNamespace"], conf["spark.openlineage.parentJobName"],
            conf["spark.openlineage.parentRunId"]) == tuple(parent.split("/"))
    # A job that starts a run of its own makes it the application's parent, its id planned before the session.
    from lakehouse.lineage import Lineage, planned_run_id

    planned = Lineage(settings).planned("reprocess.payments")
    assert planned.run_id == planned_run_id(parent, "reprocess.payments")  # what a submitting process names too
    assert planned.parent.run_id == parent.rsplit("/", 1)[1]
    conf = spark_lineage_conf(settings, "eventlake-reprocess-payments", parent=planned)
    assert (conf["spark.openlineage.parentJobNamespace"], conf["spark.openlineage.parentJobName"],
            conf["spark.openlineage.parentRunId"]) == (settings.lineage_namespace, "reprocess.payments",
                                                       planned.run_id)
    http = spark_lineage_conf(settings.replace(lineage_url="http://marquez:5000"), "x")
    assert (http["spark.openlineage.transport.type"], http["spark.openlineage.transport.url"]) == (
        "http", "http://marquez:5000")
    assert spark_lineage_conf(settings.replace(spark_lineage="off"), "x") == {}
    assert spark_lineage_conf(settings.replace(lineage="off"), "x") == {}
    # A streaming app's session (the projection, the detectors) only with spark_lineage=all.
    assert spark_lineage_conf(settings, "eventlake-projection", streaming=True) == {}
    every = spark_lineage_conf(settings.replace(spark_lineage="all"), "eventlake-projection", streaming=True)
    assert every["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
    # A job's session: the same as with jobs.
    assert spark_lineage_conf(settings.replace(spark_lineage="all"), "eventlake-reprocess-payments") == \
        spark_lineage_conf(settings, "eventlake-reprocess-payments")
    with pytest.raises(SettingsError, match="spark_lineage='yes'"):
        spark_lineage_conf(settings.replace(spark_lineage="yes"), "x")
