"""The registry's contract with the engines, on the shared broker and Spark session (slow): over a small generated
log of every domain (the unit contract suite's, ``tests/unit/test_read_model_contracts.py``) and a merchants
dimension with every case of the as-of join, the Python engine and the Spark engine, each into a home of its own,
give every read model the oracle's rows, so the same rows; and a
batch whose table writes committed but whose commit-log entry did not (the entries removed from Structured
Streaming's commit logs, as a crash between the two leaves them) is replayed on purpose by each engine and counts
once. Both engines run as ``eventlake project --until-caught-up`` runs them (``spark_apps.projection.project``).
"""
from __future__ import annotations

import pytest

import read_models
from read_models.catalog import ARCHIVE_TABLE
from spark_apps.projection import project
from tests.integration.test_projection import delta, publish
from tests.merchant_history import write_dimension
from tests.oracle import assert_matches_oracle, table_rows
from tests.unit.test_read_model_contracts import LOG

pytestmark = pytest.mark.slow

PER_BATCH = 160  # three batches or so of the log's ~450 events
ENGINES = ("python", "spark")


def _commit_logs(settings) -> list:
    """The commit logs of the projection's checkpoints (Structured Streaming's, kept by both engines): the read
    models' query and the archive's."""
    return sorted(settings.checkpoints.glob("projection-*/commits"))


def _committed(settings) -> dict[str, list[int]]:
    """Per checkpoint, the batch ids its commit log holds."""
    return {log.parent.name: sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())
            for log in _commit_logs(settings)}


def _lose_the_last_commits(settings) -> None:
    """Remove the newest entry of every commit log (and its checksum): each one's last batch has its table writes
    committed and its commit not, as after a crash between the two."""
    for log in _commit_logs(settings):
        last = max(int(p.name) for p in log.iterdir() if p.name.isdigit())
        (log / str(last)).unlink()
        (log / f".{last}.crc").unlink(missing_ok=True)


def _project(settings, engine: str) -> None:
    """``eventlake project --engine ENGINE --until-caught-up`` in this process (the shared Spark session)."""
    assert project(settings, [], until_caught_up=True, engine=engine) == 0


def _rows(spark, settings) -> dict[str, dict]:
    return {m.name: table_rows(spark, settings, m) for m in read_models.select(None)}


def test_both_engines_give_every_model_the_oracles_rows(spark, settings, tmp_path):
    settings = settings.replace(max_offsets_per_trigger=PER_BATCH)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in LOG])
    # Each engine, from the same log into a home of its own: every model equals the oracle, so the engines agree.
    other = settings.replace(home=tmp_path / "spark-home")
    # The merchants dimension payments are joined with as of their time (every case: tests/merchant_history.py).
    for home in (settings, other):
        write_dimension(home, LOG)
    _project(settings, "python")
    _project(other, "spark")
    for home in (settings, other):
        assert_matches_oracle(spark, home, LOG)
        assert delta(spark, home, ARCHIVE_TABLE).count() == len(LOG)
        assert all(_rows(spark, home).values()), "a read model without rows: the log must give every model some"
        _assert_lineage(home)


def _assert_lineage(settings) -> None:
    """The projection's OpenLineage run (the file transport under the home), the same from either engine: the
    events topic in; every read model's table, the archive and the dead letters out."""
    from lakehouse.lineage import events_file, read_events, table
    from read_models.catalog import DEAD_LETTER_TABLE, DIM_MERCHANT_TABLE, Catalog

    [start, end] = read_events(events_file(settings))
    assert (start["eventType"], end["eventType"], start["run"]["runId"]) == ("START", "COMPLETE", end["run"]["runId"])
    names = [m.name for m in read_models.select(None)]
    assert start["job"]["name"] == "projection." + "+".join(names + [ARCHIVE_TABLE])
    # The events topic, and dim_merchant (payments and category_minute_volume join it as of each event's time).
    assert [d["name"] for d in start["inputs"]] == [settings.events_topic,
                                                    table(settings.table_path(DIM_MERCHANT_TABLE)).name]
    outputs = {d["name"] for d in start["outputs"]}
    catalog = Catalog(settings)
    tables = [table(catalog.current(n).table).name for n in names]
    tables += [table(settings.table_path(n)).name for n in (ARCHIVE_TABLE, DEAD_LETTER_TABLE)]
    assert set(tables) <= outputs, sorted(set(tables) - outputs)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_whose_commit_was_lost_is_replayed_on_purpose_and_counts_once(spark, settings, engine):
    settings = settings.replace(max_offsets_per_trigger=PER_BATCH)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in LOG])
    _project(settings, "python")  # the faster engine makes the tables; ``engine`` replays
    batches = _committed(settings)
    assert len(batches) == 2 and all(len(ids) >= 2 for ids in batches.values()), batches
    before = _rows(spark, settings)
    # The last batch's commit lost, the engine runs that batch again on the checkpoint (its offsets are in the
    # offset log) and it counts once: every table as before (windowed sums not doubled, no row inserted twice),
    # the archive holding each event once.
    _lose_the_last_commits(settings)
    assert _committed(settings) != batches
    _project(settings, engine)
    assert _committed(settings) == batches  # the lost batches ran again, and only they
    assert _rows(spark, settings) == before
    assert delta(spark, settings, ARCHIVE_TABLE).count() == len(LOG)
    assert_matches_oracle(spark, settings, LOG)
