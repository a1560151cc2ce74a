"""The reference tables a read model's fold joins (``ReadModel.reference_tables``; the join itself is
``read_models.enrichment``), read for whichever engine folds: every version of every row, as Arrow, with delta-rs
(no JVM; the tables are small). A live projection keeps its ``ReferenceTables`` and reads a table again only when
its Delta version moved, so a batch pays a look at the table's log, not a read of it.

A table that does not exist yet (no load ran) reads as no rows: the attributes are null, as for a merchant the
dimension does not know.
"""
from __future__ import annotations

from typing import Iterable

from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from read_models.enrichment import DIMENSION_COLUMNS, MERCHANT_TABLE

__all__ = ["ReferenceTables", "COLUMNS"]

# Per reference table: the columns the joins read.
COLUMNS = {MERCHANT_TABLE: DIMENSION_COLUMNS}


def _empty(name: str):
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.table({c: pa.array([], ts if c in ("valid_from", "valid_to") else pa.string()) for c in COLUMNS[name]})


class ReferenceTables:
    """The reference tables of ``settings``' home, by name, cached per Delta version."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._tables: dict[str, object] = {}   # name -> deltalake.DeltaTable (kept: updated incrementally)
        self._read: dict[str, tuple[int | None, object]] = {}  # name -> (version read, Arrow rows)

    def version(self, name: str) -> int | None:
        """The table's Delta version now (None: no table yet)."""
        table = self._tables.get(name)
        try:
            if table is None:
                table = self._tables[name] = delta_table(self.settings.table_path(name))
            else:
                table.update_incremental()
        except Exception:  # noqa: BLE001 -- delta-rs' TableNotFoundError: no load ran yet
            self._tables.pop(name, None)
            return None
        return table.version()

    def arrow(self, name: str):
        """Every row of table ``name`` (its ``COLUMNS``) as a ``pyarrow.Table``: read again only when the table's
        version moved since the last call."""
        from lakehouse.tables import read_table

        if name not in COLUMNS:
            raise KeyError(f"unknown reference table {name!r}; known: {', '.join(COLUMNS)}")
        version = self.version(name)
        cached = self._read.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        rows = _empty(name) if version is None else read_table(self._tables[name], columns=list(COLUMNS[name]))
        self._read[name] = (version, rows)
        return rows

    def rows(self, names: Iterable[str]) -> dict[str, list[dict]]:
        """The tables' rows as dicts, by name: what ``ReadModel.expected_rows`` (the oracle) takes."""
        return {name: self.arrow(name).to_pylist() for name in names}

    def versions(self, names: Iterable[str]) -> dict[str, int | None]:
        return {name: self.version(name) for name in names}
