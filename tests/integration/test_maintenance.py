"""The maintenance DAG (issue 9): generations beyond the last two are dropped, never the current one nor the
rollback target; the tables kept are compacted and vacuumed with a retention no shorter than Delta's default."""
import pytest
from deltalake import DeltaTable

import read_models
from eventlake.generator import GeneratorConfig
from read_models.catalog import Catalog
from spark_apps.maintenance import MaintenanceError, generations_to_drop, maintain
from projection_core.rebuild_lock import RebuildLock
from spark_apps.rebuild import rebuild
from tests.domain_helpers import events_for
from tests.integration.test_dags import dags_test, output
from tests.integration.test_rebuild import project, publish
from tests.oracle import assert_matches_oracle

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

NAME = "account_summary"


def test_maintenance_drops_beyond_the_last_two_generations_and_rollback_still_works(spark, settings):
    events = events_for(GeneratorConfig(accounts=10, commands=150, seed=41, run_id="maint"))
    half = len(events) // 2
    publish(settings, events[:half])
    project(spark, settings)
    quiet = lambda *_: None  # noqa: E731
    assert rebuild(spark, settings, NAME, by="test", log=quiet).generation == 2
    publish(settings, events[half:])
    project(spark, settings)  # the live projection writes generation 2 and follows generation 1 (rollback target)
    assert rebuild(spark, settings, NAME, by="test", log=quiet).generation == 3
    # New accounts after the last rebuild (one file, written by the fold): the live projection's MERGE adds files.
    after = events_for(GeneratorConfig(accounts=10, commands=60, seed=42, run_id="maint-after"))
    publish(settings, after)
    project(spark, settings)
    catalog = Catalog(settings)
    state = catalog.state(NAME)
    assert (state.current, state.rollback_target()) == (3, 2) and generations_to_drop(state) == [1]
    oldest = catalog.generation(NAME, 1).table
    assert (oldest / "_delta_log").is_dir()
    # What dropping generation 1 frees: its table and its pending events' (its checkpoint is the live projection's).
    first = catalog.generation(NAME, 1)
    held = sum(f.stat().st_size for folder in (first.table, first.pending) if folder.is_dir()
               for f in folder.rglob("*") if f.is_file())

    with pytest.raises(MaintenanceError, match="below Delta's default retention of 168 hours"):
        maintain(spark, settings, NAME, retention_hours=24, log=quiet)
    with RebuildLock(settings, NAME, log=quiet):  # a rebuild running: the model is left alone
        assert "already running" in maintain(spark, settings, NAME, log=quiet).skipped
    assert 1 not in Catalog(settings).state(NAME).dropped

    proc = dags_test(settings, "maintenance")
    text = output(proc)
    assert proc.returncode == 0, text[-6000:]
    state = Catalog(settings).state(NAME)
    assert state.dropped == {1} and state.current == 3 and state.rollback_target() == 2
    assert not oldest.exists()
    assert f"maintenance: {NAME}: generation 3 is current; kept 3, 2; dropped 1; freed {held:,} bytes ({held:,} " \
           f"bytes dropped, 0 bytes vacuumed)" in text, text[-3000:]
    assert held > 0
    compacted = []
    for number in (3, 2):  # compacted (where there was something to compact) and vacuumed, Delta's default retention
        table = catalog.generation(NAME, number).table
        operations = [h["operation"] for h in DeltaTable(str(table)).history()]
        assert "VACUUM END" in operations and f"optimize {table}: " in text, operations
        assert f"vacuum {table}: 0 unreferenced file(s) older than 168h deleted" in text
        compacted.append("OPTIMIZE" in operations)
    assert any(compacted)  # generation 3: the fold's file and the projection's, compacted into one
    for other in read_models.REGISTRY:  # the models never rebuilt keep their one generation
        if other != NAME:
            assert Catalog(settings).state(other).dropped == frozenset()

    assert Catalog(settings).rollback(NAME, by="test").number == 2
    assert_matches_oracle(spark, settings, events + after, models=[read_models.get(NAME)])
