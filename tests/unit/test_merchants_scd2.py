"""Merchants as reference data, pure parts: a source row typed, the attribute hash in SQL equal to Python's, the
SCD2 plan (unchanged untouched, changed closed and opened, missing from a full extract closed, history never
backwards)."""
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from reference_data.merchants import COLUMNS, MerchantInputError, attribute_hash, typed_row
from reference_data.scd2 import HASH_SQL, OutOfOrderLoad, plan_changes

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def staged(*rows):
    return pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows],
                                schema=pa.schema([(c, pa.string()) for c in COLUMNS]))


def current_of(plan):
    return plan.opens.select(["merchant_id", "attr_hash", "valid_from"])


def test_typed_row_blank_is_null_mcc_integer_padded_and_other_types_refused():
    row = typed_row({"merchant_id": " m1 ", "name": "", "mcc": 742, "country": "US", "risk_level": "low"}, "f: line 2")
    assert row == {"merchant_id": "m1", "name": None, "mcc": "0742", "country": "US", "risk_level": "low"}
    with pytest.raises(MerchantInputError, match=r"f: line 3: name is list"):
        typed_row({"merchant_id": "m1", "name": ["x"]}, "f: line 3")
    with pytest.raises(MerchantInputError, match=r"country is int"):
        typed_row({"merchant_id": "m1", "country": 1}, "f: line 3")


def test_the_sql_hash_is_the_python_hash():
    import duckdb

    rows = [("m1", "A", "5411", "US", "low"), ("m2", None, "5411", None, "high"), ("m3", "Ünï", "0001", "FR", "low")]
    con = duckdb.connect()
    con.register("t", staged(*rows))
    got = [r[0] for r in con.execute(f"SELECT {HASH_SQL} FROM t ORDER BY merchant_id").fetchall()]
    assert got == [attribute_hash(dict(zip(COLUMNS, r))) for r in rows]


def test_scd2_plan_inserts_changes_closes_and_leaves_unchanged_alone():
    first = plan_changes(staged()[:0].select(["merchant_id"]).append_column(
        "attr_hash", pa.array([], pa.string())).append_column("valid_from", pa.array([], pa.timestamp("us", "UTC"))),
        staged(("m1", "A", "5411", "US", "low"), ("m2", "B", "5541", "US", "low"), ("m3", "C", "5942", "GB", "low")),
        full=False, as_of=T0, load_id="l1")
    assert first.counts() == {"inserted": 3, "changed": 0, "closed": 0, "unchanged": 0}
    later = T0 + timedelta(days=1)
    second = plan_changes(current_of(first), staged(("m1", "A", "5411", "US", "high"), ("m2", "B", "5541", "US", "low"),
                                                    ("m4", "D", "5812", "FR", "low")),
                          full=True, as_of=later, load_id="l2")
    assert second.counts() == {"inserted": 1, "changed": 1, "closed": 1, "unchanged": 1}
    assert sorted(second.closes.column("merchant_id").to_pylist()) == ["m1", "m3"]
    assert second.opens.column("merchant_id").to_pylist() == ["m1", "m4"]
    assert set(second.opens.column("valid_from").to_pylist()) == {later}
    assert second.opens.column("load_id").to_pylist() == ["l2", "l2"]
    partial = plan_changes(current_of(first), staged(("m2", "B", "5541", "US", "low")), full=False, as_of=later,
                           load_id="l3")
    assert partial.empty and partial.counts()["unchanged"] == 1  # not full: the others stay open
    with pytest.raises(OutOfOrderLoad, match="history cannot run backwards"):
        plan_changes(current_of(first), staged(("m1", "A", "5411", "US", "high")), full=False, as_of=T0, load_id="l4")
