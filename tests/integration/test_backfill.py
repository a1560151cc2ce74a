"""`eventlake backfill` (issue 46 part 2): payments projected before their merchants were loaded hold null merchant
columns and count under the unknown category; once ``dim_merchant`` knows them the reconciliation (whose oracle
joins the dimension as it is now) finds them different, and the backfill sets the payments' columns (one MERGE)
and reprocesses the closed minutes of ``category_minute_volume``. Rows of minutes still open wait (exit status 1)
and a later run, after the watermark passed them, takes them: then both tables equal the oracle. A dry run writes
nothing; a run with nothing to do changes nothing."""
from __future__ import annotations

import datetime as dt

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from expectations.reconciliation import reconcile
from lakehouse.lineage import events_file, read_events, table
from lakehouse.tables import read_table
from read_models.account.category_minute_volume import UNKNOWN_CATEGORY
from read_models.catalog import ARCHIVE_TABLE, DIM_MERCHANT_TABLE, Catalog
from read_models.enrichment import MERCHANT_COLUMNS
from read_models.sequence import sequence
from reference_data.backfill import backfill
from spark_apps.reprocess import reprocess_closed, table_watermark
from spark_apps.status import reference_lines
from tests.domain_helpers import events_for
from tests.integration.test_rebuild import publish
from tests.merchant_history import reference, write_dimension
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow

PAYMENTS = read_models.get("payments")
CATEGORIES = read_models.get("category_minute_volume")
START = dt.datetime(2026, 1, 1, 23, 0, tzinfo=dt.timezone.utc)
# About 45 minutes of event time: the watermark (the newest minus 10 minutes) leaves the last minutes open.
CFG = GeneratorConfig(accounts=12, commands=240, merchants=10, seed=46, run_id="backfill", late_rate=0.0,
                      mean_interval_s=12, start=START)
# Later payments of other accounts: the watermark passes every minute of the first run.
LATER = GeneratorConfig(accounts=2, commands=8, merchants=10, seed=47, run_id="backfill-later", late_rate=0.0,
                        start=START + dt.timedelta(hours=2))


def _rows(settings, model) -> dict[tuple, dict]:
    rows = read_table(Catalog(settings).current(model.name).table).to_pylist()
    return {tuple(r[k].replace(tzinfo=None) if isinstance(r[k], dt.datetime) else r[k] for k in model.key): r
            for r in rows}


def _merchant(row: dict) -> dict:
    return {c: row[c] for c in MERCHANT_COLUMNS.values()}


def test_payments_projected_before_their_merchants_were_loaded_are_backfilled_and_their_minutes_reprocessed(
        spark, settings):
    first = events_for(CFG)
    publish(settings, first)
    project_in_python(spark, settings, [PAYMENTS, CATEGORIES], archive=True)
    assert all(_merchant(r) == dict.fromkeys(MERCHANT_COLUMNS.values()) for r in _rows(settings, PAYMENTS).values())
    assert {k[0] for k in _rows(settings, CATEGORIES)} == {UNKNOWN_CATEGORY}

    # The dimension learns the merchants (every case of the as-of join, tests/merchant_history.py).
    write_dimension(settings, first)
    dimension = reference(first)
    expected = PAYMENTS.expected_rows(sequence(first).admitted, dimension)
    differing = sum(1 for k, row in _rows(settings, PAYMENTS).items() if _merchant(row) != _merchant(expected[k]))
    assert differing and reconcile(settings, "payments").differences == differing
    total = len(_rows(settings, PAYMENTS))
    assert reference_lines(settings) == [f"payments: {total:,} row(s) without their merchant; {differing:,} differ "
                                         f"from the reference data now (dim_merchant version 0); eventlake backfill "
                                         f"sets them"]

    version = Catalog(settings).current("payments").table
    before = read_table(version).num_rows
    dry = backfill(settings, dry_run=True, log=lambda *_: None)
    assert dry.stale == {"payments": differing} and not dry.updated and not dry.windows
    assert _merchant(next(iter(_rows(settings, PAYMENTS).values()))) == dict.fromkeys(MERCHANT_COLUMNS.values())
    assert read_table(version).num_rows == before

    def reprocess(name, start, end):
        return reprocess_closed(spark, settings, name, start, end, log=lambda *_: None)

    lines: list[str] = []
    done = backfill(settings, reprocess=reprocess, log=lines.append)
    closed = table_watermark(spark, CATEGORIES, str(Catalog(settings).current(CATEGORIES.name).table))
    closed = closed.replace(second=0, microsecond=0, tzinfo=None)
    payments = _rows(settings, PAYMENTS)
    waiting = [k for k, row in payments.items() if row["occurred_at"].replace(tzinfo=None) >= closed]
    assert waiting and not done.complete, lines  # the newest minutes are open: their rows wait
    for key, row in payments.items():
        if key in waiting:
            assert _merchant(row) == dict.fromkeys(MERCHANT_COLUMNS.values()), key
        else:
            assert _merchant(row) == _merchant(expected[key]), key
    categories = CATEGORIES.expected_rows(sequence(first).admitted, dimension)
    stored = _rows(settings, CATEGORIES)
    for key, row in categories.items():
        if key[1] < closed:
            assert (stored[key]["payments"], stored[key]["amount_minor"]) == (row["payments"], row["amount_minor"])
    assert done.updated["payments"] == differing - done.waiting["payments"] > 0
    assert done.windows["category_minute_volume"] > 0, lines
    # Its OpenLineage run (none for the dry run): the dimension and the archive in, the two tables out.
    [start, end] = [e for e in read_events(events_file(settings)) if e["job"]["name"] == "backfill"]
    assert (start["eventType"], end["eventType"]) == ("START", "COMPLETE")
    assert [i["name"] for i in start["inputs"]] == [table(settings.table_path(n)).name
                                                    for n in (DIM_MERCHANT_TABLE, ARCHIVE_TABLE)]
    assert [o["name"] for o in start["outputs"]] == [table(Catalog(settings).current(m.name).table).name
                                                     for m in (PAYMENTS, CATEGORIES)]

    # Later payments move the watermark past every minute of the first run: the next backfill takes the rest.
    later = events_for(LATER)
    publish(settings, later)
    project_in_python(spark, settings, [PAYMENTS, CATEGORIES], archive=True)
    assert backfill(settings, reprocess=reprocess, log=lambda *_: None).complete
    for name in ("payments", "category_minute_volume"):
        checked = reconcile(settings, name)
        assert checked.success and not checked.differences, checked.lines()
    again = backfill(settings, reprocess=reprocess, log=lambda *_: None)
    assert again.stale == {"payments": 0} and not again.updated and again.complete
    assert "; 0 differ from the reference data now" in reference_lines(settings)[0]
