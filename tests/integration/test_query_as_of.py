"""Time travel for people: `eventlake query --as-of VERSION|TIME` reads each table as it was (at a Delta version,
or at a time: the generation the catalog served then, at its newest commit by then), the same rows on both
engines; `eventlake history NAME` lists the commits (the versions --as-of takes) and the catalog's switches."""
import time
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable, write_deltalake

from eventlake import cli
from eventlake.generator import GeneratorConfig
from eventlake.history import history
from eventlake.query import QueryError, logical_tables, parse_as_of, query_duckdb, query_spark
from lakehouse.settings import Settings
from read_models.catalog import Catalog
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded
from tests.integration.test_query_errors import run_cli

pytestmark = pytest.mark.slow

COUNT = "SELECT count(*) AS n FROM payments"


def tick() -> datetime:
    """A moment strictly between the commits before and after it (commit times are in milliseconds)."""
    time.sleep(1.1)
    moment = datetime.now(timezone.utc)
    time.sleep(1.1)
    return moment


@pytest.fixture(scope="module")
def travelled(tmp_path_factory):
    """payments: version 0 (the fold), version 1 (the first 5 rows deleted); then generation 2 switched in (3 rows).
    -> (settings, count at v0, count at v1, a time after v0, a time after v1, a time after the switch)."""
    settings = Settings(home=tmp_path_factory.mktemp("as-of-home"))
    before_anything = tick()
    write_folded(settings, events_for(GeneratorConfig(accounts=5, commands=60, seed=8, run_id="asof")))
    path = str(settings.table_path("payments"))
    v0 = DeltaTable(path).to_pyarrow_table()  # typed columns (a pandas column of nulls has no Delta type)
    after_v0 = tick()
    first = sorted(v0.column("payment_id").to_pylist())[:5]
    DeltaTable(path).delete(" OR ".join(f"payment_id = '{p}'" for p in first))
    after_v1 = tick()
    catalog = Catalog(settings)
    g2 = catalog.create_next("payments", by="test", reason="a smaller generation")
    write_deltalake(str(g2.table), v0.slice(0, 3), mode="overwrite")
    catalog.switch("payments", 2, expected_current=1, by="test", reason="checks passed")
    after_switch = tick()
    return settings, len(v0), len(v0) - 5, before_anything, after_v0, after_v1, after_switch


def count(rows) -> int:
    return rows[1][0][0]


def test_as_of_a_version_or_a_time_reads_the_table_as_it_was_on_both_engines(spark, travelled):
    settings, n0, n1, before_anything, after_v0, after_v1, after_switch = travelled
    assert count(query_duckdb(settings, COUNT)) == 3  # now: generation 2
    expected = {after_v0: n0, after_v1: n1, after_switch: 3}
    for moment, n in expected.items():
        assert count(query_duckdb(settings, COUNT, moment)) == n, moment
        assert count(query_spark(settings, COUNT, moment)) == n, moment
    # A version: of the table the name resolves to now (generation 2 has only version 0).
    assert count(query_duckdb(settings, COUNT, 0)) == 3 == count(query_spark(settings, COUNT, 0))
    # The rows, not only their number, are the same on both engines.
    sql = "SELECT payment_id, amount_minor FROM payments ORDER BY payment_id"
    assert query_duckdb(settings, sql, after_v1)[1] == [tuple(r) for r in query_spark(settings, sql, after_v1)[1]]
    # What each name resolved to.
    parts = logical_tables(settings, after_v1)["payments"]
    assert [(p.generation, p.version) for p in parts] == [(1, 1)]
    assert [(p.generation, p.version) for p in logical_tables(settings, after_switch)["payments"]] == [(2, 0)]
    # Before any table existed: said, not an empty answer.
    with pytest.raises(QueryError, match="no table under .* has "):
        query_duckdb(settings, COUNT, before_anything)
    # A version a table does not have: that table is not there to query; the others are.
    with pytest.raises(QueryError, match="payments"):
        query_duckdb(settings, COUNT, 1)


def test_the_command_line_says_what_it_read_and_refuses_a_bad_as_of(travelled, capsys):
    settings, n0, n1, _, after_v0, after_v1, _ = travelled
    result = run_cli(settings.home, "--format", "csv", "--as-of", after_v1.isoformat(), COUNT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["n", str(n1)]
    assert "as of " in result.stderr and "payments (generation 1, version 1)" in result.stderr, result.stderr
    assert parse_as_of("2026-11-24") == datetime(2026, 11, 24, tzinfo=timezone.utc)
    assert parse_as_of("2026-11-24T06:00:00+01:00") == datetime(2026, 11, 24, 5, tzinfo=timezone.utc)
    assert parse_as_of("7") == 7
    bad = run_cli(settings.home, "--as-of", "yesterday", COUNT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--as-of 'yesterday' is neither a table version" in bad.stderr


def test_history_lists_the_commits_and_the_catalogs_changes(travelled, monkeypatch, capsys):
    settings, *_ = travelled
    what, lines = history(settings, "payments", generation=1)
    commits = [(line.version, line.operation) for line in lines if line.version is not None]
    assert commits == [(1, "DELETE"), (0, "WRITE")]
    assert [line.rows for line in lines if line.version == 1] == [5]
    changes = [line.operation for line in lines if line.version is None]
    assert "catalog: generation 2 switched" in changes and "catalog: generation 2 created" in changes
    what, lines = history(settings, "payments")  # the current generation
    assert "generation 2" in what and [line.version for line in lines if line.version is not None] == [0]
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)
    assert cli.main(["history", "payments", "--generation", "1"]) == 0
    out = capsys.readouterr().out
    assert "DELETE" in out and "catalog: generation 2 switched" in out and "checks passed" in out
    assert cli.main(["history", "no_such_table"]) == 2
    assert "no table named 'no_such_table'" in capsys.readouterr().err
    assert cli.main(["history", "payments", "--generation", "9"]) == 2
    assert "has no generation 9" in capsys.readouterr().err
