"""Rows in a Delta table's schema, for every writer that hands pyarrow data to delta-rs."""
from __future__ import annotations

__all__ = ["arrow_schema", "in_schema"]


def in_schema(data, schema, missing_null: bool = True):
    """``data`` (a pyarrow Table or RecordBatch) as ``schema``'s columns, in its order, each cast to its type (a file
    Spark wrote, or a DuckDB query, may store a type otherwise). A column ``data`` lacks is null in every row (a column
    added to the table since, e.g. ``late_events``' ``reprocessed_at``), or with ``missing_null=False`` a KeyError
    naming it (a query that should have produced every column)."""
    import pyarrow as pa

    columns = []
    for f in schema:
        if f.name in data.column_names:
            columns.append(data.column(f.name).cast(f.type))
        elif missing_null:
            columns.append(pa.nulls(data.num_rows, f.type))
        else:
            raise KeyError(f"column {f.name!r} of the table's schema is missing from the rows "
                           f"(they have {', '.join(data.column_names)})")
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(columns, schema=schema)
    return pa.Table.from_arrays(columns, schema=schema)


def arrow_schema(struct):
    """A pyspark ``StructType`` as a pyarrow schema (Delta's types: string, long, int, timestamp in UTC ...)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    def arrow_type(t):
        simple = {T.StringType: pa.string(), T.LongType: pa.int64(), T.IntegerType: pa.int32(),
                  T.ShortType: pa.int16(), T.ByteType: pa.int8(), T.BooleanType: pa.bool_(),
                  T.DoubleType: pa.float64(), T.FloatType: pa.float32(), T.BinaryType: pa.binary(),
                  T.DateType: pa.date32(), T.TimestampType: pa.timestamp("us", tz="UTC"),
                  T.TimestampNTZType: pa.timestamp("us")}
        for kind, arrow in simple.items():
            if type(t) is kind:
                return arrow
        if isinstance(t, T.DecimalType):
            return pa.decimal128(t.precision, t.scale)
        raise TypeError(f"no Arrow type for the Spark type {t.simpleString()}")

    return pa.schema([pa.field(f.name, arrow_type(f.dataType), nullable=f.nullable) for f in struct.fields])
