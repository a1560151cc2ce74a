"""The apps on YARN with HDFS (issue 12): `eventlake yarn up` starts Hadoop's own mini cluster (a NameNode, a
DataNode, a ResourceManager and a NodeManager in one JVM, hadoop-client-minicluster 3.5.0); `eventlake spark-submit
projection --master yarn` runs the projection with its executors in YARN containers, and the read models equal
the oracle; a Spark app on YARN writes a Delta table to hdfs://, and Spark and delta-rs (its own HDFS client, no
JVM) read the same rows back. The ResourceManager lists both apps FINISHED / SUCCEEDED.

The first projection keeps its warehouse on the local disk (the NodeManager runs on this machine); the last test
puts the platform's tables and checkpoints on the cluster's HDFS (EVENTLAKE_WAREHOUSE_URI / _CHECKPOINTS_URI), the
projection on YARN writes them there and `eventlake check --reconcile` and `query` read them there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from event_store import kafka_log
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from tests.domain_helpers import events_for, events_of, interleaved, iot_events_for
from tests.integration.services import WORKTREE
from tests.integration.test_kafka_cluster import _free_port_run
from tests.oracle import assert_matches_oracle

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

_DELTA_JOB = Path(__file__).resolve().parent / "yarn_delta_job.py"


@pytest.fixture(scope="module")
def yarn(tmp_path_factory):
    """(HADOOP_CONF_DIR, HDFS URI, ResourceManager web URL, home) of a cluster started as a user starts it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTLAKE_", "HADOOP_"))}
    port = _free_port_run(7)
    home = tmp_path_factory.mktemp("yarn")
    env.update({"EVENTLAKE_HOME": str(home), "PYTHONPATH": str(WORKTREE),
                "EVENTLAKE_YARN_PORT": str(port)})

    def eventlake(*args):
        return subprocess.run([sys.executable, "-m", "eventlake.cli", "yarn", *args], env=env, cwd=WORKTREE,
                              capture_output=True, text=True, timeout=600)

    up = eventlake("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "1 NodeManager(s) running" in up.stdout, up.stdout
    conf_dir = next(w for w in up.stdout.split() if w.startswith("HADOOP_CONF_DIR=")).split("=", 1)[1]
    try:
        yield conf_dir, f"hdfs://127.0.0.1:{port}", f"http://127.0.0.1:{port + 6}", home
    finally:
        down = eventlake("down")
        assert down.returncode == 0 and "yarn: stopped" in down.stdout, down.stdout + down.stderr


def _finished_apps(web: str) -> dict[str, tuple[str, str, str]]:
    """App name -> (state, final status, id) of the apps the ResourceManager has finished."""
    with urllib.request.urlopen(f"{web}/ws/v1/cluster/apps?states=FINISHED,FAILED,KILLED", timeout=10) as response:
        apps = (json.load(response).get("apps") or {}).get("app", [])
    return {a["name"]: (a["state"], a["finalStatus"], a["id"]) for a in apps}


def _why(done: subprocess.CompletedProcess) -> str:
    """A failed spark-submit's exceptions (the first lines of each, where the tail of its output may hold none)."""
    text = done.stdout + done.stderr
    causes = [line for line in text.splitlines() if "Exception" in line or line.startswith("Caused by")]
    return "\n".join(causes[:30]) + "\n...\n" + text[-3000:]


def test_the_projection_on_yarn_gives_the_oracle_tables(yarn, spark, settings):
    conf_dir, _, web, _ = yarn
    events = interleaved(
        events_for(GeneratorConfig(accounts=30, commands=400, seed=12, run_id="ya", late_rate=0.03), flag_every=7),
        iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=12, run_id="ya"), flag_every=11),
        events_of(generate_site_commands(SiteGeneratorConfig(sites=2, views=150, minutes=10, seed=12, run_id="ya"))))
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    producer.close()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTLAKE_", "HADOOP_"))}
    env.update(KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
               EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2",
               EVENTLAKE_SPARK_DRIVER_MEMORY="1g", HADOOP_CONF_DIR=conf_dir, PYTHONPATH=str(WORKTREE))
    done = subprocess.run([sys.executable, "-m", "eventlake.cli", "spark-submit", "projection", "--master", "yarn",
                           "--", "--until-caught-up"], env=env, cwd=WORKTREE, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, _why(done)
    # The line applied the mini cluster's Spark settings (pyspark's jars by a local: path, this Python).
    assert "spark.yarn.jars=local:" in done.stdout, done.stdout[:3000]
    assert "eventlake: projection: code from " in done.stdout and ".zip/spark_apps/" in done.stdout, done.stdout
    assert _finished_apps(web).get("eventlake-projection", ())[:2] == ("FINISHED", "SUCCEEDED"), _finished_apps(web)
    assert_matches_oracle(spark, settings, events)


def test_a_delta_table_on_hdfs_written_on_yarn_reads_back_in_spark_and_delta_rs(yarn, settings):
    import pyspark
    from deltalake import DeltaTable

    from infra import spark_submit
    from infra.yarn import SPARK_CONF_FILE

    conf_dir, fs_uri, web, home = yarn
    uri = f"{fs_uri}/eventlake-test/delta-on-hdfs"
    conf = [("--conf", line) for line in (Path(conf_dir) / SPARK_CONF_FILE).read_text().splitlines()
            if line and not line.startswith("#")]
    line = [str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"), "--master", "yarn",
            "--deploy-mode", "cluster", "--name", "eventlake-delta-on-hdfs", "--driver-memory", "1g",
            *[a for pair in conf for a in pair],
            "--jars", ",".join(str(j) for j in spark_submit.resolved_jars(settings)), str(_DELTA_JOB), uri]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTLAKE_", "HADOOP_", "PYSPARK_GATEWAY")) and k != "PYTHONPATH"}
    env["HADOOP_CONF_DIR"] = conf_dir
    done = subprocess.run(line, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, _why(done)
    state, final, app_id = _finished_apps(web).get("eventlake-delta-on-hdfs", ("?", "?", "?"))
    assert (state, final) == ("FINISHED", "SUCCEEDED"), _finished_apps(web)
    # Cluster deploy mode: the driver ran in the application master's container; its output is that container's.
    driver_out = next(home.glob(f"yarn/data/**/{app_id}/container_*_01_000001/stdout")).read_text()
    assert "delta-on-hdfs: rows=1000 sum=1498643 version=1 master=yarn" in driver_out, driver_out

    # 1000 rows of id * 3, plus 1 on the 143 rows with id % 7 == 0; version 0 the write, 1 the UPDATE.
    table = DeltaTable(uri)
    rows = table.to_pyarrow_table()
    assert (table.version(), rows.num_rows, sum(rows.column("amount_minor").to_pylist())) == (1, 1000, 1498643)


def test_the_platforms_tables_and_checkpoints_on_hdfs(yarn, spark, settings):
    """EVENTLAKE_WAREHOUSE_URI and EVENTLAKE_CHECKPOINTS_URI on the mini cluster's HDFS: the projection on YARN
    writes every read model there (equal to the oracle), and the JVM-less readers (`eventlake check --reconcile`,
    `eventlake query`) read them there through delta-rs' own HDFS client."""
    conf_dir, fs_uri, web, _ = yarn
    events = interleaved(
        events_for(GeneratorConfig(accounts=20, commands=240, seed=14, run_id="yh", late_rate=0.03), flag_every=7),
        iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=14, run_id="yh"), flag_every=11))
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    producer.close()
    root = f"{fs_uri}/eventlake-test/{settings.topic_prefix.strip('.')}"
    on_hdfs = settings.replace(warehouse_uri=f"{root}/warehouse", checkpoints_uri=f"{root}/checkpoints")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTLAKE_", "HADOOP_"))}
    env.update(KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
               EVENTLAKE_WAREHOUSE_URI=str(on_hdfs.warehouse), EVENTLAKE_CHECKPOINTS_URI=str(on_hdfs.checkpoints),
               EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2",
               EVENTLAKE_SPARK_DRIVER_MEMORY="1g", HADOOP_CONF_DIR=conf_dir, PYTHONPATH=str(WORKTREE))

    def eventlake(*args, timeout=1800):
        done = subprocess.run([sys.executable, "-m", "eventlake.cli", *args], env=env, cwd=WORKTREE,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, _why(done)
        return done.stdout

    eventlake("spark-submit", "projection", "--master", "yarn", "--", "--until-caught-up")
    assert _finished_apps(web).get("eventlake-projection", ())[:2] == ("FINISHED", "SUCCEEDED"), _finished_apps(web)
    assert_matches_oracle(spark, on_hdfs, events)
    assert not (settings.home / "warehouse").exists() and not (settings.home / "checkpoints").exists()
    checked = eventlake("check", "--reconcile", "account_summary", "device_status", timeout=600)
    assert "check: all passed" in checked and f"of {on_hdfs.warehouse}/account_summary" in checked, checked
    accounts = len({e.aggregate_id for e in events if e.aggregate_type == "account"})
    out = eventlake("query", "--format", "csv", "SELECT count(*) AS n FROM account_summary", timeout=600)
    assert out.split() == ["n", str(accounts)], out
