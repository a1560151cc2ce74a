"""Reference data joined into the read models **as of each event's time** (issue 46 part 2), one rule in the three
forms the folds run in: DuckDB SQL (the Python engine, the rebuild's fold), a Spark DataFrame join (the Spark
projection, its rebuild and reprocessing) and plain Python (the oracle). Engine-neutral: the readers of the
dimension's rows are in ``projection_core.reference``.

``dim_merchant`` is SCD type 2 history (``reference_data.scd2``): per merchant, versions with ``valid_from`` (the
load that opened it) and ``valid_to`` (null while current). An event at time ``t`` takes the version with
``valid_from <= t < valid_to``. A payment made **before the merchant's first version** (the merchant was loaded
after the payment: a late-arriving dimension) takes that first version, so a rebuild, and the live projection of
an event it reads after the load, give the same row whatever the order of projection and load; an event the
live projection folded before the load has null attributes, and the backfill fills them with what a rebuild
would give. An event after the merchant was closed (gone from a full extract) and not reopened has none: null.
Versions of one merchant never overlap (the SCD2 merge closes one when it opens the next), so at most one
version matches.
"""
from __future__ import annotations

from bisect import bisect_right
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

__all__ = ["MERCHANT_TABLE", "MERCHANT_COLUMNS", "DIMENSION_COLUMNS", "as_of_sql", "as_of_spark", "MerchantHistory",
           "enriched_sql", "enriched_spark"]

# The reference table a model names in ``ReadModel.reference_tables`` (the catalog's DIM_MERCHANT_TABLE is this).
MERCHANT_TABLE = "dim_merchant"
# What the join adds to each event: the merchant's attribute -> the column's name on the event.
MERCHANT_COLUMNS = {"name": "merchant_name", "mcc": "merchant_category", "risk_level": "merchant_risk"}
# The dimension's columns the join reads.
DIMENSION_COLUMNS = ("merchant_id", *MERCHANT_COLUMNS, "valid_from", "valid_to")


def as_of_sql(events: str, dimension: str) -> str:
    """A SELECT of every column of relation ``events`` (with ``merchant_id`` and ``occurred_at``) plus the
    ``MERCHANT_COLUMNS`` of the version of its merchant as of ``occurred_at``, in SQL that DuckDB reads (the
    relation ``dimension`` has ``DIMENSION_COLUMNS``, timestamps with a time zone like the events')."""
    added = ", ".join(f"d._d_{a} AS {c}" for a, c in MERCHANT_COLUMNS.items())
    attributes = ", ".join(f"{a} AS _d_{a}" for a in MERCHANT_COLUMNS)
    return (f"SELECT e.*, {added} FROM {events} e LEFT JOIN ("
            f"SELECT merchant_id AS _d_merchant_id, {attributes}, valid_from AS _d_from, valid_to AS _d_to, "
            f"valid_from = min(valid_from) OVER (PARTITION BY merchant_id) AS _d_first FROM {dimension}) d "
            f"ON d._d_merchant_id = e.merchant_id AND (e.occurred_at >= d._d_from OR d._d_first) "
            f"AND (d._d_to IS NULL OR e.occurred_at < d._d_to)")


def as_of_spark(events, dimension):
    """The same join on Spark: DataFrame ``events`` plus the ``MERCHANT_COLUMNS`` from DataFrame ``dimension``
    (``DIMENSION_COLUMNS``; small: broadcast)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = dimension.select(F.col("merchant_id").alias("_d_merchant_id"),
                         *(F.col(a).alias(f"_d_{a}") for a in MERCHANT_COLUMNS),
                         F.col("valid_from").alias("_d_from"), F.col("valid_to").alias("_d_to"))
    d = d.withColumn("_d_first", F.col("_d_from") == F.min("_d_from").over(Window.partitionBy("_d_merchant_id")))
    on = ((F.col("_d_merchant_id") == events["merchant_id"])
          & ((events["occurred_at"] >= F.col("_d_from")) | F.col("_d_first"))
          & (F.col("_d_to").isNull() | (events["occurred_at"] < F.col("_d_to"))))
    return (events.join(F.broadcast(d), on, "left")
            .select(*(events[c] for c in events.columns),
                    *(F.col(f"_d_{a}").alias(c) for a, c in MERCHANT_COLUMNS.items())))


def enriched_sql(events: str, tables: Iterable[str]) -> str:
    """A SELECT of relation ``events`` joined with each reference table of ``tables`` (a relation of that name
    holds its rows), as of each event's time: what a fold that names ``tables`` reads as ``events``."""
    sql = f"SELECT * FROM {events}"
    for name in tables:
        if name != MERCHANT_TABLE:
            raise KeyError(f"no as-of join for reference table {name!r}; known: {MERCHANT_TABLE}")
        sql = as_of_sql(f"({sql})", name)
    return sql


def enriched_spark(events, tables: Mapping[str, Any]):
    """DataFrame ``events`` joined with each reference table (name -> DataFrame of its rows) as of each event's
    time."""
    for name, rows in tables.items():
        if name != MERCHANT_TABLE:
            raise KeyError(f"no as-of join for reference table {name!r}; known: {MERCHANT_TABLE}")
        events = as_of_spark(events, rows)
    return events


def _utc(value) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


class MerchantHistory:
    """The dimension's versions in memory, for the oracle: ``attributes(merchant_id, t)`` is what the join gives an
    event of that merchant at time ``t`` (a mapping of ``MERCHANT_COLUMNS``' names, values None when no version
    applies). Built from the dimension's rows (dicts with ``DIMENSION_COLUMNS``)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()):
        versions: dict[str, list[tuple[datetime, datetime | None, dict]]] = {}
        for row in rows:
            versions.setdefault(row["merchant_id"], []).append((
                _utc(row["valid_from"]), None if row.get("valid_to") is None else _utc(row["valid_to"]),
                {c: row.get(a) for a, c in MERCHANT_COLUMNS.items()}))
        self._versions = {m: sorted(v, key=lambda x: x[0]) for m, v in versions.items()}
        self._starts = {m: [v[0] for v in vs] for m, vs in self._versions.items()}

    def __len__(self) -> int:
        return sum(len(v) for v in self._versions.values())

    def attributes(self, merchant_id: str | None, at) -> dict[str, Any]:
        versions = self._versions.get(merchant_id) if merchant_id is not None else None
        if versions:
            t = _utc(at)
            i = max(bisect_right(self._starts[merchant_id], t) - 1, 0)  # before the first version: the first
            _, valid_to, values = versions[i]
            if valid_to is None or t < valid_to:
                return dict(values)
        return dict.fromkeys(MERCHANT_COLUMNS.values())
