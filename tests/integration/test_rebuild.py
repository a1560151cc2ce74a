"""`eventlake rebuild` (issue 9): a new generation folded from the archive, caught up from Kafka, checked and
switched to; the live projection then writes it and keeps the previous one up to date for a rollback."""
import json
import os

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from read_models.catalog import ARCHIVE_TABLE, Catalog
from spark_apps.projection import Projection
from projection_core.rebuild_errors import RebuildRefused
from projection_core.rebuild_lock import lock_path
from spark_apps.rebuild import rebuild
from tests.domain_helpers import events_for
from tests.oracle import assert_matches_oracle, late_count
from tests.projecting import project_in_python, publish_events as publish

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=20, commands=300, seed=17, run_id="rebuild", late_rate=0.05)
REBUILT = ("account_summary", "merchant_minute_volume")


def project(spark, settings):
    Projection(spark, settings, log=lambda *_: None).run_until_caught_up(max_offsets_per_trigger=200)


def test_a_rebuild_switches_to_a_checked_generation_and_a_rollback_finds_the_old_one_up_to_date(spark, settings):
    events = events_for(CFG, flag_every=9)
    first, rest = events[: len(events) * 2 // 3], events[len(events) * 2 // 3:]
    publish(settings, first + first[:50])  # some duplicates too
    project(spark, settings)
    assert late_count(spark, settings) > 0  # windows closed before some events came: what a rebuild folds back in
    # More events in the log than in the archive and the tables: the rebuild catches them up from Kafka.
    publish(settings, rest[:40])

    lines = []
    for name in REBUILT:
        outcome = rebuild(spark, settings, name, by="test", reason="fold late events back in", log=lines.append)
        assert outcome.switched and (outcome.previous, outcome.generation) == (1, 2), lines
        assert outcome.caught_up_events >= 40 and outcome.fold.events > 0
    assert any("[3/3] merchant_minute_volume" in line for line in lines)  # progress by step
    catalog = Catalog(settings)
    # Each rebuild's OpenLineage run (lakehouse.lineage): the archive and the events topic in, the generation out.
    from lakehouse.lineage import events_file, read_events

    runs = {}
    for event in read_events(events_file(settings)):
        if event["job"]["name"].startswith("rebuild."):
            runs.setdefault(event["job"]["name"], []).append(event)
    assert {name: [e["eventType"] for e in ran] for name, ran in runs.items()} == {
        f"rebuild.{name}": ["START", "COMPLETE"] for name in REBUILT}
    for name in REBUILT:
        start = runs[f"rebuild.{name}"][0]
        assert [i["name"] for i in start["inputs"]] == [str(settings.table_path(ARCHIVE_TABLE)), settings.events_topic]
        assert [o["name"] for o in start["outputs"]] == [str(catalog.generation(name, 2).table)]
    assert {n: catalog.current(n).number for n in read_models.REGISTRY} == {
        n: 2 if n in REBUILT else 1 for n in read_models.REGISTRY}
    logged = first + rest[:40]
    assert_matches_oracle(spark, settings, logged, models=[read_models.get(n) for n in REBUILT])
    # Every late event of the archive is folded into its window; late ones now are only events the catch-up
    # met after their window had closed.
    late = spark.read.format("delta").load(str(catalog.current("merchant_minute_volume").late_events))
    assert {r["event_id"] for r in late.collect()} <= {e.event_id for e in rest[:40]}

    # The live projection goes on: it writes the new generations, and the old ones beside them (rollback targets).
    # The Python engine (eventlake project's default) does it on its own path: the versions the rebuild's catch-up
    # already applied to the new generations are dropped, as the Spark engine drops them, not handed to Spark.
    publish(settings, rest[40:])
    said = []
    project_in_python(spark, settings, log=said.append)
    assert not [line for line in said if "goes to the Spark engine" in line], said
    assert_matches_oracle(spark, settings, events)
    for name in REBUILT:
        assert catalog.rollback(name, by="test", reason="compare").number == 1
    assert_matches_oracle(spark, settings, events)  # generation 1 is complete: nothing missing after the switch


def test_a_second_rebuild_of_a_model_at_once_is_refused_and_a_dead_ones_lock_is_taken_over(spark, settings):
    events = events_for(GeneratorConfig(accounts=5, commands=60, seed=3, run_id="lock"))
    publish(settings, events)
    project_in_python(spark, settings)  # a clean log: the starting tables need no Spark batch (tests/projecting.py)
    lock = lock_path(settings, "payments")
    lock.parent.mkdir(parents=True, exist_ok=True)
    import socket

    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-11-23T10:00:00Z"}))
    with pytest.raises(RebuildRefused, match=rf"already running \(pid {os.getpid()}"):
        rebuild(spark, settings, "payments", log=lambda *_: None)
    assert Catalog(settings).current("payments").number == 1 and lock.exists()

    # A rebuild killed with kill -9 left its lock and a generation it never switched to.
    lock.write_text(json.dumps({"pid": 2 ** 22 + 7, "host": socket.gethostname(), "started": "2026-11-23T10:00:00Z"}))
    Catalog(settings).create_next("payments", by="killed", reason="a rebuild that was killed")
    lines = []
    outcome = rebuild(spark, settings, "payments", log=lines.append)
    assert outcome.switched and outcome.generation == 3 and not lock.exists()
    assert any("taking over" in line for line in lines) and any("left unfinished" in line for line in lines)
    assert 2 in Catalog(settings).state("payments").dropped
    assert_matches_oracle(spark, settings, events, models=[read_models.get("payments")])
