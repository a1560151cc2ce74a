"""Rows put in a Delta table's schema before delta-rs writes them (appends, merged small files, the archive fold)."""
import pyarrow as pa
import pytest

from spark_apps.arrow_rows import in_schema

SCHEMA = pa.schema([("account_id", pa.string()), ("balance", pa.int64()), ("reprocessed_at", pa.timestamp("us"))])


def test_columns_in_the_schemas_order_and_types_and_a_newer_column_null():
    rows = pa.table({"balance": pa.array([5, 7], pa.int32()), "account_id": ["a", "b"]})

    conformed = in_schema(rows, SCHEMA)

    assert conformed.schema == SCHEMA
    assert conformed.to_pylist() == [{"account_id": "a", "balance": 5, "reprocessed_at": None},
                                     {"account_id": "b", "balance": 7, "reprocessed_at": None}]


def test_a_record_batch_stays_a_record_batch():
    batch = pa.RecordBatch.from_pydict({"account_id": ["a"], "balance": [1], "reprocessed_at": [None]})

    conformed = in_schema(batch, SCHEMA)

    assert isinstance(conformed, pa.RecordBatch) and conformed.schema == SCHEMA


def test_a_missing_column_named_when_every_column_is_required():
    rows = pa.table({"account_id": ["a"], "reprocessed_at": pa.array([None], pa.timestamp("us"))})

    with pytest.raises(KeyError, match="'balance'.*account_id, reprocessed_at"):
        in_schema(rows, SCHEMA, missing_null=False)
