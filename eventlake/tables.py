"""Reading a Delta table's current version into Arrow without a JVM (delta-rs for the log, pyarrow for the data).

delta-rs resolves which Parquet files make the current version; pyarrow reads them with the table's schema
(files written before a column was added give nulls for it). Reading through delta-rs' own pyarrow dataset
sometimes aborted the process at exit ("terminate called without an active exception": Arrow threads
outliving the interpreter, cf. delta-io/delta-rs#2184), so that path is kept for tables this reader cannot
handle alone: partitioned ones and those whose reader protocol goes beyond plain Parquet files (e.g. deletion
vectors).
"""
from __future__ import annotations

__all__ = ["dataset", "read_table", "TableNotFound"]


class TableNotFound(LookupError):
    """No Delta table at the path."""


def dataset(path):
    """The current version of the Delta table at ``path`` (or of a ``deltalake.DeltaTable`` already loaded) as a
    ``pyarrow.dataset.Dataset`` (lazy: DuckDB and pyarrow read only what a query needs)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if isinstance(path, DeltaTable):
        table = path
    else:
        try:
            table = DeltaTable(str(path))
        except TableNotFoundError:
            raise TableNotFound(f"no Delta table at {path}") from None
    if table.metadata().partition_columns or table.protocol().min_reader_version > 1:
        return table.to_pyarrow_dataset()
    return ds.dataset(table.file_uris(), schema=pa.schema(table.schema().to_arrow()), format="parquet")


def read_table(path, filters=None, columns: list[str] | None = None):
    """The current version of the Delta table at ``path`` (or of a ``deltalake.DeltaTable`` already loaded,
    so that its version and its rows match) as a ``pyarrow.Table``; ``filters`` in pyarrow's DNF form, e.g.
    ``[("read_model", "=", "payments")]``."""
    import pyarrow.parquet as pq

    return dataset(path).to_table(columns=columns, filter=pq.filters_to_expression(filters) if filters else None)
