"""kafka-python's metadata refresh loop outlives a refresh that fails while the broker is away (see
event_store.kafka_log.surviving_refresh_loop): without that, a long-lived client prints a traceback and never
refreshes its metadata again."""
import kafka.cluster
import pytest
from kafka.errors import KafkaConnectionError

from event_store import kafka_log


class Cluster:
    closed = False


def _run(coroutine):
    with pytest.raises(StopIteration) as ended:
        coroutine.send(None)
    return ended.value.value


def test_the_loop_starts_again_after_a_failed_refresh_and_ends_when_the_client_closes():
    runs = []

    async def refresh_loop(cluster):
        runs.append(len(runs))
        if len(runs) < 3:
            raise KafkaConnectionError("111 ECONNREFUSED")
        return "closed"

    assert _run(kafka_log.surviving_refresh_loop(refresh_loop)(Cluster())) == "closed"
    assert runs == [0, 1, 2]


def test_a_failure_after_the_client_closed_ends_the_loop_quietly():
    async def refresh_loop(cluster):
        cluster.closed = True
        raise KafkaConnectionError("111 ECONNREFUSED")

    assert _run(kafka_log.surviving_refresh_loop(refresh_loop)(Cluster())) is None


def test_anything_but_a_kafka_error_still_surfaces():
    async def refresh_loop(cluster):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        kafka_log.surviving_refresh_loop(refresh_loop)(Cluster()).send(None)


def test_every_kafka_python_client_gets_the_surviving_loop():
    assert kafka.cluster.ClusterMetadata._refresh_loop.__wrapped__ is not None
