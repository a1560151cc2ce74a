"""The projection's Python engine (spark_apps/python_projection.py: DuckDB + delta-rs on the common path, Spark for
the rest) on the real broker: every read model equal to its oracle, the same tables as the Spark engine, and the two
engines taking over from each other batch by batch on one checkpoint."""
import pytest

import read_models
from eventlake.generator import GeneratorConfig
from spark_apps.projection import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Projection
from spark_apps.python_projection import PythonProjection, event_row_schema
from tests.domain_helpers import events_for
from tests.integration.test_projection import delta, publish
from tests.oracle import assert_matches_oracle, table_rows

pytestmark = pytest.mark.slow

CLEAN = GeneratorConfig(accounts=30, commands=400, seed=21, run_id="py", late_rate=0.0)


def python_engine(spark, settings, models=None, **kw):
    lines = []
    engine = PythonProjection(settings, models, log=lines.append, spark_session=lambda: spark)
    run = engine.run_until_caught_up(**kw)
    return engine, run, lines


def test_the_event_row_schema_is_the_spark_parsers(spark):
    from spark_apps.archive_fold import arrow_schema
    from spark_apps.projection import _event_row_schema

    assert [(f.name, f.type) for f in event_row_schema()] == \
        [(f.name, f.type) for f in arrow_schema(_event_row_schema(spark))]


def test_a_clean_log_is_projected_without_spark_and_equals_the_oracle(spark, settings):
    events = events_for(CLEAN, flag_every=7)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])
    engine, run, lines = python_engine(spark, settings, max_offsets_per_trigger=150)
    assert engine.handed_over == 0, "\n".join(line for line in lines if "Spark" in line)
    assert run.batches >= 3 and run.input_rows == len(events)
    assert_matches_oracle(spark, settings, events)
    assert delta(spark, settings, ARCHIVE_TABLE).count() == len(events)
    assert delta(spark, settings, DEAD_LETTER_TABLE).count() == 0

    # The same checkpoint, taken on by the Spark engine: nothing to do, nothing changes.
    before = {m.name: table_rows(spark, settings, m) for m in read_models.select(None)}
    again = Projection(spark, settings, log=lambda *_: None).run_until_caught_up()
    assert again.input_rows == 0
    assert {m.name: table_rows(spark, settings, m) for m in read_models.select(None)} == before


def test_batches_off_the_common_path_go_to_spark_and_the_engine_goes_on_after(spark, settings):
    events = events_for(GeneratorConfig(accounts=30, commands=400, seed=5, run_id="pym", late_rate=0.0),
                        flag_every=7)
    values = [(e.aggregate_id, e.to_json()) for e in events]
    third = len(values) // 3
    publish(settings, values[:third])
    engine, first, _ = python_engine(spark, settings, max_offsets_per_trigger=100)
    assert engine.handed_over == 0 and first.batches >= 2
    # Written around the handler: a record that is not an event, a replay of an earlier event, and one event
    # held back (its successors come first: a version gap until it arrives).
    held_back = values[third + 5]
    messy = [*values[third:third + 5], ("acc-pym-00001", b"{this is not an event"), values[3],
             *values[third + 6:2 * third], held_back]
    publish(settings, messy)
    engine, _, lines = python_engine(spark, settings, max_offsets_per_trigger=100)
    assert engine.handed_over >= 1
    assert any("goes to the Spark engine: 1 record(s) that are not valid events (partition" in line
               for line in lines), "\n".join(lines)
    publish(settings, values[2 * third:])
    engine, last, _ = python_engine(spark, settings, max_offsets_per_trigger=100)
    assert engine.handed_over == 0 and last.input_rows == len(values) - 2 * third
    assert_matches_oracle(spark, settings, events)
    dead = delta(spark, settings, DEAD_LETTER_TABLE).collect()
    assert [d["raw_value"] for d in dead] == ["{this is not an event"]
    assert delta(spark, settings, ARCHIVE_TABLE).count() == len(events) + 1  # the replay is archived too


def test_the_engines_take_over_from_each_other_on_one_checkpoint(spark, settings):
    events = events_for(CLEAN, flag_every=5)
    values = [(e.aggregate_id, e.to_json()) for e in events]
    third = len(values) // 3
    publish(settings, values[:third])
    python_engine(spark, settings, max_offsets_per_trigger=200)
    publish(settings, values[third:2 * third])
    Projection(spark, settings, log=lambda *_: None).run_until_caught_up(max_offsets_per_trigger=200)
    publish(settings, values[2 * third:])
    engine, run, _ = python_engine(spark, settings, max_offsets_per_trigger=200)
    assert engine.handed_over == 0 and run.input_rows == len(values) - 2 * third
    assert_matches_oracle(spark, settings, events)
    assert delta(spark, settings, ARCHIVE_TABLE).count() == len(events)
