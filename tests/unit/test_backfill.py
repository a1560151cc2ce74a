"""The backfill's parts that need no broker and no Spark (reference_data/backfill.py): which minutes share a
reprocess, and a payments table written by a release before the merchant columns (no crash, a clear line, nothing
written; ``eventlake status`` counts its rows as without their merchant). The whole backfill, with the projection
and the reprocess, is tests/integration/test_backfill.py's."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
from deltalake import write_deltalake

import read_models
from eventlake.generator import GeneratorConfig
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from projection_core.reference import ReferenceTables
from read_models.catalog import Catalog
from read_models.enrichment import MERCHANT_COLUMNS
from read_models.sequence import sequence
from reference_data.backfill import backfill, ranges, stale_rows
from spark_apps.arrow_rows import arrow_schema
from spark_apps.status import reference_lines
from tests.domain_helpers import events_for
from tests.merchant_history import reference, write_dimension

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
MINUTE = dt.timedelta(minutes=1)


def test_minutes_closer_than_the_gap_share_a_range_and_each_range_ends_after_its_last_minute():
    minutes = [T + 3 * MINUTE, T, T + MINUTE, T + 30 * MINUTE, T + MINUTE]
    assert ranges(minutes) == [(T, T + 4 * MINUTE), (T + 30 * MINUTE, T + 31 * MINUTE)]
    assert ranges(minutes, gap=MINUTE) == [(T, T + 2 * MINUTE), (T + 3 * MINUTE, T + 4 * MINUTE),
                                                (T + 30 * MINUTE, T + 31 * MINUTE)]
    assert ranges([]) == []


def test_a_payments_table_of_an_older_release_without_the_merchant_columns_is_left_for_the_projection(tmp_path):
    settings = Settings(home=tmp_path)
    events = events_for(GeneratorConfig(accounts=4, commands=40, merchants=10, seed=3, run_id="old"))
    payments = read_models.get("payments")
    schema = arrow_schema(payments.schema())
    old = pa.schema([f for f in schema if f.name not in MERCHANT_COLUMNS.values()])
    rows = [{**dict(zip(payments.key, k)), **r} for k, r in payments.expected_rows(sequence(events).admitted).items()]
    path = Catalog(settings).current("payments").table
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=old).select(old.names))
    write_dimension(settings, events)
    expected = payments.expected_rows(sequence(events).admitted, reference(events))
    known = sum(1 for r in expected.values() if r["merchant_name"] is not None)

    stale = stale_rows(delta_table(path), payments, ReferenceTables(settings))
    assert stale.num_rows == known  # the columns it lacks read as null
    lines: list[str] = []
    result = backfill(settings, log=lines.append)
    assert not result.updated and delta_table(path).version() == 0, lines
    assert any("has no merchant_name, merchant_category, merchant_risk yet" in line for line in lines), lines
    assert reference_lines(settings) == [f"payments: {len(rows):,} row(s) without their merchant; {known:,} differ "
                                         f"from the reference data now (dim_merchant version 0); eventlake backfill "
                                         f"sets them"]


def test_a_backfill_after_a_complete_one_compares_only_the_new_files_and_the_changed_merchants(tmp_path):
    """What a run reads follows what changed since the last complete run, not the table's size, and it finds every
    row a whole read finds: new rows (a new file) and the older rows of a merchant the dimension changed."""
    from deltalake import write_deltalake as write

    from read_models.enrichment import MERCHANT_TABLE
    from reference_data.merchants import dimension_schema
    from tests.merchant_history import dimension_rows

    settings = Settings(home=tmp_path)
    events = events_for(GeneratorConfig(accounts=6, commands=80, merchants=10, seed=5, run_id="scope"))
    admitted = sequence(events).admitted
    payments = read_models.get("payments")
    schema = arrow_schema(payments.schema())

    def unjoined(part):  # payments as a projection writes them before the dimension knows their merchants
        rows = [{**dict(zip(payments.key, k)), **r} for k, r in payments.expected_rows(part).items()]
        return pa.Table.from_pylist(rows, schema=schema).select(schema.names)

    path = Catalog(settings).current("payments").table
    first, later = admitted[: len(admitted) // 2], admitted[len(admitted) // 2:]
    write(str(path), unjoined(first))
    write_dimension(settings, events)

    def run():
        whole = stale_rows(delta_table(path), payments, ReferenceTables(settings)).num_rows
        lines: list[str] = []
        result = backfill(settings, log=lines.append)
        assert result.complete and result.stale == {"payments": whole}, lines  # as many as a whole read finds
        return result, next(line for line in lines if "comparing" in line)

    done, line = run()
    assert done.updated["payments"] > 0 and "the whole table: no earlier run recorded" in line
    done, line = run()
    assert done.stale == {"payments": 0} and "comparing 0 data file(s) added since, and 0 merchant(s)" in line

    write(str(path), unjoined(later), mode="append")  # the projection's next batch
    done, line = run()
    assert done.updated["payments"] > 0 and "comparing 1 data file(s) added since, and 0 merchant(s)" in line

    # A load changes one merchant (a new version from before its first payment): its rows in every file differ.
    dimension = dimension_rows(events)
    paid = {e.payload["merchant_id"] for e in admitted if e.event_type == "PaymentAuthorized"}
    changed = next(r for r in dimension if r["valid_to"] is None and r["merchant_id"] in paid)
    changed["name"] = "Renamed «merchant» 'n'"
    write(str(settings.table_path(MERCHANT_TABLE)), pa.Table.from_pylist(dimension, schema=dimension_schema()),
          mode="overwrite")
    done, line = run()
    assert done.updated["payments"] > 0 and "and 1 merchant(s) changed since in the" in line, line
    expected = payments.expected_rows(admitted, {MERCHANT_TABLE: dimension})
    stored = {tuple(r[k] for k in payments.key): r for r in delta_table(path).to_pyarrow_table().to_pylist()}
    for key, row in expected.items():
        assert {c: stored[key][c] for c in MERCHANT_COLUMNS.values()} == \
            {c: row[c] for c in MERCHANT_COLUMNS.values()}, key
