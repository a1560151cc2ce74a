"""Shared fixtures: ONE real Kafka broker and ONE Spark session per pytest process (`make test` runs two side
by side, each with its own; see `_SECOND_LANE` below), unique names per test.

The broker is the project's own (infra/kafka.py) on free loopback ports in a temp folder, unless
KAFKA_BOOTSTRAP_SERVERS is set, in which case that cluster is used and nothing is started.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

# Spark returns timestamps in the process's local zone; the read models are in UTC.
os.environ["TZ"] = "UTC"
time.tzset()
# Every Spark JVM of the run, in this process or a subprocess, reads tests/spark-conf/spark-defaults.conf
# (expressions interpreted: see that file). A SPARK_CONF_DIR set by the caller wins.
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "spark-conf"))

from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

from lakehouse.settings import Settings  # noqa: E402

# Property-based tests (Hypothesis): "ci" (the default) is derandomized, so every run tries the same examples
# and a failure reproduces; "dev" explores new random examples on each run; "thorough" explores ten times as
# many. Choose with HYPOTHESIS_PROFILE. No deadline: a slow example on a busy machine is no failure.
hypothesis_settings.register_profile("ci", max_examples=100, derandomize=True, database=None, deadline=None,
                                     print_blob=True, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def local_broker(tmp_path_factory) -> Settings | None:
    """The run's own broker (its settings: ``kafka_dir / "data"`` holds its log segments), or None when
    KAFKA_BOOTSTRAP_SERVERS names a cluster to use instead."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    from infra import kafka

    # A local cluster recorded in the checkout's own home (`eventlake kafka up --brokers 3 --security ...`) is
    # not the suite's: its broker is one plain one.
    broker = Settings.load({}).replace(home=tmp_path_factory.mktemp("kafka-home"), kafka_port=_free_port(),
                                       kafka_controller_port=_free_port(), kafka_brokers=1, kafka_security="none")
    kafka.up(broker, log=lambda *_: None)
    try:
        yield broker
    finally:
        kafka.down(broker, log=lambda *_: None)


@pytest.fixture(scope="session")
def bootstrap_servers(local_broker) -> str:
    return os.environ["KAFKA_BOOTSTRAP_SERVERS"] if local_broker is None else local_broker.bootstrap_servers


@pytest.fixture
def settings(tmp_path: Path, bootstrap_servers: str) -> Settings:
    """Settings for one test: its own topics (unique prefix) and its own warehouse and checkpoints."""
    return Settings.load({}).replace(
        home=tmp_path / "home", kafka_bootstrap_servers=bootstrap_servers,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}.", topic_partitions=3,
        handler_group_id=f"handler-{uuid.uuid4().hex[:8]}", kafka_brokers=1, kafka_security="none")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from spark_apps.session import build_session

    # One session serves the whole run (an hour of tests): a bigger heap than a service's default.
    # EVENTLAKE_TEST_SPARK_CONF='{"spark.x": "y"}': more Spark settings for the run's session (to compare a setting's
    # effect on the suite's time, e.g. with farm-bench or --durations). Tried on test_projection.py, one run each,
    # 2026-12-02: spark.sql.adaptive.enabled=false 404 s against 384 s (no gain);
    # spark.databricks.delta.merge.materializeSource=none fails every MERGE of a batch
    # (DeltaErrors.mergeConcurrentOperationCachedSourceException: the batch's source is persisted). Reading the oracle's
    # tables with delta-rs instead of this session gave no gain either (560 s against 532 s with test_rebuild_fold).
    # Expressions run interpreted (tests/spark-conf/spark-defaults.conf, for every JVM of the run; side by side,
    # test_projection's duplicates test 260 -> 194 s).
    # The JVM's default JIT (tiered up to C2) for this session, not the C1-only of tests/spark-conf (which is for the
    # run's short-lived JVMs): over a lane's hour C2's compiling pays back (side by side, the properties test's
    # session at 25 minutes: 106 Delta commits in 539 CPU-s with C2, 80 in 420 with C1 only).
    extra = {"spark.driver.defaultJavaOptions": "", **json.loads(os.environ.get("EVENTLAKE_TEST_SPARK_CONF") or "{}")}
    session = build_session(Settings.load({}).replace(home=tmp_path_factory.mktemp("spark-home"),
                                                      spark_shuffle_partitions=2, spark_driver_memory="4g"),
                            app_name="eventlake-tests", log=lambda *_: None, extra_conf=extra)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _spark_forgets_each_tests_tables(request):
    """After a test that used the shared Spark session: its streams stopped, its cached data and Delta's
    cached logs of its tables dropped. Left in place, a run's hundreds of tables fill the driver's heap
    (a CI run once ended in OutOfMemoryError after 45 minutes)."""
    yield
    if "spark" not in request.fixturenames:
        return
    spark = request.getfixturevalue("spark")
    for query in spark.streams.active:
        try:
            query.stop()
        except Exception:  # noqa: BLE001 -- Spark's TimeoutException through py4j
            # Its thread is inside a batch's Python (foreachBatch), which an interrupt does not reach within the
            # stop timeout (Projection.stop leaves such a query to end with the process): it is marked stopped
            # and ends once the batch returns. Wait for that, so the next test starts without it.
            try:
                query.awaitTermination(300)
            except Exception:  # noqa: BLE001 -- its failure belongs to the test that ran it, which has ended
                pass
    spark.catalog.clearCache()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


# Markers by dependency (pyproject.toml): `-m kafka`, `-m spark`, `-m airflow` run the part a developer touches;
# `-m "not slow"` (make test-fast) needs none of them: a test marked by one is slow too. A test is marked by the fixtures it uses (the shared broker,
# the shared Spark session); the modules below start their own Spark JVMs or Airflow in subprocesses, which no
# fixture shows.
_STARTS_SPARK = {"test_sql_server", "test_sql_functions", "test_sql_literals", "test_spark_standalone", "test_yarn",
                 "test_rebuild_faults", "test_dags", "test_airflow_ui", "test_cli"}
_STARTS_KAFKA = {"test_kafka_security", "test_kafka_cluster", "test_handler_broker_restart",
                 "test_services_broker_restart"}
_STARTS_AIRFLOW = {"test_dags", "test_airflow_ui", "test_maintenance", "test_merchants_dag"}
# `make test` runs two pytest processes side by side, each with its broker: the first runs the tests on the Spark
# session (`spark_session`) but these modules'; the second the rest (the broker's tests, services and Spark JVMs
# started in subprocesses, the unit tests) and these modules' Spark tests on a session of its own. The set balances
# the two (2026-11-29, one lane for every Spark test: 19 minutes against about 55; the session's JVM used about
# 0.7 of the 2 cores, its driver waits more than it computes). test_rebuild_fold (~100 s) went back to the
# first on 2026-12-07: the second took 20:38 against the first's 15:50.
_SECOND_LANE = {"test_rebuild", "test_rebuild_faults", "test_reprocess", "test_sequence_heads",
                "test_services_broker_restart", "test_small_files", "test_sql_functions", "test_storage_uri",
                "test_telemetry_detector"}


def pytest_configure(config):
    """SIGTERM ends the run as Ctrl-C does, fixtures torn down (the broker stopped, the Spark session too): `make
    test` sends it to the second pytest process when the first is interrupted."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


# First, before `-m` deselects by the marks added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        names = set(getattr(item, "fixturenames", ()))
        if "bootstrap_servers" in names or module in _STARTS_KAFKA:
            item.add_marker(pytest.mark.kafka)
        if "spark" in names or module in _STARTS_SPARK:
            item.add_marker(pytest.mark.spark)
        if "spark" in names:
            item.add_marker(pytest.mark.spark_session)
            if module in _SECOND_LANE:
                item.add_marker(pytest.mark.second_lane)
        if module in _STARTS_AIRFLOW:
            item.add_marker(pytest.mark.airflow)
        if any(item.get_closest_marker(m) for m in ("kafka", "spark", "airflow")) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)  # `make test-fast` needs no broker, no Spark, no Airflow
