"""The streaming apps on a Spark standalone cluster (issue 12): `eventlake spark-cluster up` starts a master and
2 workers, each a JVM of its own, from the pyspark distribution; `eventlake project` runs on it through
configuration alone (EVENTLAKE_SPARK_MASTER) and the fraud detector through `eventlake spark-submit` (its code from
the packaged zip, its jars handed over with --jars), each with executors on the workers, and they give what local
mode gives on the same log: the oracle's tables, the script's fraud findings.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from event_store import kafka_log
from event_store.envelope import CommandEnvelope
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from tests.domain_helpers import events_for, events_of, interleaved, iot_events_for
from tests.integration.services import WORKTREE
from tests.integration.test_fraud_detector import script
from tests.integration.test_kafka_cluster import _free_port_run
from tests.oracle import assert_matches_oracle

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

WORKERS = 2


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """(master URL, web UI URL) of a cluster started as a user starts it: `eventlake spark-cluster up`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_")}
    env.update({"EVENTLAKE_HOME": str(tmp_path_factory.mktemp("spark-cluster")), "PYTHONPATH": str(WORKTREE),
                "EVENTLAKE_SPARK_CLUSTER_PORT": str(_free_port_run(2 + WORKERS))})

    def eventlake(*args):
        return subprocess.run([sys.executable, "-m", "eventlake.cli", "spark-cluster", *args], env=env, cwd=WORKTREE,
                              capture_output=True, text=True, timeout=300)

    up = eventlake("up", "--workers", str(WORKERS))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"{WORKERS} worker(s) registered" in up.stdout, up.stdout
    master = next(w for w in up.stdout.split() if w.startswith("EVENTLAKE_SPARK_MASTER=")).split("=", 1)[1]
    web = f"http://127.0.0.1:{int(env['EVENTLAKE_SPARK_CLUSTER_PORT']) + 1}"
    try:
        yield master, web
    finally:
        eventlake("down")


def _run_on(cluster_master: str, settings, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
               EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2",
               EVENTLAKE_SPARK_MASTER=cluster_master, EVENTLAKE_MAX_OFFSETS_PER_TRIGGER="400",
               EVENTLAKE_SPARK_DRIVER_MEMORY="1g", PYTHONPATH=str(WORKTREE))
    done = subprocess.run([sys.executable, "-m", "eventlake.cli", *args], env=env, cwd=WORKTREE,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"({cluster_master})" in done.stdout, done.stdout  # the session line names the master it ran on
    return done


def _apps_with_executors_on_every_worker(web: str) -> list[str]:
    """Names of the finished apps the master ran with cores on every worker."""
    with urllib.request.urlopen(f"{web}/json/", timeout=10) as response:
        state = json.load(response)
    return [app["name"] for app in state.get("completedapps", []) if app.get("cores", 0) >= WORKERS]


def test_the_projection_on_the_cluster_gives_the_oracle_tables(spark_cluster, spark, settings):
    master, web = spark_cluster
    events = interleaved(
        events_for(GeneratorConfig(accounts=30, commands=400, seed=12, run_id="sa", late_rate=0.03), flag_every=7),
        iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=12, run_id="sa"), flag_every=11),
        events_of(generate_site_commands(SiteGeneratorConfig(sites=2, views=150, minutes=10, seed=12, run_id="sa"))))
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    producer.close()

    _run_on(master, settings, "project", "--until-caught-up")
    assert "eventlake-projection" in _apps_with_executors_on_every_worker(web), _apps_with_executors_on_every_worker(web)
    assert_matches_oracle(spark, settings, events)


def test_the_fraud_detector_on_the_cluster_flags_what_it_flags_locally(spark_cluster, settings):
    master, web = spark_cluster
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in script()])
    producer.close()

    done = _run_on(master, settings, "spark-submit", "fraud-detector", "--master", master, "--", "--until-caught-up")
    assert "eventlake: fraud-detector: code from " in done.stdout and ".zip/spark_apps/" in done.stdout, done.stdout
    flags = [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]
    # What test_fraud_detector.py asserts of the same script in local mode.
    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in flags) == sorted(
        {("a2", "rapid_attempts"), ("a3", "amount_above_max"), ("a4", "location_mismatch")})
    assert "eventlake-fraud-detector" in _apps_with_executors_on_every_worker(web), \
        _apps_with_executors_on_every_worker(web)
