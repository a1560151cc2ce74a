"""Poison commands and hostile records against the real broker and the real command handler (issue 14):
a command too big for the log, a transaction that cannot commit, an event dated far ahead, unreadable records
in the events topic. None of them may stop the handler or hold back the commands after them."""
import dataclasses
import json
import re
from collections import defaultdict

import pytest
from kafka.admin import NewTopic

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.errors import InvalidRecord
from event_store.handler import CommandHandler

pytestmark = pytest.mark.slow
SMALL_RECORDS = 4096  # max.message.bytes of the events and results topics in these tests


def quiet(lines):
    return lambda message: lines.append(message)


def create_topics(settings, max_message_bytes=None):
    """The handler's topics, the events and results topics with a small max.message.bytes if asked."""
    configs = kafka_log.topic_configs(settings)
    if max_message_bytes:
        for topic in (settings.events_topic, settings.results_topic):
            configs[topic] = {**configs[topic], "max.message.bytes": str(max_message_bytes)}
    admin = kafka_log.admin(settings)
    try:
        admin.create_topics([NewTopic(name, settings.topic_partitions, 1, topic_configs=cfg)
                             for name, cfg in configs.items()])
    finally:
        admin.close()


def send(settings, commands):
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.commands_topic,
                              [(c.aggregate_id, c.to_json()) for c in commands])
    finally:
        producer.close()


def results(settings):
    return {r.command_id: r for r in (CommandResult.from_json(rec.value)
                                      for rec in kafka_log.read_all(settings, settings.results_topic))}


def events(settings):
    return [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]


def assert_gap_free(all_events):
    by_account = defaultdict(list)
    for e in all_events:
        by_account[e.aggregate_id].append(e.aggregate_version)
    for account, versions in by_account.items():
        assert versions == list(range(1, len(versions) + 1)), account


def account_commands(account="acc-1", evidence="x" * 10_000, payments=3):
    """OpenAccount, a FlagFraud with a big ``evidence`` (no length limit), then payments: one partition."""
    opened = CommandEnvelope.create("OpenAccount", account, {"customer_id": "c", "credit_limit_minor": 100_000,
                                                             "currency": "USD"})
    flag = CommandEnvelope.create("FlagFraud", account, {"payment_id": "p0", "rule": "burst", "evidence": evidence})
    pays = [CommandEnvelope.create("AuthorizePayment", account, {
        "payment_id": f"p{i}", "amount_minor": 100, "currency": "USD", "merchant_id": "m1", "location": "US-NYC",
        "occurred_at": "2026-01-01T10:00:00.000Z"}) for i in range(1, payments + 1)]
    return [opened, flag, *pays]


def test_a_command_whose_event_exceeds_the_topics_record_limit_is_rejected_and_later_ones_are_handled(settings):
    create_topics(settings, max_message_bytes=SMALL_RECORDS)
    commands = account_commands()
    send(settings, commands)
    lines = []
    with CommandHandler(settings, log=quiet(lines)) as handler:
        assert handler.record_limits[settings.events_topic] == SMALL_RECORDS  # read from the topic, not guessed
        stats = handler.run(until_caught_up=True, max_seconds=90)
    got = results(settings)
    assert set(got) == {c.command_id for c in commands}
    big = got[commands[1].command_id]
    assert (big.status, big.error_type) == ("rejected", "EventTooLarge")
    assert settings.events_topic in big.reason and f"max.message.bytes {SMALL_RECORDS:,}" in big.reason
    assert re.search(r"record of 10,\d{3} bytes", big.reason)  # the event's size
    assert all(got[c.command_id].status == "accepted" for c in commands if c is not commands[1])
    assert [(e.event_type, e.aggregate_version) for e in events(settings)] == [
        ("AccountOpened", 1), ("PaymentAuthorized", 2), ("PaymentAuthorized", 3), ("PaymentAuthorized", 4)]
    assert stats.too_large == 1 and stats.aborted == 0


def test_a_failing_transaction_is_redone_one_command_per_transaction_and_the_unwritable_command_rejected(settings):
    create_topics(settings, max_message_bytes=SMALL_RECORDS)
    commands = account_commands(payments=5)
    send(settings, commands)
    lines = []
    with CommandHandler(settings, log=quiet(lines)) as handler:
        # Something the precheck does not catch: it believes records up to 1 MB fit; the broker refuses.
        handler.limits = dataclasses.replace(handler.limits, max_event_bytes=1_000_000)
        stats = handler.run(until_caught_up=True, max_seconds=120)
    got = results(settings)
    assert set(got) == {c.command_id for c in commands}
    big = got[commands[1].command_id]
    assert (big.status, big.error_type) == ("rejected", "NotWritable")
    assert "MSG_SIZE_TOO_LARGE" in big.reason and settings.commands_topic in big.reason
    assert all(got[c.command_id].status == "accepted" for c in commands if c is not commands[1])
    all_events = events(settings)
    assert [e.event_type for e in all_events] == ["AccountOpened"] + ["PaymentAuthorized"] * 5
    assert_gap_free(all_events)
    # At least the poison command's own attempts; librdkafka may fail one more transaction after the refused
    # records (OUT_OF_ORDER_SEQUENCE_NUMBER, until it bumps the producer epoch): that command is simply redone.
    assert stats.batch_retries >= 1 and stats.unwritable == 1 and stats.command_retries >= 3
    assert any("one command per transaction" in line for line in lines)


def test_an_event_dated_beyond_the_allowed_skew_is_rejected_by_the_real_handler(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    opened, _, on_time, far = account_commands(payments=2)
    far = CommandEnvelope.create("AuthorizePayment", "acc-1", {**far.payload, "occurred_at": "9998-12-31T23:59:59Z"})
    send(settings, [opened, far, on_time])
    with CommandHandler(settings, log=lambda *_: None) as handler:
        handler.run(until_caught_up=True, max_seconds=60)
    got = results(settings)
    assert (got[far.command_id].status, got[far.command_id].error_type) == ("rejected", "EventTimeInFuture")
    assert "9998-12-31T23:59:59Z" in got[far.command_id].reason
    assert "EVENTLAKE_MAX_EVENT_TIME_AHEAD_S" in got[far.command_id].reason
    assert got[on_time.command_id].status == "accepted"


def test_unreadable_records_in_the_events_topic_do_not_stop_the_handler(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    # Written straight into the events topic, on every partition: a tombstone, bytes that are not JSON, and an
    # event whose payload evolve() cannot fold (AccountOpened without its fields).
    odd_event = (b'{"event_id":"e1","event_type":"AccountOpened","schema_version":1,"aggregate_type":"account",'
                 b'"aggregate_id":"acc-odd","aggregate_version":1,"occurred_at":"2026-01-01T00:00:00Z",'
                 b'"recorded_at":"2026-01-01T00:00:00Z","command_id":"c","correlation_id":"c","causation_id":"c",'
                 b'"payload":{}}')
    producer = kafka_log.make_producer(settings)
    try:
        for p in range(settings.topic_partitions):
            for value in (None, b"\xff\xfenot json", odd_event):
                producer.send(settings.events_topic, key=b"acc-odd", value=value, partition=p)
        producer.flush()
    finally:
        producer.close()
    commands = account_commands(evidence="fine")
    send(settings, commands)
    lines = []
    with CommandHandler(settings, log=quiet(lines)) as handler:
        stats = handler.run(until_caught_up=True, max_seconds=60)
    got = results(settings)
    assert all(got[c.command_id].status == "accepted" for c in commands)
    assert stats.unreadable_events >= 2 * settings.topic_partitions
    skipped = [line for line in lines if "unreadable events record" in line]
    assert any(f"{settings.events_topic}/0/0" in line for line in skipped)


def test_an_unreadable_event_quarantines_its_account_alone_until_an_operator_resolves_it(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    quarantined, healthy = account_commands("acc-q", evidence="fine", payments=1), account_commands("acc-ok", payments=0)
    send(settings, quarantined + healthy)
    with CommandHandler(settings, log=lambda *_: None) as handler:
        handler.run(until_caught_up=True, max_seconds=60)
    [opened] = [e for e in events(settings) if e.aggregate_id == "acc-q" and e.aggregate_version == 1]
    partition = next(r.partition for r in kafka_log.read_all(settings, settings.events_topic)
                     if EventEnvelope.from_json(r.value).event_id == opened.event_id)
    # Written around the handler: version 4 of acc-q with a negative amount (invalid: the account is
    # quarantined), then a valid version 5 after the gap it leaves (it waits, as in the read models).
    good = json.loads(opened.to_json())
    forged = []
    for version, amount in ((4, -5000), (5, 700)):
        forged.append({**good, "event_id": f"forged-{version}", "event_type": "PaymentAuthorized", "schema_version": 2,
                       "aggregate_version": version, "payload": {
                           "payment_id": f"pf{version}", "amount_minor": amount, "currency": "USD", "merchant_id": "m",
                           "location": "US-NYC", "merchant_country": "US"}})
    producer = kafka_log.make_producer(settings)
    try:
        sent = [producer.send(settings.events_topic, key=b"acc-q", value=json.dumps(f).encode(), partition=partition)
                for f in forged]
        producer.flush()
        record = f"{settings.events_topic}/{partition}/{sent[0].get(10).offset}"
    finally:
        producer.close()

    def pay(account, payment_id):
        return CommandEnvelope.create("AuthorizePayment", account, {
            "payment_id": payment_id, "amount_minor": 100, "currency": "USD", "merchant_id": "m1",
            "location": "US-NYC", "occurred_at": "2026-01-01T10:00:00.000Z"})

    refused, other = pay("acc-q", "p7"), pay("acc-ok", "p1")
    wrong = CommandEnvelope.create("ResolveQuarantine", "acc-q", {"record": f"{settings.events_topic}/{partition}/0",
                                                                  "reason": "checked", "resolved_by": "ops"})
    resolve = CommandEnvelope.create("ResolveQuarantine", "acc-q", {"record": record, "reason": "forged, refunded",
                                                                    "resolved_by": "ops-anna"})
    after = pay("acc-q", "p8")
    send(settings, [refused, other, wrong, resolve, after])
    lines = []
    with CommandHandler(settings, log=quiet(lines)) as handler:  # a restart: the rebuild meets the records
        stats = handler.run(until_caught_up=True, max_seconds=60)
    got = results(settings)
    assert (got[refused.command_id].status, got[refused.command_id].error_type) == ("rejected", "AccountQuarantined")
    assert record in got[refused.command_id].reason and "amount_minor" in got[refused.command_id].reason
    assert got[other.command_id].status == "accepted"  # every other account goes on
    assert got[wrong.command_id].error_type == "QuarantineRecordMismatch"
    assert got[resolve.command_id].status == "accepted" and got[resolve.command_id].version == 4
    # The resolution filled version 4, so the forged version 5 that waited counts now, here as in the read models.
    assert got[after.command_id].status == "accepted" and got[after.command_id].version == 6
    readable = []
    for r in kafka_log.read_all(settings, settings.events_topic):
        try:
            readable.append(EventEnvelope.from_json(r.value))
        except InvalidRecord:
            assert r.value == json.dumps(forged[0]).encode()
    audit = [e for e in readable if e.event_type == "QuarantineResolved"]
    assert [(e.aggregate_version, e.payload["record"], e.payload["resolved_by"]) for e in audit] == [
        (4, record, "ops-anna")]
    assert "amount_minor" in audit[0].payload["evidence"]
    assert stats.unreadable_events == 1 and any("account acc-q quarantined" in line for line in lines)
    assert stats.quarantined_aggregates == 1  # served as eventlake_handler_quarantined_aggregates_total


def test_an_event_waiting_after_a_gap_never_filled_keeps_neither_the_store_nor_snapshots_from_being_written(settings):
    """A record written around the handler after a gap (version 5 of an account with no versions before it) waits,
    as in the read models, for as long as the gap lasts. Meanwhile the partition's state store still follows the
    log and its snapshots are still written, both holding the waiting event (issue 42: before, neither was
    written, so every change stayed in memory and a restart read the whole partition again). Once the gap is
    filled, the waiting version counts, whether the partition comes from this machine's store or, on another
    machine, from the snapshot."""
    from event_store.state_store import store_figures, store_path

    settings = settings.replace(topic_partitions=1, snapshot_every_events=5)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    commands = account_commands("acc-a", evidence="fine")
    template = {"event_type": "PaymentAuthorized", "schema_version": 2, "aggregate_type": "account",
                "aggregate_id": "acc-ghost", "occurred_at": "2026-01-01T09:00:00.000Z",
                "recorded_at": "2026-01-01T09:00:00.000Z", "command_id": "forged", "correlation_id": "forged",
                "causation_id": "forged"}
    ghost_5 = {**template, "event_id": "forged-ghost-5", "aggregate_version": 5, "payload": {
        "payment_id": "pg5", "amount_minor": 700, "currency": "USD", "merchant_id": "m", "location": "US-NYC",
        "merchant_country": "US"}}

    def forge(values):
        producer = kafka_log.make_producer(settings)
        try:
            for value in values:
                producer.send(settings.events_topic, key=b"acc-ghost", value=json.dumps(value).encode(), partition=0)
            producer.flush()
        finally:
            producer.close()

    def run(commands, lines):
        send(settings, commands)
        with CommandHandler(settings, log=quiet(lines)) as handler:
            handler.run(until_caught_up=True, max_seconds=60)
        return results(settings)

    def rebuilt_from(lines):
        [line] = [line for line in lines if re.search(r"partition 0: \d+ aggregates from", line)]
        return line

    forge([ghost_5])
    lines = []
    got = run(commands, lines)
    assert all(got[c.command_id].status == "accepted" for c in commands)
    assert any("version 5 of account acc-ghost follows version 0" in line for line in lines)
    store = store_path(settings.home, settings.events_topic, 0)
    last_event = max(r.offset for r in kafka_log.read_all(settings, settings.events_topic))
    assert store_figures(store)["positions"][0] > last_event  # the store follows the log past the waiting event
    snapshots = [r.value for r in kafka_log.read_all(settings, settings.snapshots_topic) if r.value]
    assert any(b'"waiting_of"' in value and b"forged-ghost-5" in value for value in snapshots)

    # Same machine: the restart opens the store (the waiting event in it) and reads only the log after it: the
    # forged versions 1-4 that fill the gap. Version 5 then counts: the next payment is version 6.
    opened_and_more = [EventEnvelope.from_json(r.value).to_dict()
                       for r in kafka_log.read_all(settings, settings.events_topic) if b'"acc-a"' in r.value][:4]
    forge([{**e, "aggregate_id": "acc-ghost", "event_id": f"forged-ghost-{e['aggregate_version']}"}
           for e in opened_and_more])
    settings = settings.replace(snapshot_every_events=0)  # no new snapshot: the next restore is the one above
    pay = [CommandEnvelope.create("AuthorizePayment", "acc-ghost", {
        "payment_id": f"pg{i}", "amount_minor": 100, "currency": "USD", "merchant_id": "m1", "location": "US-NYC",
        "occurred_at": "2026-01-01T10:00:00.000Z"}) for i in (6, 7)]
    lines = []
    got = run(pay[:1], lines)
    assert (got[pay[0].command_id].status, got[pay[0].command_id].version) == ("accepted", 6), got[pay[0].command_id]
    assert "from the state store + 4 events" in rebuilt_from(lines)

    # Another machine (no store): restored from the snapshot, which holds the waiting event, then the log's tail.
    import shutil

    shutil.rmtree(settings.home / "handler-state")
    lines = []
    got = run(pay[1:], lines)
    assert (got[pay[1].command_id].status, got[pay[1].command_id].version) == ("accepted", 7), got[pay[1].command_id]
    assert "from a snapshot + " in rebuilt_from(lines)
