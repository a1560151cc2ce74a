"""SCD type 2 of ``dim_merchant``: what a staged batch changes (the plan, DuckDB over Arrow) and the one Delta MERGE
that applies it (delta-rs: no JVM).

Per merchant, compared by the hash of its attributes with its current version: a merchant not in the dimension
gets a version opened (``inserted``); an equal hash leaves the row untouched (``unchanged``: no rewrite, no new
version); a different hash closes the current version (``valid_to`` = the load's time, ``is_current`` false) and
opens a new one (``changed``); with a **full** extract, a current merchant missing from the batch is closed
(``closed``: dbt snapshots' ``hard_deletes: invalidate``), and one that comes back later opens a new version. The
closes and the opens are one MERGE, one Delta commit: a reader sees the load entirely or not at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lakehouse.errors import Refused
from lakehouse.storage import Location, delta_table, storage_options
from reference_data.merchants import ATTRIBUTES, COLUMNS, KEY, dimension_schema

__all__ = ["Plan", "plan_changes", "apply_plan", "current_versions", "HASH_SQL", "OutOfOrderLoad"]

# The attribute hash in SQL, equal to ``merchants.attribute_hash`` (tests/unit/test_merchants_scd2.py holds them
# together): nulls as \x00, fields separated by \x1f, SHA-256 in hex.
HASH_SQL = "sha256(concat_ws(chr(31), " + ", ".join(f"coalesce({c}, chr(0))" for c in ATTRIBUTES) + "))"


class OutOfOrderLoad(Refused, ValueError):
    """A load dated no later than the version it would close: history would run backwards."""


@dataclass(frozen=True)
class Plan:
    """What one batch changes: the rows to open (dimension schema) and the merchant ids whose current version
    closes, with the counts the load reports."""
    opens: object          # pyarrow.Table, dimension schema
    closes: object         # pyarrow.Table: merchant_id
    inserted: int
    changed: int
    closed: int
    unchanged: int

    @property
    def empty(self) -> bool:
        return self.opens.num_rows == 0 and self.closes.num_rows == 0

    def counts(self) -> dict[str, int]:
        return {"inserted": self.inserted, "changed": self.changed, "closed": self.closed,
                "unchanged": self.unchanged}


def current_versions(table_path: Location):
    """The current version of every merchant in ``dim_merchant`` (merchant_id, attr_hash, valid_from) as Arrow, and
    the table's Delta version (None and an empty table when it does not exist yet)."""
    import pyarrow as pa

    from lakehouse.tables import TableNotFound, read_table

    try:
        table = delta_table(table_path)
    except Exception:  # noqa: BLE001 -- delta-rs' TableNotFoundError, or a folder without a log
        table = None
    if table is None:
        schema = dimension_schema()
        return pa.table({c: pa.array([], schema.field(c).type) for c in (KEY, "attr_hash", "valid_from")}), None
    try:
        rows = read_table(table, filters=[("is_current", "=", True)], columns=[KEY, "attr_hash", "valid_from"])
    except TableNotFound:  # pragma: no cover -- removed between the two reads
        return current_versions(table_path)
    return rows, table.version()


def plan_changes(current, staged, full: bool, as_of: datetime, load_id: str) -> Plan:
    """The plan of a staged batch (``COLUMNS``, unique ids: the suite checked them) against the current versions
    (``current_versions``). Refuses (``OutOfOrderLoad``) a load whose ``as_of`` is not after the current version it
    would close."""
    import duckdb
    import pyarrow as pa

    con = duckdb.connect()
    try:
        con.register("staged_rows", staged.select(list(COLUMNS)))
        con.register("current_rows", current.select([KEY, "attr_hash", "valid_from"]))
        con.execute(f"CREATE TEMP VIEW s AS SELECT *, {HASH_SQL} AS attr_hash FROM staged_rows")
        opens = con.sql(
            "SELECT s.*, c.merchant_id IS NOT NULL AS was_known FROM s LEFT JOIN current_rows c USING (merchant_id) "
            "WHERE c.merchant_id IS NULL OR c.attr_hash <> s.attr_hash ORDER BY merchant_id").to_arrow_table()
        closing = ("SELECT c.merchant_id, c.valid_from FROM current_rows c JOIN s USING (merchant_id) "
                   "WHERE c.attr_hash <> s.attr_hash")
        if full:
            closing += " UNION ALL SELECT c.merchant_id, c.valid_from FROM current_rows c ANTI JOIN s USING (merchant_id)"
        closes = con.sql(f"SELECT * FROM ({closing}) ORDER BY merchant_id").to_arrow_table()
        unchanged = con.execute("SELECT count(*) FROM current_rows c JOIN s USING (merchant_id) "
                                "WHERE c.attr_hash = s.attr_hash").fetchone()[0]
    finally:
        con.close()
    if closes.num_rows:
        latest = max(closes.column("valid_from").to_pylist())
        if latest >= as_of:
            raise OutOfOrderLoad(f"dim_merchant: this load is dated {as_of.isoformat()}, not after a version it "
                                 f"would close (valid from {latest.isoformat()}); history cannot run backwards")
    changed = sum(opens.column("was_known").to_pylist()) if opens.num_rows else 0
    schema = dimension_schema()
    n = opens.num_rows
    opened = pa.table({**{c: opens.column(c).cast(pa.string()) for c in (*COLUMNS, "attr_hash")},
                       "valid_from": pa.array([as_of] * n, schema.field("valid_from").type),
                       "valid_to": pa.nulls(n, schema.field("valid_to").type),
                       "is_current": pa.array([True] * n, pa.bool_()),
                       "load_id": pa.array([load_id] * n, pa.string())}, schema=schema)
    return Plan(opened, closes.select([KEY]), inserted=n - changed, changed=changed,
                closed=closes.num_rows - changed, unchanged=unchanged)


def apply_plan(table_path: Location, plan: Plan, as_of: datetime, load_id: str) -> int | None:
    """Apply ``plan`` to ``dim_merchant`` in one commit (its metadata names the load) -> the table's Delta version
    after it (unchanged when the plan is empty; None when there is still no table)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties

    commit = CommitProperties(custom_metadata={"eventlake.load_id": load_id, **{
        f"eventlake.{k}": str(v) for k, v in plan.counts().items()}})
    try:
        table = delta_table(table_path)
    except Exception:  # noqa: BLE001 -- no table yet: the first load creates it
        table = None
    if table is None:
        if plan.opens.num_rows == 0:
            return None
        write_deltalake(str(table_path), plan.opens, mode="append", storage_options=storage_options(table_path),
                        commit_properties=commit)
        return delta_table(table_path).version()
    if plan.empty:
        return table.version()
    schema = dimension_schema()
    ts = schema.field("valid_from").type
    # One source: the closing rows keyed by their id, the opening rows with a null key (they match nothing, so
    # each is inserted), as in the usual single-MERGE SCD2.
    closing = pa.table({"merge_key": plan.closes.column(KEY),
                        **{f.name: pa.nulls(plan.closes.num_rows, f.type) for f in schema},
                        }).set_column(schema.get_field_index("valid_from") + 1, "valid_from",
                                      pa.array([as_of] * plan.closes.num_rows, ts))
    opening = pa.table({"merge_key": pa.nulls(plan.opens.num_rows, pa.string()),
                        **{f.name: plan.opens.column(f.name) for f in schema}})
    source = pa.concat_tables([closing.cast(opening.schema), opening])
    (table.merge(source, predicate=f"t.{KEY} = s.merge_key AND t.is_current", source_alias="s", target_alias="t",
                 commit_properties=commit)
     .when_matched_update(updates={"valid_to": "s.valid_from", "is_current": "false"})
     .when_not_matched_insert(updates={f.name: f"s.{f.name}" for f in schema}, predicate="s.merge_key IS NULL")
     .execute())
    table.update_incremental()
    return table.version()
