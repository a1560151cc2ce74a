"""Generations on the real broker and real Spark + Delta: after a switch every reader (eventlake query on both
engines, eventlake check, the reconciliation, eventlake status) and the running projection use the new generation;
after eventlake rollback they use the old one again; a stale switch is refused."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from eventlake import cli
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb
from expectations.reconciliation import reconcile
from read_models.catalog import Catalog, CatalogRefused
from spark_apps.projection import Projection
from spark_apps.status import render
from tests.domain_helpers import events_for
from tests.integration.test_projection import publish
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
ROOT = str(Path(__file__).resolve().parents[2])


def run_cli(settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVENTLAKE_HOME": str(settings.home), "PYTHONPATH": ROOT,
           "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix}
    env.pop("EVENTLAKE_CONFIG", None)
    return subprocess.run([EVENTLAKE, *args], env=env, capture_output=True, text=True, timeout=300)


def accounts_in(generation) -> set[str]:
    return set(DeltaTable(str(generation.table)).to_pyarrow_table(columns=["account_id"])["account_id"].to_pylist())


def run_live_until(projection: Projection, done, what: str) -> None:
    """Wait (bounded) for the running projection to reach ``done()``, failing on the query's own error."""
    deadline = time.monotonic() + 300
    while not done():
        for query in projection.queries:
            assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"the running projection did not get there: {what}"
        time.sleep(0.5)


def test_readers_and_the_running_projection_follow_switch_and_rollback(spark, settings, monkeypatch, capsys):
    events = events_for(GeneratorConfig(accounts=24, commands=300, seed=9, run_id="gen"), flag_every=5)
    accounts = sorted({e.aggregate_id for e in events})
    parts = [set(accounts[:8]), set(accounts[8:16]), set(accounts[16:])]
    logs: list[str] = []
    live = Projection(spark, settings.replace(trigger_interval="1 second"), log=logs.append)

    def publish_part(i: int) -> None:
        publish(settings, [(e.aggregate_id, e.to_json()) for e in events if e.aggregate_id in parts[i]])

    publish_part(0)
    project_in_python(spark, settings)  # the starting tables; the running projection below is Spark's
    catalog = Catalog(settings)
    g1 = catalog.current("account_summary")
    assert g1.number == 1 and accounts_in(g1) == parts[0]

    # Generation 2: a copy of generation 1 (the real rebuild is another step) with one visible mark.
    g2 = catalog.create_next("account_summary", by="test", reason="a copy with a marked row")
    shutil.copytree(g1.table, g2.table)
    marked = sorted(parts[0])[0]
    spark.sql(f"UPDATE delta.`{g2.table}` SET customer_id = 'cust-of-g2' WHERE account_id = '{marked}'")
    sql = f"SELECT customer_id FROM account_summary WHERE account_id = '{marked}'"
    original = query_duckdb(settings, sql)[1][0][0]
    assert original != "cust-of-g2"

    live.start()
    try:
        stale = Catalog(settings)
        stale.current("account_summary")  # a reader that saw generation 1 current
        catalog.switch("account_summary", 2, expected_current=1, by="test", reason="checks passed")
        with pytest.raises(CatalogRefused, match="current generation is 2, not 1"):
            stale.switch("account_summary", 2, expected_current=1, by="other", reason="a stale switch")

        # The running projection writes generation 2 from its next batch, without a restart, and generation 1
        # beside it: the rollback target is kept complete (a rollback is one commit to a whole table).
        publish_part(1)
        run_live_until(live, lambda: parts[1] <= accounts_in(g2) and parts[1] <= accounts_in(g1),
                       "part 2's accounts in generation 2 and in generation 1, the rollback target")
    finally:
        live.stop()

    # Every reader sees generation 2.
    result = run_cli(settings, "query", sql)
    assert result.returncode == 0 and "cust-of-g2" in result.stdout, result.stdout + result.stderr
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)
    assert cli.main(["query", "--engine", "spark", sql]) == 0
    assert "cust-of-g2" in capsys.readouterr().out
    check = run_cli(settings, "check", "account_summary")
    assert check.returncode == 0 and "_generations/account_summary/g0002/table" in check.stdout, check.stdout
    project_in_python(spark, settings)  # the archive catches up too
    differs = reconcile(settings, "account_summary")
    assert differs.compared and differs.differences == 1, differs.lines()
    assert differs.different[0][:2] == ((marked,), "customer_id"), differs.lines()
    assert "generation 2 (switched" in generation_line(settings, "account_summary")
    assert "checks passed" in run_cli(settings, "catalog", "account_summary").stdout

    # Rollback: readers and the running projection are back on generation 1.
    back = run_cli(settings, "rollback", "account_summary", "--reason", "the mark was wrong")
    assert back.returncode == 0 and "back on generation 1" in back.stdout, back.stdout + back.stderr
    assert query_duckdb(settings, sql)[1][0][0] == original
    check = run_cli(settings, "check", "account_summary")
    assert check.returncode == 0 and f"{g1.table})" in check.stdout, check.stdout
    assert "generation 1 (switched" in generation_line(settings, "account_summary")
    live = Projection(spark, settings.replace(trigger_interval="1 second"), log=logs.append)
    live.start()
    try:
        publish_part(2)
        run_live_until(live, lambda: parts[2] <= accounts_in(g1), "part 3's accounts in generation 1")
    finally:
        live.stop()
    assert not parts[2] & accounts_in(g2)
    refused = run_cli(settings, "rollback", "account_summary")
    assert refused.returncode == 1 and "no earlier generation is left" in refused.stderr, refused.stderr


def generation_line(settings, name: str) -> str:
    """``eventlake status``'s line for read model ``name`` in its generations section."""
    return next(line for line in render(settings).splitlines() if line.split()[:2] == [name, "generation"])
