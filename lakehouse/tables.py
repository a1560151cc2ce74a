"""Reading a Delta table's current version into Arrow without a JVM (delta-rs for the log, pyarrow for the data).

delta-rs resolves which Parquet files make the current version; pyarrow reads them with the table's schema
(files written before a column was added give nulls for it). Reading through delta-rs' own pyarrow dataset
sometimes aborted the process at exit ("terminate called without an active exception": Arrow threads
outliving the interpreter, cf. delta-io/delta-rs#2184), so that path is kept for tables this reader cannot
handle alone: partitioned ones and those whose reader protocol goes beyond plain Parquet files (e.g. deletion
vectors).

Timestamps: the tables are written with INT64 microsecond Parquet timestamps (spark_apps/session.py), but
files of older tables hold Spark's default INT96, which pyarrow reads as nanoseconds by default: a value
past 2262-04-11 (or before 1677-09-21) then fails to cast to the table's microsecond schema ("would lose
data"). Both paths read INT96 as microseconds, so every time the schemas allow (1900 up to 9999) reads.
"""
from __future__ import annotations

from lakehouse.storage import delta_table, is_remote
from lakehouse.errors import NotFound

__all__ = ["dataset", "read_table", "read_rows", "plain", "TableNotFound", "ensure_table", "add_missing_columns"]


class TableNotFound(NotFound, LookupError):
    """No Delta table at the path."""


def dataset(path, files=None):
    """The current version of the Delta table at ``path`` (or of a ``deltalake.DeltaTable`` already loaded) as a
    ``pyarrow.dataset.Dataset`` (lazy: DuckDB and pyarrow read only what a query needs). ``files``: only these of
    its data files (as ``DeltaTable.file_uris()`` names them)."""
    import pyarrow.dataset as ds

    whole = _dataset(path)
    if files is None:
        return whole
    names = {f.rsplit("/", 1)[-1] for f in files}  # a data file's name is unique in its table (a UUID)
    return ds.FileSystemDataset([f for f in whole.get_fragments() if f.path.rsplit("/", 1)[-1] in names],
                                whole.schema, whole.format, whole.filesystem)


def _dataset(path):
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if isinstance(path, DeltaTable):
        table = path
    else:
        try:
            table = delta_table(path)
        except TableNotFoundError:
            raise TableNotFound(f"no Delta table at {path}") from None
    # pyarrow opens local files itself; a URI (hdfs://, s3a:// ...) goes through delta-rs' own object store.
    if (table.metadata().partition_columns or table.protocol().min_reader_version > 1
            or is_remote(table.table_uri.replace("file://", "", 1))):
        return table.to_pyarrow_dataset(parquet_read_options=_read_options())
    return ds.dataset(table.file_uris(), schema=pa.schema(table.schema().to_arrow()),
                      format=ds.ParquetFileFormat(read_options=_read_options()))


def _read_options():
    """INT96 timestamps (older files written by Spark) as microseconds, the unit of Delta's timestamps."""
    import pyarrow.dataset as ds

    return ds.ParquetReadOptions(coerce_int96_timestamp_unit="us")


def read_table(path, filters=None, columns: list[str] | None = None):
    """The current version of the Delta table at ``path`` (or of a ``deltalake.DeltaTable`` already loaded,
    so that its version and its rows match) as a ``pyarrow.Table``; ``filters`` in pyarrow's DNF form, e.g.
    ``[("read_model", "=", "payments")]``."""
    import pyarrow.parquet as pq

    return dataset(path).to_table(columns=columns, filter=pq.filters_to_expression(filters) if filters else None)


def plain(value):
    """A value as the Python folds (the oracles) give it: timestamps as naive UTC datetimes."""
    from datetime import datetime, timezone

    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def read_rows(path, filters=None) -> list[dict]:
    """The current version's rows as dicts (``read_table``'s arguments), values as ``plain`` gives them."""
    return [{k: plain(v) for k, v in row.items()} for row in read_table(path, filters=filters).to_pylist()]


def ensure_table(path, schema, stats_columns: tuple[str, ...] | None = None) -> None:
    """Create the Delta table at the local ``path`` with the Arrow ``schema`` if missing (delta-rs: no JVM, a
    fraction of a second where Spark's CREATE takes seconds). ``stats_columns``: the columns Delta keeps min/max
    statistics of for data skipping (default: Delta's first 32). A table made by an older release gains the columns
    added to ``schema`` since (nullable, at the end: "add columns freely", docs/DESIGN.md), so the MERGEs naming
    them find them. Two processes creating it at once: the one that loses finds the winner's table."""
    from pathlib import Path

    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(str(path)):
        add_missing_columns(DeltaTable(str(path)), schema)
        return
    configuration = {"delta.dataSkippingStatsColumns": ",".join(stats_columns)} if stats_columns else None
    Path(str(path)).mkdir(parents=True, exist_ok=True)
    try:
        DeltaTable.create(str(path), schema, mode="ignore", configuration=configuration)
    except Exception:  # noqa: BLE001 -- a commit of version 0 lost to another creator: its table stands
        if not DeltaTable.is_deltatable(str(path)):
            raise
        add_missing_columns(DeltaTable(str(path)), schema)


def add_missing_columns(table, schema) -> list[str]:
    """Add to the Delta ``table`` (a ``deltalake.DeltaTable``) the fields of the Arrow ``schema`` it lacks,
    nullable -> their names."""
    import pyarrow as pa
    from deltalake.schema import Schema

    have = {f.name for f in pa.schema(table.schema().to_arrow())}
    missing = [f.with_nullable(True) for f in schema if f.name not in have]
    if missing:
        table.alter.add_columns(list(Schema.from_arrow(pa.schema(missing)).fields))
    return [f.name for f in missing]
