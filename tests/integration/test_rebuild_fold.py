"""The rebuild's batch fold of ``event_archive`` (spark_apps/rebuild_fold.py) on a messy log projected for real:
it gives the streaming projection's tables (windowed: with the late events folded in) and the oracle's, and a
fold up to a midpoint followed by a streaming catch-up from there gives the same tables as the full fold."""
import json
import random

import pytest

import read_models
from event_store.envelope import EventEnvelope
from eventlake.generator import GeneratorConfig
from read_models.catalog import ARCHIVE_TABLE, held_table, ledger_table
from read_models.sequence import sequence
from read_models.spec import WINDOWED_SUM
from spark_apps.projection import Projection
from spark_apps.rebuild_fold import archive_position, catch_up_offsets, fold_archive, warehouse_targets
from tests.domain_helpers import events_for
from tests.oracle import assert_matches_oracle, late_count, table_rows
from tests.projecting import publish_events

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=30, commands=400, seed=11, run_id="rebuild", late_rate=0.03)
MODELS = read_models.select(None)
PROJECTION = "projection-" + "+".join(m.name for m in MODELS)


def forged(event, **changes):
    obj = json.loads(event.to_json())
    obj["payload"].update(changes.pop("payload", {}))
    obj.update(changes)
    return EventEnvelope.from_dict(obj)


def messy_log():
    """Every event twice, shuffled (later versions before earlier ones, late event times), a different event at
    a taken version and an event after a gap that is never filled: in log order (per account)."""
    events = events_for(CFG, flag_every=7)
    payment = next(e for e in events if e.event_type == "PaymentAuthorized")
    last = max(e.aggregate_version for e in events if e.aggregate_id == payment.aggregate_id)
    log = events * 2
    random.Random(4).shuffle(log)
    log.insert(len(log) // 3, forged(payment, event_id="forged-conflict",
                                     payload={"payment_id": "pay-forged-1", "amount_minor": 7}))
    log.insert(len(log) // 3, forged(payment, event_id="forged-gap", aggregate_version=last + 2,
                                     payload={"payment_id": "pay-forged-2"}))
    return log


def delta_rows(spark, path, *columns):
    return {tuple(r[c] for c in columns) for r in spark.read.format("delta").load(str(path)).collect()}


def assert_same_tables(spark, a, b, log):
    """Two warehouses hold the same tables; a windowed model's may differ in which events went to late_events
    instead of their windows (a stream records late events where a fold has none), so each is held to what the
    log folds to: its table plus its late events are the oracle's fold."""
    for model in MODELS:
        if model.merge_strategy == WINDOWED_SUM:
            assert_matches_oracle(spark, a, log, [model])
            assert_matches_oracle(spark, b, log, [model])
        else:
            assert table_rows(spark, a, model) == table_rows(spark, b, model), model.name


def test_the_fold_of_the_archive_equals_the_stream_and_a_catch_up_from_its_midpoint_equals_the_full_fold(
        spark, settings, tmp_path):
    log = messy_log()
    publish_events(settings, log)
    # Two batches of the 904 records (Spark's Kafka source takes at most the limit per batch), so that the second
    # holds events behind the first's watermark: each Spark batch costs seconds, whatever its size.
    stream = Projection(spark, settings, log=lambda *_: None).run_until_caught_up(max_offsets_per_trigger=460)
    assert stream.batches >= 2
    assert late_count(spark, settings) > 0  # the stream recorded late events: the fold must put them back

    # The whole archive, into a fresh generation's folders.
    full = settings.replace(home=tmp_path / "full")
    lines = []
    reported = []
    result = fold_archive(spark, settings, MODELS, warehouse_targets(full, MODELS), log=lines.append,
                          on_step=lambda done, total: reported.append((done, total)))
    assert result.position == archive_position(spark, settings)
    assert result.events == len(log) and result.conflicts == 1 and result.held == 1
    steps = len(MODELS) + 2  # one per model and two more (spark_apps.rebuild_fold.fold_archive)
    assert [line.split("]")[0] for line in lines[:-1]] == [f"rebuild: [{k}/{steps}" for k in range(1, steps + 1)]
    assert reported == [(k, steps) for k in range(1, steps + 1)]  # a rebuild's progress, pushed while it runs
    assert_matches_oracle(spark, full, log)  # windowed: the table alone, as nothing of it is late
    assert late_count(spark, full) == 0
    # The stream's windowed tables: the same fold less the late events it recorded (so, with them, the fold).
    assert_matches_oracle(spark, settings, log)
    for model in MODELS:
        if model.merge_strategy != WINDOWED_SUM:
            assert table_rows(spark, full, model) == table_rows(spark, settings, model), model.name
    ledger = ("aggregate_id", "aggregate_version", "event_id")
    assert delta_rows(spark, full.table_path(ledger_table(PROJECTION)), *ledger) == \
        delta_rows(spark, settings.table_path(ledger_table(PROJECTION)), *ledger)
    held = delta_rows(spark, full.table_path(held_table(PROJECTION)), "event_id")
    assert held == delta_rows(spark, settings.table_path(held_table(PROJECTION)), "event_id") \
        == {("forged-gap",)}
    assert delta_rows(spark, full.table_path("_applied/merchant_minute_volume"), "event_id") == \
        delta_rows(spark, settings.table_path("_applied/merchant_minute_volume"), "event_id")
    assert delta_rows(spark, full.table_path("_pending/account_summary"), "event_id") == set()

    # The same fold as Spark jobs (what a model without fold_sql, or a URI, gets) writes the same tables.
    in_spark = settings.replace(home=tmp_path / "spark")
    spark_lines = []
    fold_archive(spark, settings, MODELS, warehouse_targets(in_spark, MODELS), log=spark_lines.append, engine="spark")
    assert_same_tables(spark, in_spark, full, log)
    for bookkeeping in (ledger_table(PROJECTION), held_table(PROJECTION),
                        "_applied/merchant_minute_volume", "_pending/account_summary"):
        assert delta_rows(spark, in_spark.table_path(bookkeeping), "event_id") == \
            delta_rows(spark, full.table_path(bookkeeping), "event_id"), bookkeeping

    # Up to a midpoint: the bookkeeping stands as the rule says for the log up to there ...
    midpoint = {p: o // 2 for p, o in result.position.items()}
    half = settings.replace(home=tmp_path / "half")
    fold_archive(spark, settings, MODELS, warehouse_targets(half, MODELS), up_to=midpoint, log=lambda *_: None)
    by_id = {e.event_id: e for e in log}
    archived = spark.read.format("delta").load(str(settings.table_path(ARCHIVE_TABLE))).select(
        "event_id", "kafka_partition", "kafka_offset").collect()
    prefix = [by_id[r["event_id"]] for r in sorted(archived, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
              if r["kafka_offset"] <= midpoint[r["kafka_partition"]]]
    expected = sequence(prefix)
    assert len(expected.waiting) > 1  # events wait at the midpoint for versions that come after it
    assert delta_rows(spark, half.table_path(ledger_table(PROJECTION)), "event_id") == \
        {(e.event_id,) for e in expected.admitted}
    assert delta_rows(spark, half.table_path(held_table(PROJECTION)), "event_id") == \
        {(e.event_id,) for e in expected.waiting}
    assert_matches_oracle(spark, half, prefix)

    # ... and the stream, started there with the generation's own checkpoint and bookkeeping, finishes the job.
    catch_up = Projection(spark, half, MODELS, archive=False, log=lambda *_: None,
                          starting_offsets=catch_up_offsets(half, midpoint))
    caught_up = catch_up.run_until_caught_up()  # one batch: its first is the one that reads the fold's bookkeeping
    assert caught_up.input_rows == sum(r["kafka_offset"] > midpoint[r["kafka_partition"]] for r in archived)
    assert_same_tables(spark, half, full, log)
    assert delta_rows(spark, half.table_path(held_table(PROJECTION)), "event_id") == held
