"""The write side on the real broker: client API, idempotency, concurrency, snapshots, scale-out, upcasting,
the fraud policy."""
import contextlib
import threading
import time
from collections import defaultdict

import pytest

from event_store import kafka_log
from event_store.client import EventStore
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.handler import CommandHandler
from event_store.account.policy import FraudPolicy
from eventlake.generator import GeneratorConfig, generate_commands

pytestmark = pytest.mark.slow
QUIET = dict(log=lambda *_: None)


@contextlib.contextmanager
def running_handler(settings, instance_id="0", **kw):
    """A command handler serving in a background thread for the duration of the block."""
    handler = CommandHandler(settings, instance_id=instance_id, **QUIET, **kw)
    handler.start()
    errors = []

    def serve():
        try:
            handler.run()
        except Exception as e:  # surfaced by the test below
            errors.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        handler.stop()
        thread.join(60)
        handler.close()
    assert not errors, errors


def events_of(settings):
    return [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]


def assert_gap_free(events):
    by_account = defaultdict(list)
    for e in events:
        by_account[e.aggregate_id].append(e.aggregate_version)
    for account, versions in by_account.items():
        assert versions == list(range(1, len(versions) + 1)), account
    assert len({e.event_id for e in events}) == len(events)


def open_account(account="acc-1", limit=10_000):
    return CommandEnvelope.create("OpenAccount", account, {"customer_id": "cus-1", "credit_limit_minor": limit,
                                                            "currency": "USD"})


def payment(account="acc-1", amount=100, payment_id="p1", **kw):
    return CommandEnvelope.create("AuthorizePayment", account, {
        "payment_id": payment_id, "amount_minor": amount, "currency": "USD", "merchant_id": "m1",
        "location": "US-NYC", "occurred_at": "2026-01-01T10:00:00.000Z"}, **kw)


def test_submit_waits_for_the_result_and_a_resent_command_gets_its_first_result_even_after_a_restart(settings):
    pay = payment(expected_version=1)
    stale = payment(payment_id="p2", expected_version=1)
    with EventStore(settings) as store:
        with running_handler(settings):
            opened = store.submit(open_account())
            assert (opened.status, opened.version, len(opened.event_ids)) == ("accepted", 1, 1)
            first = store.submit(pay)
            assert (first.status, first.version, first.duplicate) == ("accepted", 2, False)
            # Optimistic concurrency: the account moved on to version 2, so expected_version=1 is stale.
            conflict = store.submit(stale)
            assert (conflict.status, conflict.error_type, conflict.version) == ("rejected", "ConcurrencyConflict", 2)
            assert "expected version 1" in conflict.reason and "at version 2" in conflict.reason
            again = store.submit(pay)
            assert (again.status, again.version, again.event_ids, again.duplicate) == \
                ("accepted", 2, first.event_ids, True)
        # A new handler instance: its state and idempotency window come back from the log.
        with running_handler(settings):
            after_restart = store.submit(pay)
            assert (after_restart.status, after_restart.version, after_restart.event_ids) == \
                (first.status, first.version, first.event_ids)
            conflict_again = store.submit(stale)
            assert (conflict_again.status, conflict_again.error_type, conflict_again.reason) == \
                ("rejected", "ConcurrencyConflict", conflict.reason)
            bad = store.submit({"command_type": "AuthorizePayment", "aggregate_id": "acc-1",
                                "payload": {**pay.payload, "payment_id": "p3", "amount_minor": 99_999}})
            assert (bad.status, bad.version) == ("accepted", 3)  # declined is an event, not a rejection
    events = events_of(settings)
    assert [e.event_type for e in events] == ["AccountOpened", "PaymentAuthorized", "PaymentDeclined"]
    assert_gap_free(events)


def test_submit_without_a_handler_times_out_saying_what_to_do(settings):
    with EventStore(settings) as store:
        with pytest.raises(TimeoutError, match=r"no result .*OpenAccount on acc-1.*eventlake handler"):
            store.submit(open_account(), timeout_s=1)


def test_a_restart_from_a_snapshot_reads_only_the_tail_and_gets_the_same_state(settings):
    # Batches of 200 commands: a snapshot is written after a commit, one partition per transaction.
    settings = settings.replace(snapshot_every_events=300, handler_max_batch=200)
    cfg = GeneratorConfig(accounts=40, commands=2000, seed=5, run_id="snap")
    with EventStore(settings) as store:
        store.send_raw(generate_commands(cfg))
    with CommandHandler(settings, **QUIET) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
        assert handler.stats.snapshots >= 3
    with EventStore(settings) as store:  # a few more commands after the last snapshot (written on close)
        store.send_raw(generate_commands(GeneratorConfig(accounts=10, commands=50, seed=6, run_id="snap2")))
    with CommandHandler(settings, **QUIET) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
    total_events = len(events_of(settings))
    # On a machine that never held the partitions (its own home: on this one the handler starts from its state
    # store, event_store.state_store): restored from the snapshots topic.
    with CommandHandler(settings.replace(home=settings.home.parent / "elsewhere"), **QUIET) as from_snapshot:
        from_snapshot.run(until_caught_up=True, max_seconds=60)
        snap_state = {p: dict(part.states) for p, part in from_snapshot.partitions.items()}
        snap_ids = {p: set(part.event_ids) for p, part in from_snapshot.partitions.items()}
        assert all(r.from_snapshot for r in from_snapshot.rebuilds)
        assert sum(r.events_read for r in from_snapshot.rebuilds) < total_events / 10
        # The handler's event ids are derived, so no snapshot wrote any (issue 42), and the rebuild found the
        # latest snapshot's records where its manifest says (not reading the whole partition).
        assert all(not part.id_segments and not part.event_ids for part in from_snapshot.partitions.values())
        assert not any(r.whole_snapshots_partition for r in from_snapshot.rebuilds)
    with CommandHandler(settings, use_snapshots=False, **QUIET) as full:
        full.run(until_caught_up=True, max_seconds=60)
        assert sum(r.events_read for r in full.rebuilds) == total_events
        assert {p: dict(part.states) for p, part in full.partitions.items()} == snap_state
        assert {p: set(part.event_ids) for p, part in full.partitions.items()} == snap_ids


def test_snapshots_written_in_steps_between_command_batches_restore_the_state(settings, monkeypatch):
    import event_store.handler_snapshots as handler_snapshots
    import event_store.snapshots as snapshots

    # Tiny steps and chunks: each snapshot takes several steps, one after each batch of 50 commands, while the
    # partitions go on changing; the handler then stops without its closing snapshot (as if killed).
    monkeypatch.setattr(handler_snapshots, "STEP_BYTES", 20_000)
    monkeypatch.setattr(snapshots, "_CHUNK_BYTES", 2000)
    settings = settings.replace(snapshot_every_events=300, handler_max_batch=50)
    with EventStore(settings) as store:
        store.send_raw(generate_commands(GeneratorConfig(accounts=40, commands=3000, seed=7, run_id="steps")))
    with monkeypatch.context() as m:
        m.setattr(handler_snapshots.SnapshotSchedule, "on_close", lambda self, parts: None)
        with CommandHandler(settings, **QUIET) as handler:
            handler.run(until_caught_up=True, max_seconds=120)
            assert handler.stats.snapshots >= 3 and handler.stats.snapshot_steps >= 3 * handler.stats.snapshots
            assert all(part.slot for part in handler.partitions.values())  # each partition has one
            # After a partition's first (full) snapshot, the next ones are increments (issue 42).
            assert any(len(part.chain or ()) > 1 for part in handler.partitions.values())
            # ... and one has the first steps of its next snapshot written when the handler stops.
            unfinished = snapshots.SnapshotWriter(handler.partitions[0])
            assert handler.snapshots.write_step(unfinished, 20_000) and not unfinished.done
            assert handler.stats.longest_snapshot_s > 0
    total_events = len(events_of(settings))
    # On a machine that never held the partitions (its own home: this one's state store is not there).
    with CommandHandler(settings.replace(home=settings.home.parent / "elsewhere"), **QUIET) as from_snapshot:
        from_snapshot.run(until_caught_up=True, max_seconds=60)
        assert all(r.from_snapshot for r in from_snapshot.rebuilds)
        assert not any(r.whole_snapshots_partition for r in from_snapshot.rebuilds)
        assert sum(r.events_read for r in from_snapshot.rebuilds) < total_events / 2
        snap = {p: (dict(part.states), set(part.event_ids)) for p, part in from_snapshot.partitions.items()}
    with CommandHandler(settings, use_snapshots=False, **QUIET) as full:
        full.run(until_caught_up=True, max_seconds=60)
        assert {p: (dict(part.states), set(part.event_ids)) for p, part in full.partitions.items()} == snap


def test_two_instances_share_the_partitions_and_keep_versions_gap_free(settings):
    cfg = GeneratorConfig(accounts=60, commands=3000, seed=9, run_id="two")
    commands = list(generate_commands(cfg))
    with EventStore(settings) as store:
        with running_handler(settings, "a") as a, running_handler(settings, "b") as b:
            deadline = time.monotonic() + 60
            while not (a.partitions and b.partitions and len(set(a.partitions) | set(b.partitions)) == 3):
                assert time.monotonic() < deadline, (a.partitions.keys(), b.partitions.keys())
                time.sleep(0.2)
            store.send_raw(commands)
            results = store.wait_for([CommandEnvelope.from_json(v).command_id for _, v in commands], timeout_s=120)
            owned_a, owned_b = set(a.partitions), set(b.partitions)
    assert owned_a and owned_b and not owned_a & owned_b  # each partition has exactly one owner
    assert len(results) == len(commands)
    assert_gap_free(events_of(settings))


def test_old_v1_events_in_the_log_are_upcast_when_the_handler_rebuilds(settings):
    import json

    with EventStore(settings) as store, running_handler(settings):
        store.submit(open_account(limit=1000))
    # A PaymentAuthorized as an older release wrote it (schema_version 1, no merchant_country).
    opened = events_of(settings)[0]
    v1 = {**opened.to_dict(), "event_id": "old-1", "event_type": "PaymentAuthorized", "schema_version": 1,
          "aggregate_version": 2, "command_id": "old-c", "payload": {"payment_id": "old-p", "amount_minor": 600,
                                                                     "currency": "USD", "merchant_id": "m",
                                                                     "location": "FR-PAR"}}
    producer = kafka_log.make_producer(settings)
    producer.send(settings.events_topic, key=b"acc-1", value=json.dumps(v1).encode(),
                  partition=kafka_log.read_all(settings, settings.events_topic).__next__().partition)
    producer.flush()
    producer.close()
    with EventStore(settings) as store, running_handler(settings):
        result = store.submit(payment(amount=500, expected_version=2))
        assert (result.status, result.version) == ("accepted", 3)
    events = events_of(settings)
    assert events[1].schema_version == 2 and events[1].payload["merchant_country"] == "FR"
    assert events[2].event_type == "PaymentDeclined"  # 600 of 1000 used by the upcast v1 event: 500 is over
    assert_gap_free(events)


def test_fraud_suspected_freezes_the_account_once_even_when_the_policy_reads_it_twice(settings):
    flag = CommandEnvelope.create("FlagFraud", "acc-1", {"payment_id": "p1", "rule": "velocity"})
    with EventStore(settings) as store, running_handler(settings):
        store.submit(open_account())
        store.submit(payment())
        assert store.submit(flag).accepted
        policy = FraudPolicy(settings, **QUIET).run(until_caught_up=True, max_seconds=60)
        assert policy.commands == 1
        # Redelivery: a policy in a new group reads the whole log again and sends the same command id.
        again = FraudPolicy(settings.replace(policy_group_id=settings.policy_group_id + "-again"), **QUIET)
        assert again.run(until_caught_up=True, max_seconds=60).commands == 1
        frozen_declined = store.submit(payment(payment_id="p9"))
        assert frozen_declined.version == 5
    events = events_of(settings)
    assert [e.event_type for e in events] == ["AccountOpened", "PaymentAuthorized", "FraudSuspected",
                                              "AccountFrozen", "PaymentDeclined"]
    from event_store.account.policy import commands_for

    assert events[3].command_id == commands_for(events[2])[0].command_id  # caused by the policy's command
    assert events[3].correlation_id == events[2].correlation_id
    assert events[4].payload["reason"] == "account_frozen"


def test_the_bulk_path_and_submit_send_an_account_to_the_same_partition(settings):
    # send_raw uses librdkafka, submit kafka-python: an account whose commands straddled two partitions
    # would have two states and two version sequences.
    keys = [f"acc-{i}" for i in range(300)]
    with EventStore(settings) as store:
        assert store.send_raw((key, b"{}") for key in keys) == len(keys)
        store.submit_many(open_account(key) for key in keys)
    partitions = defaultdict(set)
    records = list(kafka_log.read_all(settings, settings.commands_topic))
    for record in records:
        partitions[record.key].add(record.partition)
    assert len(records) == 2 * len(keys)
    assert all(len(p) == 1 for p in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) == settings.topic_partitions


def test_a_benchmarks_scratch_topics_are_deleted_after_it_and_no_other_topic(settings):
    """bench/*.py run on topics of their own (millions of events each); left behind they filled the disk."""
    from bench.workloads import scratch_topics

    neighbour = settings.replace(topic_prefix=settings.topic_prefix + "neighbour-")
    kafka_log.ensure_topics(neighbour, log=lambda *_: None)
    scratch = settings.replace(topic_prefix=settings.topic_prefix + "scratch.")

    def topics() -> set[str]:
        client = kafka_log.admin(settings)
        try:
            return {t for t in client.list_topics() if t.startswith(settings.topic_prefix)}
        finally:
            client.close()

    with pytest.raises(RuntimeError, match="the run failed"):
        with scratch_topics(scratch):
            kafka_log.ensure_topics(scratch, log=lambda *_: None)
            assert set(kafka_log.topic_configs(scratch)) <= topics()
            raise RuntimeError("the run failed")
    deadline = time.monotonic() + 60
    while any(t.startswith(scratch.topic_prefix) for t in topics()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert topics() == set(kafka_log.topic_configs(neighbour))
    with pytest.raises(ValueError, match="every topic"):
        kafka_log.delete_topics(settings, "")
