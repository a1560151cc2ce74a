"""Rows in a Delta table's schema, for every writer that hands pyarrow data to delta-rs."""
from __future__ import annotations

__all__ = ["in_schema"]


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
