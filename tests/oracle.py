"""Compare every read model table with the plain-Python fold of the same events."""
from __future__ import annotations

import read_models
from projection_core.reference import ReferenceTables
from read_models.catalog import Catalog, late_events_sources
from read_models.sequence import sequence
from read_models.spec import WINDOWED_SUM


def table_rows(spark, settings, model) -> dict[tuple, dict]:
    """The rows of the model's current generation (read_models/catalog.py)."""
    rows = spark.read.format("delta").load(str(Catalog(settings).current(model.name).table)).collect()
    return {tuple(r[k] for k in model.key): r.asDict() for r in rows}


def late_not_reprocessed(spark, settings, model) -> set[str]:
    """Ids of the events the windowed model recorded in late_events and has not reprocessed since."""
    late = spark.read.format("delta").load(str(Catalog(settings).current(model.name).late_events))
    rows = late.filter(late.read_model == model.name).collect()
    return {r["event_id"] for r in rows if not ("reprocessed_at" in r and r["reprocessed_at"] is not None)}


def late_count(spark, settings) -> int:
    """Rows of the logical late_events: the current generations' late events."""
    total = 0
    for path, names in late_events_sources(Catalog(settings).current_all()):
        late = spark.read.format("delta").load(str(path))
        total += late.filter(late.read_model.isin(*names)).count()
    return total


def assert_matches_oracle(spark, settings, events, models=None) -> None:
    """Every table equals its model's fold of the events the sequence rule admits (read_models.sequence), with
    the reference tables of the home as they are now (dim_merchant: as of each event's time)."""
    admitted = sequence(events).admitted
    reference = ReferenceTables(settings)
    for model in models or read_models.select(None):
        rows = reference.rows(model.reference_tables)
        actual = table_rows(spark, settings, model)
        if model.merge_strategy == WINDOWED_SUM:
            # The table holds every admitted event of the model once, except the late ones it recorded in
            # late_events instead (and has not reprocessed since): nothing lost, nothing counted twice.
            late = late_not_reprocessed(spark, settings, model)
            mine = {e.event_id for e in admitted if e.event_type in model.event_types}
            assert late <= mine, f"{model.name}: late events that are not admitted events of its types"
            expected = model.expected_rows([e for e in admitted if e.event_id not in late], rows)
            actual = {k: {c: row[c] for c in expected[k]} if k in expected else row for k, row in actual.items()}
        else:
            expected = model.expected_rows(admitted, rows)
        assert len(actual) == len(expected), f"{model.name}: {len(actual)} rows, oracle has {len(expected)}"
        diff = [k for k in expected if actual.get(k) != expected[k]]
        assert not diff, f"{model.name}: {len(diff)} rows differ, e.g. {diff[0]}: {actual.get(diff[0])} != " \
                         f"{expected[diff[0]]}"
