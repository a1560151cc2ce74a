"""Compare every read model table with the plain-Python fold of the same events."""
from __future__ import annotations

import json
from collections import defaultdict

import read_models
from eventlake.catalog import Catalog, late_events_sources
from read_models.sequence import sequence
from read_models.spec import WINDOWED_SUM


def table_rows(spark, settings, model) -> dict[tuple, dict]:
    """The rows of the model's current generation (eventlake/catalog.py)."""
    rows = spark.read.format("delta").load(str(Catalog(settings).current(model.name).table)).collect()
    return {tuple(r[k] for k in model.key): r.asDict() for r in rows}


def windowed_with_late(spark, settings, model) -> dict[tuple, dict]:
    """The windowed table plus the late events recorded for it: nothing counted twice, nothing lost."""
    totals = defaultdict(lambda: {"payments": 0, "amount_minor": 0})
    for key, row in table_rows(spark, settings, model).items():
        totals[key]["payments"] += row["payments"]
        totals[key]["amount_minor"] += row["amount_minor"]
    late = spark.read.format("delta").load(str(Catalog(settings).current(model.name).late_events))
    for r in late.filter(late.read_model == model.name).collect():
        if "reprocessed_at" in r and r["reprocessed_at"] is not None:
            continue  # folded into its window by `eventlake reprocess`: counted in the table
        event = json.loads(r["event"])
        window = r["event_time"].replace(second=0, microsecond=0)
        totals[(event["merchant_id"], window)]["payments"] += 1
        totals[(event["merchant_id"], window)]["amount_minor"] += event["amount_minor"]
    return dict(totals)


def late_count(spark, settings) -> int:
    """Rows of the logical late_events: the current generations' late events."""
    total = 0
    for path, names in late_events_sources(Catalog(settings).current_all()):
        late = spark.read.format("delta").load(str(path))
        total += late.filter(late.read_model.isin(*names)).count()
    return total


def assert_matches_oracle(spark, settings, events, models=None) -> None:
    """Every table equals its model's fold of the events the sequence rule admits (read_models.sequence)."""
    admitted = sequence(events).admitted
    for model in models or read_models.select(None):
        expected = model.python_fold(admitted)
        if model.merge_strategy == WINDOWED_SUM:
            actual = windowed_with_late(spark, settings, model)
        else:
            actual = table_rows(spark, settings, model)
        assert len(actual) == len(expected), f"{model.name}: {len(actual)} rows, oracle has {len(expected)}"
        diff = [k for k in expected if actual.get(k) != expected[k]]
        assert not diff, f"{model.name}: {len(diff)} rows differ, e.g. {diff[0]}: {actual.get(diff[0])} != " \
                         f"{expected[diff[0]]}"
