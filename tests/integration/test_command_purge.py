"""The handled commands deleted from the commands topic (issue 45, event_store.command_purge): what ``eventlake
forget`` does so that the plain values commands carry leave the brokers' disks. Real broker and command handler."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource

from event_store import kafka_log
from event_store.command_purge import purge_handled_commands
from event_store.envelope import CommandEnvelope
from event_store.handler import CommandHandler
from event_store.kafka_clients import aborting_producer, admin_client
from event_store.kafka_log import COMMANDS_SEGMENT_MS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
T = "2026-03-01T10:00:00.000Z"


def _open(account: str, name: str) -> CommandEnvelope:
    return CommandEnvelope.create("OpenAccount", account, {"customer_id": f"cust-{account}", "currency": "EUR",
                                                            "credit_limit_minor": 100, "customer_name": name},
                                  command_id=f"{account}-open", issued_at=T)


def _send(settings, commands) -> None:
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.commands_topic, [(c.aggregate_id, c.to_json()) for c in commands])
    finally:
        producer.close()


def _commands(settings) -> list[str]:
    return sorted(CommandEnvelope.from_json(r.value).command_id
                  for r in kafka_log.read_all(settings, settings.commands_topic, idle_timeout_s=1.0))


def _segment_ms(settings) -> str:
    admin = admin_client(settings)  # kept until the future is done
    [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, settings.commands_topic)]).values()
    return future.result(timeout=30)["segment.ms"].value


def test_only_the_commands_the_handler_handled_are_deleted(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    _send(settings, [_open(f"acc-{i}", f"Person Number {i}") for i in range(6)])
    # No handler has run: nothing is handled, nothing goes, and the purge says why it is not complete.
    waiting = purge_handled_commands(settings, wait_s=0, log=lambda *_: None)
    assert (waiting.offsets_deleted, waiting.complete) == (0, False) and waiting.unhandled
    assert "not yet handled keep their segment" in waiting.line()
    assert len(_commands(settings)) == 6

    with CommandHandler(settings, log=lambda *_: None) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
    _send(settings, [_open("acc-late", "Person Late")])  # after the handler stopped: not handled
    purge = purge_handled_commands(settings, wait_s=1, log=lambda *_: None)
    assert purge.offsets_deleted >= 6 and not purge.complete  # the first purge's aborted records too
    assert _commands(settings) == ["acc-late-open"]  # the unhandled command stays, readable
    assert _segment_ms(settings) == str(COMMANDS_SEGMENT_MS)  # the roll's 1 ms was put back

    with CommandHandler(settings, log=lambda *_: None) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
    done = purge_handled_commands(settings, wait_s=30, log=lambda *_: None)
    assert done.complete and done.offsets_deleted >= 1 and _commands(settings) == []
    # The handler goes on from its committed offsets: a new command is answered as before.
    _send(settings, [_open("acc-new", "Person New")])
    with CommandHandler(settings, log=lambda *_: None) as handler:
        stats = handler.run(until_caught_up=True, max_seconds=120)
    assert stats.commands == 1


def test_killed_while_the_topic_rolls_a_segment_per_append_the_next_purge_puts_it_back(settings):
    """Killed (-9) between setting the commands topic's segment.ms to 1 ms and putting it back: the topic would
    roll a segment at each append; the next purge (the next ``eventlake forget``) sets it back."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    env = {**os.environ, "EVENTLAKE_FAULT_KILL_IN_ERASURE": "commands-roll-on", "PYTHONPATH": str(ROOT),
           "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers, "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix}
    killed = subprocess.run([sys.executable, "-c", "from event_store.command_purge import purge_handled_commands; "
                             "from lakehouse.settings import Settings; purge_handled_commands(Settings.load())"],
                            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, (killed.stdout, killed.stderr)  # the step was reached
    assert _segment_ms(settings) == "1"
    assert purge_handled_commands(settings, wait_s=0, log=lambda *_: None).complete  # nothing was there to delete
    assert _segment_ms(settings) == str(COMMANDS_SEGMENT_MS)


def test_a_command_in_a_transaction_still_open_is_not_deleted(settings):
    """A producer's transaction still open holds a command below the roll: a read_committed reader stops before it,
    so the purge cannot tell it was handled and leaves it; committed later, it is there to be handled."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    pending = aborting_producer(settings, f"{settings.topic_prefix}test-pending")
    pending.init_transactions(30)
    pending.begin_transaction()
    command = _open("acc-pending", "Person Pending")
    pending.produce(settings.commands_topic, value=command.to_json(), key=command.aggregate_id)
    pending.flush(30)
    purge = purge_handled_commands(settings, wait_s=0, log=lambda *_: None)
    assert purge.offsets_deleted == 0 and purge.unhandled and not purge.complete
    pending.commit_transaction(30)
    assert _commands(settings) == ["acc-pending-open"]
