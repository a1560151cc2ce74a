"""The Spark sequence gate judges a batch by the heads of its own aggregates (issue 42): batches of event rows
straight into ``spark_apps.sequence.admit`` on real Spark + Delta (no broker), each verdict the pure rule's
(``read_models.sequence``) over the log so far."""
from __future__ import annotations

import dataclasses

import pytest

from event_store.decider import event_id_for
from eventlake.generator import GeneratorConfig
from lakehouse.settings import Settings
from read_models.catalog import DEAD_LETTER_TABLE, heads_table, held_table, ledger_table
from read_models.sequence import sequence
from spark_apps.events import parse_events
from spark_apps.merge import BatchContext, ensure_table
from spark_apps.sequence import HEADS_SYNC_ROW, GateChoice, admit, derived_id, ledger_schema
from tests.domain_helpers import events_for

PROJECTION = "projection-heads-test"


class Gate:
    """One projection's gate on a home of its own; ``log`` is every record so far, in log order."""

    def __init__(self, spark, home, **settings):
        from spark_apps.spark_projection import spark_event_row_schema

        self.spark, self.log, self.offset = spark, [], 0
        self.settings = Settings.load({}).replace(home=home, **{"sequence_gate": "heads", **settings})
        ensure_table(spark, self.settings.table_path(ledger_table(PROJECTION)), ledger_schema(), ("aggregate_id",))
        ensure_table(spark, self.settings.table_path(held_table(PROJECTION)), spark_event_row_schema(spark))

    def rows(self, events):
        data = []
        for e in events:
            data.append((e.aggregate_id.encode(), e.to_json(), "events", 0, self.offset, None))
            self.offset += 1
        frame = self.spark.createDataFrame(
            data, "key binary, value binary, topic string, partition int, offset long, timestamp timestamp")
        return parse_events(frame)[0]

    def batch(self, batch_id: int, events, again: bool = False):
        """-> (admitted event ids, conflicts, waiting) of batch ``batch_id`` holding ``events``."""
        if not again:
            self.log += list(events)
            self.last = self.rows(events)
        ctx = BatchContext(self.spark, self.settings, "app", PROJECTION, batch_id, input_rows=-1, log=lambda *_: None)
        admission = admit(ctx, self.last, PROJECTION)
        return sorted(r.event_id for r in admission.events.collect()), admission.conflicts, admission.waiting

    def table(self, name):
        return self.spark.read.format("delta").load(str(self.settings.table_path(name)))


def _ids(events):
    return sorted(e.event_id for e in events)


def _other(event, version, command_id="other-command", **changes):
    """A different event at ``version`` of ``event``'s aggregate, its id derived from its own fields."""
    return dataclasses.replace(event, aggregate_version=version, command_id=command_id,
                               event_id=event_id_for(event.aggregate_type, event.aggregate_id, version, command_id),
                               **changes)


@pytest.fixture(scope="module")
def history():
    events = events_for(GeneratorConfig(accounts=2, commands=24, seed=42, run_id="heads"))
    a = [e for e in events if e.aggregate_id == events[0].aggregate_id]
    b = [e for e in events if e.aggregate_id != events[0].aggregate_id]
    assert len(a) >= 6 and len(b) >= 3
    return a, b


def test_the_derived_id_column_is_event_id_for(spark, history):
    from pyspark.sql import functions as F

    a, b = history
    frame = spark.createDataFrame([(e.aggregate_type, e.aggregate_id, e.aggregate_version, e.command_id)
                                   for e in a + b + [_other(a[0], 9, command_id="ü/ñ ✓")]],
                                  "aggregate_type string, aggregate_id string, aggregate_version long, "
                                  "command_id string")
    got = [r[0] for r in frame.select(derived_id(F)).collect()]
    assert got == [event_id_for(e.aggregate_type, e.aggregate_id, e.aggregate_version, e.command_id)
                   for e in a + b + [_other(a[0], 9, command_id="ü/ñ ✓")]]


def test_heads_give_the_pure_rules_verdicts(spark, tmp_path, history):
    a, b = history
    gate = Gate(spark, tmp_path / "home")

    # Batch 0, and the same batch run again after a crash (every write committed): the same admissions.
    first = gate.batch(0, a[:3] + b[:2])
    assert first == (_ids(a[:3] + b[:2]), 0, 0)
    assert gate.batch(0, None, again=True) == first
    heads = {r.aggregate_id: r.aggregate_version for r in gate.table(heads_table(PROJECTION)).collect()}
    assert heads == {a[0].aggregate_id: 3, b[0].aggregate_id: 2, HEADS_SYNC_ROW: heads[HEADS_SYNC_ROW]}

    # A replay of the whole batch in a later one: nothing new, no conflict.
    assert gate.batch(1, a[:3] + b[:2]) == ([], 0, 0)

    # A stale version: a different event at the head (v3) and below it (v1: the ledger names its holder).
    stale_head, stale_below = _other(a[0], 3), _other(a[0], 1, command_id="another-command")
    assert gate.batch(2, [stale_head, stale_below, a[3]]) == ([a[3].event_id], 2, 0)
    reasons = [r.reason for r in gate.table(DEAD_LETTER_TABLE).collect()]
    assert any(a[2].event_id in r and stale_head.event_id in r for r in reasons)
    assert any(a[0].event_id in r and stale_below.event_id in r for r in reasons)

    # A gap: v6 waits until v5 comes.
    assert gate.batch(3, [a[5]]) == ([], 0, 1)
    assert gate.batch(4, [a[4], b[2]]) == (_ids([a[4], a[5], b[2]]), 0, 0)

    # A repeated id under another version (its id is not its derivation): counted once, as its first record.
    repeat = dataclasses.replace(a[1], aggregate_version=7)
    assert gate.batch(5, [repeat]) == ([], 0, 0)

    admitted = sorted(r.event_id for r in gate.table(ledger_table(PROJECTION)).collect())
    assert admitted == _ids(sequence(gate.log).admitted)
    assert [c[0].event_id for c in sequence(gate.log).conflicts] == [stale_head.event_id, stale_below.event_id]


def test_ledger_rows_another_writer_appended_move_the_heads(spark, tmp_path, history):
    """The Python engine appends to the ledger only: the gate catches its heads up from the ledger's new
    commits (not the whole ledger), so the next version continues and a replay of those events is none."""
    a, b = history
    gate = Gate(spark, tmp_path / "home")
    assert gate.batch(0, a[:2]) == (_ids(a[:2]), 0, 0)
    other_writer = spark.createDataFrame([(e.aggregate_id, e.aggregate_version, e.event_id, 0, 100 + i, "app/1")
                                          for i, e in enumerate(a[2:4] + b[:1])], ledger_schema())
    other_writer.write.format("delta").mode("append").save(str(gate.settings.table_path(ledger_table(PROJECTION))))
    gate.log += a[2:4] + b[:1]
    assert gate.batch(2, a[2:5] + b[:2]) == (_ids([a[4], b[1]]), 0, 0)
    heads = {r.aggregate_id: (r.aggregate_version, r.event_id) for r in gate.table(heads_table(PROJECTION)).collect()}
    assert heads[a[0].aggregate_id] == (5, a[4].event_id) and heads[b[0].aggregate_id] == (2, b[1].event_id)


def test_auto_takes_the_ledgers_gate_while_the_ledger_is_small_then_the_heads_for_good(spark, tmp_path, history):
    """sequence_gate=auto (the default): the ledger's gate until the ledger holds sequence_heads_from_mb, then the
    heads', read from the whole ledger once: the verdicts go on as the pure rule's across the switch."""
    a, b = history
    gate = Gate(spark, tmp_path / "home", sequence_gate="auto", sequence_heads_from_mb=1024)
    heads_path = gate.settings.table_path(heads_table(PROJECTION))

    def chosen(batch_id):
        ctx = BatchContext(spark, gate.settings, "app", PROJECTION, batch_id, input_rows=-1, log=lambda *_: None)
        return GateChoice().gate(ctx, PROJECTION)

    assert chosen(0) == "ledger"
    assert gate.batch(0, a[:3] + b[:1]) == (_ids(a[:3] + b[:1]), 0, 0)
    assert gate.batch(1, [a[4]]) == ([], 0, 1)  # v5 waits for v4
    assert not (heads_path / "_delta_log").exists()  # the ledger's gate keeps no heads

    gate.settings = gate.settings.replace(sequence_heads_from_mb=0)  # the ledger "grew past" the threshold
    assert chosen(2) == "heads"
    # A replay, a different event below the head (the ledger names its holder), the gap filled, a new aggregate's
    # next version: judged against heads read from the whole ledger once.
    stale = _other(a[0], 2)
    assert gate.batch(2, a[:2] + [stale, a[3], b[1]]) == (_ids([a[3], a[4], b[1]]), 1, 0)
    heads = {r.aggregate_id: r.aggregate_version for r in gate.table(heads_table(PROJECTION)).collect()}
    assert heads[a[0].aggregate_id] == 5 and heads[b[0].aggregate_id] == 2

    gate.settings = gate.settings.replace(sequence_heads_from_mb=1024)
    assert chosen(3) == "heads"  # for good: its heads table exists
    assert gate.batch(3, [a[5], b[0]]) == ([a[5].event_id], 0, 0)
    admitted = sorted(r.event_id for r in gate.table(ledger_table(PROJECTION)).collect())
    assert admitted == _ids(sequence(gate.log).admitted)
    assert [c[0].event_id for c in sequence(gate.log).conflicts] == [stale.event_id]
