"""Every read model projected on the real broker and real Spark + Delta, checked against the oracle
(the plain-Python fold of the same events, see tests/oracle.py)."""
import random
import time

import pytest

from deltalake import DeltaTable

import read_models
from event_store import kafka_log
from event_store.envelope import parse_time
from eventlake.generator import GeneratorConfig
from expectations.reconciliation import reconcile
from read_models.account.account_summary import MODEL as ACCOUNT_SUMMARY
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE
from spark_apps.projection import Projection
from tests.domain_helpers import events_for
from tests.oracle import assert_matches_oracle, late_count, table_rows
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=40, commands=500, seed=5, run_id="proj", late_rate=0.03)


def publish(settings, values):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.events_topic, values)
    finally:
        producer.close()


def project(spark, settings, models=None, **kw):
    return Projection(spark, settings, models, log=lambda *_: None).run_until_caught_up(**kw)


def delta(spark, settings, name):
    return spark.read.format("delta").load(str(settings.table_path(name)))


def test_duplicates_and_reordering_give_the_same_tables_as_one_clean_pass(spark, settings, tmp_path):
    events = events_for(CFG, flag_every=7)

    clean = settings.replace(topic_prefix=settings.topic_prefix + "clean.", home=tmp_path / "clean")
    publish(clean, [(e.aggregate_id, e.to_json()) for e in events])
    project_in_python(spark, clean)  # the reference (tests/projecting.py); the messy log below is Spark's
    assert_matches_oracle(spark, clean, events)
    assert late_count(spark, clean) == 0  # one batch: no window had closed yet
    assert delta(spark, clean, ARCHIVE_TABLE).count() == len(events)

    messy = settings.replace(topic_prefix=settings.topic_prefix + "messy.", home=tmp_path / "messy")
    records = [(e.aggregate_id, e.to_json()) for e in events] * 2
    random.Random(1).shuffle(records)  # later versions of an account now often come before earlier ones
    records.insert(len(records) // 2, ("acc-proj-00001", b"{this is not an event"))
    publish(messy, records)
    projection = Projection(spark, messy, log=lambda *_: None)
    run = projection.run_until_caught_up(max_offsets_per_trigger=400)
    assert run.batches >= 3  # the disorder really spans batches
    assert_matches_oracle(spark, messy, events)
    assert late_count(spark, messy) > 0  # shuffled event times: some arrive after their window closed
    # Its metrics count each event applied once (its repeats are no outcome), the late ones, the one bad record;
    # nothing is left held.
    [figures] = projection.figures.query_figures("read_models")
    assert figures.events == {"applied": len(events), "late": late_count(spark, messy), "dead_lettered": 1}, \
        figures.events
    assert figures.held == 0
    assert table_rows(spark, clean, ACCOUNT_SUMMARY) == table_rows(spark, messy, ACCOUNT_SUMMARY)
    assert delta(spark, messy, "_pending/account_summary").count() == 0
    dead = delta(spark, messy, DEAD_LETTER_TABLE).collect()
    assert len(dead) == 1
    assert dead[0]["raw_value"] == "{this is not an event" and "not an event envelope" in dead[0]["reason"]
    assert dead[0]["kafka_topic"] == messy.events_topic and dead[0]["kafka_offset"] >= 0

    # The reconciliation check (expectations/reconciliation.py) folds the archive, duplicates and all, and
    # finds every table equal; a row lost from a table is named.
    for name in read_models.REGISTRY:
        result = reconcile(messy, name)
        assert result.success, result.lines()
        assert result.events == 2 * len(events)
    payment = events[[e.event_type for e in events].index("PaymentAuthorized")]
    payment_id = payment.payload["payment_id"]
    DeltaTable(str(messy.table_path("payments"))).delete(f"payment_id = '{payment_id}'")
    lost = reconcile(messy, "payments")
    assert lost.compared and not lost.success and lost.differences == 1
    assert lost.missing == ((payment.aggregate_id, payment_id),) and "missing from the table" in "\n".join(lost.lines())


def test_stopping_mid_stream_and_restarting_from_the_checkpoint_gives_the_same_tables(spark, settings):
    events = events_for(CFG, flag_every=7)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])

    projection = Projection(spark, settings.replace(trigger_interval="1 second"), log=lambda *_: None)
    query = projection.start(max_offsets_per_trigger=150)
    deadline = time.monotonic() + 300
    while (query.lastProgress is None or query.lastProgress["batchId"] < 1) and time.monotonic() < deadline:
        assert query.exception() is None
        time.sleep(0.5)
    projection.stop()
    # Its metrics (what `eventlake project` serves with the Spark engine, under the Python engine's names): per
    # query, the batches its commit log holds and the records they read; the records past it, by partition, make
    # up the rest of the log.
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in projection.figures.samples()}
    for label, checkpoint in (("read_models", projection.checkpoint), ("event_archive", projection.archive_checkpoint)):
        which = ("query", label)
        commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
        assert got[("projection_batches", (which,))] == len(commits) >= 2, (label, got)
        lag = sum(v for (name, labels), v in got.items() if name == "projection_lag_records" and which in labels)
        assert got[("projection_records", (which,))] + lag == len(events), (label, got)
        assert lag > 0 or label == "event_archive", got  # the archive's lighter query may have read everything
    assert got[("projection_step_seconds", (("query", "read_models"), ("step", "read, parse, cache")))] > 0
    # Every record read was a valid event in its aggregate's order: each applied, none dead-lettered or held.
    rm = ("query", "read_models")
    assert got[("projection_events", (("outcome", "applied"), rm))] == got[("projection_records", (rm,))], got
    assert got[("projection_events", (("outcome", "dead_lettered"), rm))] == 0
    assert got[("projection_held_events", (rm,))] == 0
    newest = max(parse_time(e.recorded_at, "recorded_at").timestamp() for e in events)
    assert 0 < got[("projection_newest_event_timestamp_seconds", (rm,))] <= newest
    assert got[("projection_lag_seconds", (rm,))] > 0  # records wait past it
    applied = sum(r["version"] for r in table_rows(spark, settings, ACCOUNT_SUMMARY).values())
    assert 0 < applied < sum(e.event_type in ACCOUNT_SUMMARY.event_types for e in events), \
        "the first run should have stopped part-way"
    # Part-way, the reconciliation compares each table at its own log position (or says the archive is behind).
    for name in read_models.REGISTRY:
        result = reconcile(settings, name)
        assert result.success or (not result.compared and "archive" in result.reason), result.lines()

    project(spark, settings)
    assert_matches_oracle(spark, settings, events)

    # Once caught up, running again finds nothing to do and changes nothing.
    from delta.tables import DeltaTable
    path = str(settings.table_path("account_summary"))
    version = DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]
    assert project(spark, settings).input_rows == 0
    assert DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] == version


def test_a_gap_in_the_log_stops_the_projection_with_a_message_that_says_what_to_do(spark, settings):
    import confluent_kafka
    from confluent_kafka.admin import AdminClient

    from spark_apps.spark_projection import ProjectionError

    events = events_for(GeneratorConfig(accounts=5, commands=60, seed=3, run_id="gap"))
    first, rest = events[:30], events[30:]
    publish(settings, [(e.aggregate_id, e.to_json()) for e in first])
    project(spark, settings, [ACCOUNT_SUMMARY])
    publish(settings, [(e.aggregate_id, e.to_json()) for e in rest])
    # Retention (here: deleting records by hand) removes events the projection has not read yet.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    ends = kafka_log.end_offsets(settings, settings.events_topic)
    futures = admin.delete_records([confluent_kafka.TopicPartition(tp.topic, tp.partition, end)
                                    for tp, end in ends.items()])
    for future in futures.values():
        future.result(30)
    before = table_rows(spark, settings, ACCOUNT_SUMMARY)

    with pytest.raises(ProjectionError) as stopped:
        project(spark, settings, [ACCOUNT_SUMMARY])
    message = str(stopped.value)
    assert settings.events_topic in message and "gone from Kafka" in message
    assert "event_archive" in message and "checkpoint" in message
    assert table_rows(spark, settings, ACCOUNT_SUMMARY) == before  # nothing written past the gap


def test_a_different_event_at_a_taken_version_or_after_a_gap_counts_in_no_read_model(spark, settings):
    """Records written around the command handler: every read model ignores the same ones, so the models
    never disagree (a conflict goes to the dead letters with both event ids; an event after a gap waits)."""
    import json

    from event_store.envelope import EventEnvelope
    from read_models.sequence import sequence
    from read_models.catalog import held_table

    events = events_for(GeneratorConfig(accounts=6, commands=80, seed=21, run_id="conflict"), flag_every=7)
    payment = next(e for e in events if e.event_type == "PaymentAuthorized")

    def forged(event, **changes):
        obj = json.loads(event.to_json())
        payload = changes.pop("payload", {})
        obj.update(changes)
        obj["payload"].update(payload)
        return EventEnvelope.from_dict(obj)

    conflict = forged(payment, event_id="forged-conflict", payload={"payment_id": "pay-forged-1", "amount_minor": 7})
    last = max(e.aggregate_version for e in events if e.aggregate_id == payment.aggregate_id)
    after_gap = forged(payment, event_id="forged-gap", aggregate_version=last + 3,
                       payload={"payment_id": "pay-forged-2"})
    log = events[:40] + [conflict] + events[40:] + [after_gap] + events[:10]  # and some duplicates
    other = next(e for e in events if e.aggregate_id != payment.aggregate_id)
    unreadable = json.loads(forged(payment, event_id="forged-negative", aggregate_id=other.aggregate_id).to_json())
    unreadable["payload"]["amount_minor"] = -5000  # invalid: its account is quarantined (eventlake status)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in log]
            + [(other.aggregate_id, json.dumps(unreadable).encode())])
    project(spark, settings, max_offsets_per_trigger=30)

    assert_matches_oracle(spark, settings, log)
    expected = sequence(log)
    assert [c[0].event_id for c in expected.conflicts] == ["forged-conflict"]
    payments = {r["payment_id"] for r in delta(spark, settings, "payments").collect()}
    assert payment.payload["payment_id"] in payments and not payments & {"pay-forged-1", "pay-forged-2"}
    summary = table_rows(spark, settings, ACCOUNT_SUMMARY)[(payment.aggregate_id,)]
    assert summary["version"] == last
    dead = [r for r in delta(spark, settings, DEAD_LETTER_TABLE).collect() if "version conflict" in r["reason"]]
    assert len(dead) == 1 and payment.event_id in dead[0]["reason"] and "forged-conflict" in dead[0]["reason"]
    assert json.loads(dead[0]["raw_value"])["payment_id"] == "pay-forged-1"
    held = [r["event_id"] for r in spark.read.format("delta").load(
        str(settings.table_path(held_table(f"projection-{'+'.join(read_models.REGISTRY)}")))).collect()]
    assert held == ["forged-gap"]
    from spark_apps.status import quarantine_lines

    lines = quarantine_lines(settings)
    assert f"  {other.aggregate_id}  {settings.events_topic}/" in "\n".join(lines) and "amount_minor" in lines[1]
    assert f"{payment.aggregate_id} (1)" in lines[-1]  # the event after the gap waits
    assert payment.aggregate_id not in "\n".join(lines[:-1])  # a version conflict quarantines nothing
    for name in read_models.REGISTRY:  # the reconciliation applies the same rule to the archive
        assert reconcile(settings, name).success, reconcile(settings, name).lines()


def test_a_conflict_and_a_gap_of_one_account_in_one_batch_are_both_caught(spark, settings):
    """Versions {1, 1', 3} of one account in one batch: as many events as versions 1..3 would have, but the
    gate must still see the conflict at 1 and the gap at 2 (a count-only check would admit all three)."""
    import json

    from event_store.envelope import EventEnvelope
    from read_models.sequence import sequence

    events = events_for(GeneratorConfig(accounts=2, commands=30, seed=8, run_id="onebatch"))
    account = events[0].aggregate_id
    mine = [e for e in events if e.aggregate_id == account]
    opened, payment = mine[0], next(e for e in mine if e.event_type == "PaymentAuthorized")

    def forged(event, **changes):
        obj = json.loads(event.to_json())
        obj.update(changes)
        return EventEnvelope.from_dict(obj)

    other_opening = forged(opened, event_id="forged-opening", payload={**opened.payload, "credit_limit_minor": 1})
    after_gap = forged(payment, event_id="forged-v3", aggregate_version=3)
    log = [opened, other_opening, after_gap]
    publish(settings, [(e.aggregate_id, e.to_json()) for e in log])
    project(spark, settings)  # one batch

    expected = sequence(log)
    assert [e.event_id for e in expected.admitted] == [opened.event_id]
    assert_matches_oracle(spark, settings, log)
    assert delta(spark, settings, "payments").count() == 0
    dead = [r for r in delta(spark, settings, DEAD_LETTER_TABLE).collect() if "version conflict" in r["reason"]]
    assert len(dead) == 1 and "forged-opening" in dead[0]["reason"]


def test_a_record_repeating_an_event_id_under_the_next_version_counts_in_no_read_model(spark, settings):
    """A copy of an earlier event under the account's next version, written around the command handler after
    that event was projected: its id counts once (read_models.sequence), so no model folds it as a new event
    (account_summary would count the payment again, payments would not: the models would disagree). The
    handler's rebuild skips it too (tests/unit/test_properties.py)."""
    import dataclasses

    from read_models.sequence import sequence

    events = events_for(GeneratorConfig(accounts=3, commands=30, seed=9, run_id="repeat"))
    payment = next(e for e in events if e.event_type == "PaymentAuthorized")
    last = max(e.aggregate_version for e in events if e.aggregate_id == payment.aggregate_id)
    repeat = dataclasses.replace(payment, aggregate_version=last + 1)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])
    project(spark, settings)
    publish(settings, [(repeat.aggregate_id, repeat.to_json())])  # in a later batch
    project(spark, settings)

    log = events + [repeat]
    assert [e.event_id for e in sequence(log).admitted] == [e.event_id for e in sequence(events).admitted]
    assert_matches_oracle(spark, settings, log)
    assert table_rows(spark, settings, ACCOUNT_SUMMARY)[(payment.aggregate_id,)]["version"] == last
    for name in read_models.REGISTRY:
        assert reconcile(settings, name).success, reconcile(settings, name).lines()
