"""The catalog's rules on a real Delta table (delta-rs, no Spark, no Kafka): fold, compare-and-set, rollback, drop."""
from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakehouse.settings import Settings
from read_models.catalog import Catalog, CatalogError, CatalogRefused


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.load({}).replace(home=tmp_path / "home")


def test_without_rows_generation_1_is_the_old_layout_and_reading_writes_nothing(settings):
    catalog = Catalog(settings)
    g = catalog.current("account_summary")
    assert (g.number, g.table, g.pending) == (1, settings.warehouse / "account_summary",
                                              settings.warehouse / "_pending" / "account_summary")
    assert g.late_events == settings.warehouse / "late_events" and g.late_events_shared
    assert not catalog.path.exists()


def test_create_switch_rollback(settings):
    catalog = Catalog(settings)
    g2 = catalog.create_next("payments", by="ana", reason="rebuild")
    assert g2.number == 2 and "_generations/payments/g0002" in str(g2.table) and not g2.late_events_shared
    assert g2.checkpoint.is_dir() and g2.checkpoint != catalog.current("payments").checkpoint
    assert catalog.current("payments").number == 1  # created, not serving
    catalog.switch("payments", 2, expected_current=1, by="ana", reason="checks passed")
    assert catalog.current("payments").number == 2
    assert Catalog(settings).current("payments").table == g2.table  # another reader sees it too
    assert catalog.current("account_summary").number == 1  # other names untouched
    back = catalog.rollback("payments", by="bo", reason="wrong totals")
    assert back.number == 1 and back.table == settings.warehouse / "payments"
    with pytest.raises(CatalogRefused, match="no earlier generation"):
        catalog.rollback("payments", by="bo")
    actions = [(e.generation, e.action, e.previous) for e in catalog.history("payments")]
    assert actions == [(1, "created", None), (2, "created", None), (2, "switched", 1), (1, "switched", 2)]
    assert [e.seq for e in catalog.history("payments")] == [1, 1, 2, 3]


def test_rollback_skips_generations_that_never_served(settings):
    catalog = Catalog(settings)
    catalog.create_next("payments", by="a", reason="r")
    catalog.switch("payments", 2, 1, by="a", reason="ok")
    catalog.create_next("payments", by="a", reason="a rebuild whose checks failed")  # 3: never switched
    catalog.create_next("payments", by="a", reason="r")
    catalog.switch("payments", 4, 2, by="a", reason="ok")
    assert catalog.rollback("payments", by="a").number == 2
    assert catalog.rollback("payments", by="a").number == 1


def test_a_stale_switch_is_refused(settings):
    first, second = Catalog(settings), Catalog(settings)
    first.create_next("payments", by="a", reason="r")
    first.create_next("payments", by="b", reason="r")
    first.switch("payments", 2, expected_current=1, by="a", reason="first")
    with pytest.raises(CatalogRefused, match="current generation is 2, not 1"):
        second.switch("payments", 3, expected_current=1, by="b", reason="second, stale")
    assert second.current("payments").number == 2
    with pytest.raises(CatalogRefused, match="no generation 9"):
        first.switch("payments", 9, expected_current=2, by="a", reason="x")
    with pytest.raises(CatalogError, match="unknown read model 'nope'"):
        first.current("nope")


def test_concurrent_switches_one_wins(settings):
    """Writers racing from the same state: the Delta txn conflict serialises them, so exactly one switch from
    generation 1 commits and the others are refused as stale."""
    catalog = Catalog(settings)
    for _ in range(4):
        catalog.create_next("payments", by="a", reason="r")
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def switch(number: int) -> None:
        start.wait()
        try:
            Catalog(settings).switch("payments", number, expected_current=1, by=f"w{number}", reason="race")
            outcomes.append("switched")
        except CatalogRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=switch, args=(n,)) for n in (2, 3, 4, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 3 + ["switched"]
    switches = [e for e in catalog.history("payments") if e.action == "switched"]
    assert len(switches) == 1 and switches[0].previous == 1


def test_a_commit_built_on_a_stale_snapshot_is_rejected_by_delta(settings):
    """What the serialisation rests on: a catalog commit carries the catalog's Delta app transaction, and delta-rs
    refuses one built on a snapshot that another catalog commit has passed."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    catalog = Catalog(settings)
    catalog.create_next("payments", by="a", reason="r")
    stale = DeltaTable(str(catalog.path))
    catalog.switch("payments", 2, 1, by="a", reason="ok")
    row = pa.Table.from_pylist([{"seq": 3, "name": "payments", "generation": 1, "action": "switched"}])
    with pytest.raises(CommitFailedError):
        write_deltalake(stale, row, mode="append", schema_mode="merge",
                        commit_properties=CommitProperties(app_transactions=[Transaction("eventlake-catalog", 3)]))


def test_drop_never_the_current_and_deletes_files(settings):
    catalog = Catalog(settings)
    g2 = catalog.create_next("payments", by="a", reason="r")
    (g2.table / "_delta_log").mkdir(parents=True)
    with pytest.raises(CatalogRefused, match="generation 1 is current"):
        catalog.drop("payments", 1, by="a")
    catalog.switch("payments", 2, 1, by="a", reason="ok")
    with pytest.raises(CatalogRefused, match="is current"):
        catalog.drop("payments", 2, by="a")
    catalog.create_next("payments", by="a", reason="r")
    g3 = catalog.switch("payments", 3, 2, by="a", reason="ok")
    (g2.table / "part-0.parquet").write_bytes(b"x" * 1000)  # its files, and its own checkpoint's
    g2.checkpoint.mkdir(parents=True, exist_ok=True)
    (g2.checkpoint / "metadata").write_bytes(b"y" * 24)
    freed: list[int] = []
    catalog.drop("payments", 2, by="maintenance", freed=freed)
    assert freed == [1024]
    assert not g2.table.exists() and not g2.checkpoint.exists() and g3.checkpoint.exists()
    assert [g.number for g in catalog.generations("payments")] == [1, 3]
    assert catalog.rollback("payments", by="a").number == 1  # the dropped one is skipped
    with pytest.raises(CatalogRefused, match="was dropped"):
        catalog.switch("payments", 2, 1, by="a", reason="x")


def test_drop_generation_1_deletes_only_its_late_events_and_keeps_the_live_checkpoint(settings):
    catalog = Catalog(settings)
    g1 = catalog.current("merchant_minute_volume")
    write_deltalake(str(g1.late_events), pa.table({"read_model": ["merchant_minute_volume", "other"],
                                                   "event_id": ["e1", "e2"]}))
    g1.checkpoint.mkdir(parents=True)
    catalog.create_next("merchant_minute_volume", by="a", reason="r")
    catalog.switch("merchant_minute_volume", 2, 1, by="a", reason="ok")
    catalog.drop("merchant_minute_volume", 1, by="a")
    assert DeltaTable(str(g1.late_events)).to_pyarrow_table()["read_model"].to_pylist() == ["other"]
    assert g1.checkpoint.is_dir()


def test_positions_are_recorded(settings):
    catalog = Catalog(settings)
    g2 = catalog.create_next("payments", by="rebuild", reason="r", position={0: 10, 1: 7})
    assert g2.position == {0: 10, 1: 7}
    assert catalog.record_position("payments", 2, {0: 12, 1: 9}, by="rebuild").position == {0: 12, 1: 9}
    assert catalog.current("payments").position is None


def test_query_reads_the_current_generations_and_late_events_as_their_union(settings):
    """eventlake query's names resolve through the catalog (DuckDB over delta-rs; no Spark needed)."""
    from eventlake.query import query_duckdb

    catalog = Catalog(settings)
    g1 = catalog.current("merchant_minute_volume")
    write_deltalake(str(g1.table), pa.table({"merchant_id": ["m-old"]}))
    write_deltalake(str(g1.late_events), pa.table({"read_model": ["merchant_minute_volume", "payments"],
                                                   "event_id": ["late-in-g1", "not-a-windowed-model"]}))
    g2 = catalog.create_next("merchant_minute_volume", by="a", reason="r")
    write_deltalake(str(g2.table), pa.table({"merchant_id": ["m-new"]}))
    write_deltalake(str(g2.late_events), pa.table({"read_model": ["merchant_minute_volume"],
                                                   "event_id": ["late-in-g2"]}))

    def read() -> tuple:
        return (query_duckdb(settings, "SELECT merchant_id FROM merchant_minute_volume")[1],
                query_duckdb(settings, "SELECT event_id FROM late_events")[1])

    assert read() == ([("m-old",)], [("late-in-g1",)])
    catalog.switch("merchant_minute_volume", 2, 1, by="a", reason="ok")
    assert read() == ([("m-new",)], [("late-in-g2",)])
    catalog.rollback("merchant_minute_volume", by="a")
    assert read() == ([("m-old",)], [("late-in-g1",)])
