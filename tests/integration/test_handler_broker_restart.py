"""The command handler across a broker restart (issue 14, defect 8): it resumes by itself and answers every
command, and stop() ends it within seconds whatever it is waiting for.

These tests stop and restart a broker, so they get one of their own (tests/integration/restartable_broker.py):
the shared broker is never disturbed.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import confluent_kafka
import pytest

from event_store import kafka_clients, kafka_log
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from lakehouse.settings import Settings
from tests.integration.restartable_broker import (  # noqa: F401 -- own_broker is a fixture
    BROKER_AWAY_S, STOP_WITHIN_S, broker_down, broker_up, needs_local_broker, own_broker, settings_on)

pytestmark = [pytest.mark.slow, needs_local_broker]


@pytest.fixture
def settings(tmp_path, own_broker) -> Settings:
    return settings_on(own_broker, tmp_path / "home")


def account_stream(accounts: int, payments: int) -> list[list[CommandEnvelope]]:
    """Chunks of commands: first every account opened, then rounds of one payment per account."""
    opens = [CommandEnvelope.create("OpenAccount", f"acc-{a}", {"customer_id": f"c{a}",
                                                                 "credit_limit_minor": 10_000_000, "currency": "USD"})
             for a in range(accounts)]
    rounds = [[CommandEnvelope.create("AuthorizePayment", f"acc-{a}", {
        "payment_id": f"p{a}-{i}", "amount_minor": 100, "currency": "USD", "merchant_id": "m1",
        "location": "US-NYC", "occurred_at": "2026-01-01T10:00:00.000Z"}) for a in range(accounts)]
        for i in range(payments)]
    return [opens, *rounds]


def results(settings) -> dict[str, CommandResult]:
    return {r.command_id: r for r in (CommandResult.from_json(rec.value)
                                      for rec in kafka_log.read_all(settings, settings.results_topic))}


def start_handler(settings, lines: list, **kwargs) -> tuple[CommandHandler, threading.Thread, list]:
    """A handler running in a thread (as `eventlake handler` runs); what run() raised, if anything, in the list."""
    def log(message: str) -> None:
        lines.append(message)
        print(message)  # shown by pytest when the test fails

    handler = CommandHandler(settings, log=log, **kwargs)
    handler.start()
    raised = []

    def run():
        try:
            handler.run()
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return handler, thread, raised


def test_the_handler_resumes_by_itself_after_a_broker_restart_and_answers_every_command(settings, own_broker):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    chunks = account_stream(accounts=6, payments=40)
    sent: list[CommandEnvelope] = []
    feeding_done = threading.Event()
    half_sent = threading.Event()

    def feed():
        """A client submitting commands steadily; a chunk that fails is sent again (commands are idempotent)."""
        producer = kafka_log.make_producer(settings)
        try:
            for i, chunk in enumerate(chunks):
                while True:
                    try:
                        kafka_log.produce_all(producer, settings.commands_topic,
                                              [(c.aggregate_id, c.to_json()) for c in chunk])
                        break
                    except Exception:  # noqa: BLE001 -- the broker is away: the client retries
                        time.sleep(1)
                sent.extend(chunk)
                if i == len(chunks) // 2:
                    half_sent.set()
                time.sleep(0.2)
        finally:
            producer.close()
            feeding_done.set()

    lines: list[str] = []
    handler, thread, raised = start_handler(settings, lines, max_poll_records=25)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        assert half_sent.wait(120)
        broker_down(own_broker)  # mid-stream: the handler has commands in flight and more keep coming
        time.sleep(BROKER_AWAY_S)
        broker_up(own_broker)
        assert feeding_done.wait(300)
        expected = {c.command_id for c in sent}
        got: dict[str, CommandResult] = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not expected <= set(got) and thread.is_alive():
            time.sleep(2)
            got = results(settings)
    finally:
        handler.stop()
        thread.join(STOP_WITHIN_S * 2)
        handler.close()
    assert not raised, raised
    missing = expected - set(got)
    assert not missing, f"{len(missing)} of {len(expected)} commands never answered; handler log tail: {lines[-15:]}"
    assert all(got[c.command_id].status == "accepted" for c in sent), \
        {r.error_type: r.reason for r in got.values() if r.status != "accepted"}
    # Every accepted command's events are in the log once, each account's versions without gap or repeat.
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    versions = defaultdict(list)
    for e in events:
        versions[e.aggregate_id].append(e.aggregate_version)
    assert {a: v for a, v in versions.items() if v != list(range(1, len(v) + 1))} == {}
    assert sorted(e.event_id for e in events) == sorted(i for r in got.values() for i in r.event_ids)
    assert len(events) == len(expected)


def test_stop_ends_the_handler_within_seconds_while_a_rebuild_waits_for_an_absent_broker(settings, own_broker):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    # Another writer's open transaction on events partition 0: the handler's rebuild of that partition waits
    # for it to end (it cannot read a stable end), then the broker goes away too.
    blocker = confluent_kafka.Producer({"bootstrap.servers": settings.bootstrap_servers,
                                        "transactional.id": f"blocker-{uuid.uuid4().hex[:8]}",
                                        "transaction.timeout.ms": 300_000})
    blocker.init_transactions(30)
    blocker.begin_transaction()
    blocker.produce(settings.events_topic, b"not committed", b"acc-x", partition=0)
    assert blocker.flush(30) == 0
    lines: list[str] = []
    handler, thread, raised = start_handler(settings, lines)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("partitions assigned" in line for line in lines):
            time.sleep(0.2)
        assert any("partitions assigned" in line for line in lines), lines
        time.sleep(2)  # the rebuild is under way, waiting for the open transaction
        assert not handler.rebuilds or all(r.partition != 0 for r in handler.rebuilds)
        broker_down(own_broker)
        time.sleep(8)  # the rebuild now waits for a broker that does not answer
        stop_asked = time.monotonic()
        handler.stop()
        thread.join(STOP_WITHIN_S)
        stopped_in = time.monotonic() - stop_asked
        assert not thread.is_alive(), f"run() still busy {stopped_in:.0f}s after stop(); log tail: {lines[-10:]}"
        assert not raised, raised
        closing = time.monotonic()
        handler.close()  # bounded too: nothing to snapshot can be written with the broker away
        assert time.monotonic() - closing < STOP_WITHIN_S
    finally:
        broker_up(own_broker)
        blocker.abort_transaction(30)


def test_a_handler_whose_consumer_does_not_rejoin_after_a_lost_session_replaces_it(settings):
    """librdkafka sometimes never rejoins the group after the broker restarts (seen in
    test_services_broker_restart.py: nothing assigned for minutes while polled). Made to happen here: the
    consumer drops its partitions as on a lost session and is not given them back; the handler must replace it
    (kafka_clients.RejoinWatch) and answer commands again."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    opens, first, second = account_stream(accounts=3, payments=2)
    producer = kafka_log.make_producer(settings)
    lines: list[str] = []
    handler, thread, raised = start_handler(settings, lines)
    try:
        kafka_log.produce_all(producer, settings.commands_topic, [(c.aggregate_id, c.to_json()) for c in opens + first])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(results(settings)) < len(opens + first):
            time.sleep(0.5)
        assert len(results(settings)) == len(opens + first), lines[-10:]
        handler.stop()
        thread.join(STOP_WITHIN_S)
        assert not thread.is_alive() and not raised, raised
        # The stuck state: the session was lost long enough ago, the partitions dropped, none assigned since.
        consumer = handler.group.consumer
        assigned = consumer.assignment()
        handler.group.on_lost(consumer, assigned)
        consumer.incremental_unassign(assigned)
        handler.group.rejoin.lost_at = time.monotonic() - kafka_clients.REJOIN_WAIT_S
        thread = threading.Thread(target=handler.run, daemon=True)
        thread.start()
        kafka_log.produce_all(producer, settings.commands_topic, [(c.aggregate_id, c.to_json()) for c in second])
        expected = {c.command_id for c in opens + first + second}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and set(results(settings)) != expected:
            time.sleep(0.5)
        got = results(settings)
    finally:
        producer.close()
        handler.stop()
        thread.join(STOP_WITHIN_S * 2)
        handler.close()
    assert set(got) == expected, f"{len(expected - set(got))} commands unanswered; log tail: {lines[-10:]}"
    assert all(r.status == "accepted" for r in got.values())
    assert any("replacing its consumer" in line for line in lines)
    assert handler.stats.consumers_renewed == 1
    # Served as eventlake_handler_rebalances_total: the partitions lost, and assigned to both consumers.
    assert handler.stats.rebalances["lost"] == len(assigned) == settings.topic_partitions
    assert handler.stats.rebalances["assigned"] == 2 * len(assigned)


class _CommitThatReturnsLate:
    """The handler's real producer, whose next commit_transaction goes through at the broker but returns only
    after the handler stopped waiting for it (as librdkafka's did after a broker restart, seen in
    test_services_broker_restart.py)."""

    def __init__(self, producer, late_s: float):
        self._producer, self._late_s, self.used = producer, late_s, False

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def commit_transaction(self, *args):
        self._producer.commit_transaction(*args)
        if not self.used:
            self.used = True
            time.sleep(self._late_s)


def test_a_commit_that_went_through_while_its_call_hung_counts_its_events(settings, monkeypatch):
    """A commit call that hangs past its bound is taken as the producer's failure: the producer is renewed and
    every partition rebuilt. When that commit had gone through at the broker, its commands stay answered once, and
    the handler counts their events (eventlake_handler_events_total equals the events log)."""
    from event_store import handler_transactions
    monkeypatch.setattr(handler_transactions, "STUCK_CALL_S", 1.0)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    opens, first, second = account_stream(accounts=3, payments=2)
    producer = kafka_log.make_producer(settings)
    lines: list[str] = []
    handler, thread, raised = start_handler(settings, lines)
    try:
        kafka_log.produce_all(producer, settings.commands_topic, [(c.aggregate_id, c.to_json()) for c in opens])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(results(settings)) < len(opens):
            time.sleep(0.5)
        late = handler.snapshots.tx.producer = _CommitThatReturnsLate(
            handler.snapshots.tx.producer, handler_transactions.CALL_TIMEOUT_S + 3)
        kafka_log.produce_all(producer, settings.commands_topic,
                              [(c.aggregate_id, c.to_json()) for c in first + second])
        expected = {c.command_id for c in opens + first + second}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (set(results(settings)) != expected or handler.stats.commands
                                                < len(expected)):
            time.sleep(0.5)
        got = [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]
        events = list(kafka_log.read_all(settings, settings.events_topic))
    finally:
        producer.close()
        handler.stop()
        thread.join(STOP_WITHIN_S * 2)
        handler.close()
    assert late.used and not raised, raised
    assert handler.stats.producers_renewed == 1, lines[-10:]
    assert any("went through all the same" in line for line in lines), lines[-10:]
    assert sorted(r.command_id for r in got) == sorted(expected), "every command answered once"
    assert all(r.status == "accepted" and not r.duplicate for r in got)
    assert handler.stats.events == len(events) == len(opens + first + second)
    assert handler.stats.commands == len(expected)
