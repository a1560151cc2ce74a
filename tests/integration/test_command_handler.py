"""Commands in -> events out, through the real broker and the real command handler."""
import json
from collections import defaultdict

import pytest

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from eventlake.generator import GeneratorConfig, generate_commands
from tests.domain_helpers import events_for

pytestmark = pytest.mark.slow


def send(settings, records):
    producer = kafka_log.make_producer(settings)
    try:
        return kafka_log.produce_all(producer, settings.commands_topic, records)
    finally:
        producer.close()


def handle_all(settings):
    with CommandHandler(settings, log=lambda *_: None) as handler:
        return handler.run(until_caught_up=True, max_seconds=120)


def read(settings, topic):
    return list(kafka_log.read_all(settings, topic))


def test_commands_become_events_in_order_per_account(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    cfg = GeneratorConfig(accounts=30, commands=400, seed=11, run_id="h", invalid_rate=0.02, malformed_rate=0.01)
    commands = list(generate_commands(cfg))
    send(settings, commands)
    stats = handle_all(settings)
    assert stats.commands == len(commands)

    records = read(settings, settings.events_topic)
    events = [EventEnvelope.from_json(r.value) for r in records]
    # Exactly the events the pure core decides for the same commands, nothing more.
    expected = events_for(cfg)
    assert sorted((e.aggregate_id, e.aggregate_version, e.event_type, e.event_id) for e in events) == \
        sorted((e.aggregate_id, e.aggregate_version, e.event_type, e.event_id) for e in expected)
    # Keyed by account, so one account's events sit in one partition, in version order 1..n.
    by_account = defaultdict(list)
    for r, e in zip(records, events):
        assert r.key.decode() == e.aggregate_id
        by_account[e.aggregate_id].append((r.partition, r.offset, e.aggregate_version))
    for account, seen in by_account.items():
        assert len({p for p, _, _ in seen}) == 1, account
        versions = [v for _, _, v in sorted(seen)]
        assert versions == list(range(1, len(versions) + 1)), account

    results = {CommandResult.from_json(r.value).command_id: CommandResult.from_json(r.value)
               for r in read(settings, settings.results_topic)}
    rejected = [r for r in results.values() if r.status == "rejected"]
    assert stats.rejected == len(rejected) > 0
    assert all(r.reason for r in rejected)
    dead = [json.loads(r.value) for r in read(settings, settings.dead_letters_topic)]
    assert len(dead) == stats.dead_lettered > 0
    assert all(d["reason"] and d["source_topic"] == settings.commands_topic for d in dead)
    assert {bytes.fromhex(d["original_value_hex"]) for d in dead} <= {v for _, v in commands}
    # Its OpenLineage run (the file transport under the home): commands topic in, its four topics out.
    from lakehouse.lineage import events_file, read_events

    [start, end] = read_events(events_file(settings))
    kafka = f"kafka://{settings.bootstrap_servers.split(',')[0]}"
    assert (start["eventType"], end["eventType"], start["run"]["runId"]) == ("START", "COMPLETE", end["run"]["runId"])
    assert start["job"]["name"] == f"handler.{settings.handler_group_id}"
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == [(kafka, settings.commands_topic)]
    assert [d["name"] for d in start["outputs"]] == [settings.events_topic, settings.results_topic,
                                                     settings.dead_letters_topic, settings.snapshots_topic]


def test_a_resent_command_writes_no_second_set_of_events_even_after_a_restart(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    open_account = CommandEnvelope.create("OpenAccount", "acc-dup", {"customer_id": "c", "credit_limit_minor": 100,
                                                                     "currency": "USD"})
    send(settings, [("acc-dup", open_account.to_json())])
    handle_all(settings)
    send(settings, [("acc-dup", open_account.to_json())])
    stats = handle_all(settings)  # a new handler instance: state comes back from the log
    assert stats.duplicates == 1
    events = [EventEnvelope.from_json(r.value) for r in read(settings, settings.events_topic)]
    assert [(e.event_type, e.aggregate_version) for e in events] == [("AccountOpened", 1)]
