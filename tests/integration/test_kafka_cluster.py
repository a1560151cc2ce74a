"""A 3-broker local cluster (issue 12): `eventlake kafka up --brokers 3` starts it, every topic gets 3 replicas
and min.insync.replicas=2, and losing one broker (kill -9) mid-stream loses no acknowledged command and duplicates
no event while the handler, projection, detector and policy keep going; `eventlake kafka up` brings the lost broker
back and nothing else needs a hand.

The cluster is the module's own, on free ports; the suite's shared broker is never touched.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka.admin import ConfigResource

from event_store import kafka_clients, kafka_log
from lakehouse.settings import Settings
from tests.integration.fraud_stream import SERVICES, FraudStream, read_log, table
from tests.integration.restartable_broker import needs_local_broker
from tests.integration.services import WORKTREE, Service, service_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.heavy, needs_local_broker]

BROKERS = 3
# At least this long away, longer than the handler's consumer session (10 s) and the broker's KRaft session (9 s):
# the partitions the lost broker led, and the group and transaction coordinators it held, move to the other two.
LOST_FOR_S = 20


def _free_port_run(count: int) -> int:
    """A base port such that base .. base + count - 1 are all free now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no run of {count} free ports found")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Settings of a 3-broker cluster started as a user starts it: `eventlake kafka up --brokers 3`."""
    base = _free_port_run(2 * BROKERS)
    home = tmp_path_factory.mktemp("kafka-cluster")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update({"EVENTLAKE_HOME": str(home), "EVENTLAKE_KAFKA_PORT": str(base),
                "EVENTLAKE_KAFKA_CONTROLLER_PORT": str(base + 1), "PYTHONPATH": str(WORKTREE)})

    def eventlake(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "eventlake.cli", *args], env=env, cwd=WORKTREE,
                              capture_output=True, text=True, timeout=300)

    up = eventlake("kafka", "up", "--brokers", str(BROKERS))
    assert up.returncode == 0, up.stdout + up.stderr
    settings = Settings.load(env)  # the size `kafka up` recorded, as every later command finds it
    try:
        yield settings, eventlake, up.stdout
    finally:
        eventlake("kafka", "down")


def test_kafka_up_starts_three_brokers_and_every_topic_gets_three_replicas_two_in_sync(cluster):
    settings, eventlake, up_output = cluster
    assert settings.kafka_brokers == BROKERS
    assert f"{BROKERS} of {BROKERS} brokers running" in up_output, up_output
    status = eventlake("kafka", "status")
    assert status.stdout.count("running (pid") == BROKERS, status.stdout
    topics = eventlake("topics")
    assert topics.returncode == 0 and "replication 3" in topics.stdout, topics.stdout + topics.stderr

    admin = kafka_clients.admin_client(settings)
    metadata = admin.list_topics(timeout=30)
    assert len(metadata.brokers) == BROKERS
    for name in kafka_log.topic_configs(settings):
        partitions = metadata.topics[name].partitions
        assert {len(p.replicas) for p in partitions.values()} == {3}, name
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in kafka_log.topic_configs(settings)]
    for resource, future in admin.describe_configs(resources).items():
        assert future.result(timeout=30)["min.insync.replicas"].value == "2", resource.name


def _leader_of_most_partitions(settings: Settings) -> int:
    """The node id leading most partitions of the events topic (so the handler's writes lose their leader)."""
    metadata = kafka_clients.admin_client(settings).list_topics(settings.events_topic, timeout=30)
    leaders = [p.leader for p in metadata.topics[settings.events_topic].partitions.values()]
    return max(set(leaders), key=leaders.count)


def test_losing_a_broker_mid_stream_loses_no_acknowledged_command_and_duplicates_no_event(cluster, spark, tmp_path):
    from infra import kafka

    cluster_settings, eventlake, _ = cluster
    settings = cluster_settings.replace(
        home=tmp_path / "home", kafka_bootstrap_servers=cluster_settings.bootstrap_servers,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}.", topic_replication_factor=3,
        handler_group_id=f"handler-{uuid.uuid4().hex[:8]}", policy_group_id=f"policy-{uuid.uuid4().hex[:8]}",
        trigger_interval="1 second", spark_shuffle_partitions=2)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    services = {name: Service(name, args, service_env(settings), tmp_path) for name, args in SERVICES.items()}
    stream = FraudStream(settings, services)
    stream.go_on.clear()  # the second half only once the broker is lost
    try:
        stream.start_feeding_when_ready()
        assert stream.half_sent.wait(120)
        lost = _leader_of_most_partitions(settings)
        node = next(n for n in kafka.status(cluster_settings).nodes if n.node_id == lost)
        sent_before, archived_before = len(stream.sent), table(spark, settings, "event_archive").count()
        os.kill(node.pid, signal.SIGKILL)  # mid-stream, no warning
        lost_at = time.monotonic()
        assert wait_for(lambda: not kafka.status(cluster_settings).nodes[lost - 1].running, 30, every_s=0.5)
        stream.go_on.set()

        def served_by_the_other_two():
            """Every command sent after the loss answered, and the archive grown to every event in the log, while
            the broker is still away."""
            if not stream.feeding_done.is_set():
                return False
            _, results, events = read_log(settings)
            after = [c.command_id for c in stream.sent[sent_before:]]
            archived = table(spark, settings, "event_archive").count()
            return after and set(after) <= set(results) and archived > archived_before and archived >= len(events)

        assert wait_for(served_by_the_other_two, 300, every_s=3), \
            "with one broker of three lost, the commands sent meanwhile were not all answered and projected:" + \
            "".join(f"\n--- {n}:\n{s.tail()}" for n, s in services.items())
        assert not kafka.status(cluster_settings).nodes[lost - 1].running
        time.sleep(max(0.0, LOST_FOR_S - (time.monotonic() - lost_at)))
        back = eventlake("kafka", "up")  # starts the one broker that is missing, and waits for all three
        assert back.returncode == 0 and "started 1 of 3 brokers" in back.stdout, back.stdout + back.stderr
        assert stream.feeding_done.wait(300)
        stream.assert_answered_and_projected_once(spark)
        for name, service in services.items():
            assert "Traceback" not in service.output(), f"{name}:\n{service.tail(25)}"
    finally:
        for service in services.values():
            service.kill()
