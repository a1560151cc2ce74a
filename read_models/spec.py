"""What a read model is: one spec object per module, collected by the registry in ``read_models``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

__all__ = ["ReadModel", "CURRENT_STATE_BY_VERSION", "INSERT_ONCE", "WINDOWED_SUM", "MERGE_STRATEGIES",
           "version_range"]

# Merge strategies (spark_apps/merge.py implements each once, for every read model that names it):
# CURRENT_STATE_BY_VERSION: one row per aggregate; a batch's events for a key are applied only when they
#   continue the row's version without a gap (v+1, v+2, ...): duplicates, replays and re-runs change nothing,
#   out-of-order events wait until the gap is filled.
CURRENT_STATE_BY_VERSION = "current_state_by_version"
# INSERT_ONCE: a ledger; a row is inserted the first time its key is seen and never changed afterwards.
INSERT_ONCE = "insert_once"
# WINDOWED_SUM: order-free aggregates (counts, sums, minima, maxima) per key and event-time window; each event
#   is counted once (an applied-ids ledger), events older than the watermark are not applied but recorded in
#   ``late_events``.
WINDOWED_SUM = "windowed_sum"
MERGE_STRATEGIES = (CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM)


@dataclass(frozen=True)
class ReadModel:
    name: str
    key: tuple[str, ...]
    event_types: tuple[str, ...]
    # Delta schema (a pyspark StructType), built lazily so importing a read model needs no JVM.
    schema: Callable[[], Any]
    # Vectorised fold, DataFrame -> DataFrame (no Python per row):
    #  CURRENT_STATE_BY_VERSION: events -> one row of changes per key, one groupBy whose aggregates include
    #    ``*version_range()`` (the runner checks from them that the key's events continue its row without a gap)
    #  INSERT_ONCE: events -> rows of the table
    #  WINDOWED_SUM: events -> one row of partial sums per key (the key includes the window start)
    fold: Callable[[Any], Any]
    merge_strategy: str
    # Plain-Python fold of the same events: the test oracle. events -> {key tuple: row dict}.
    python_fold: Callable[[Iterable[Any]], dict[tuple, dict[str, Any]]]
    # CURRENT_STATE_BY_VERSION: column -> SQL over t (target) and s (folded changes); insert: over s.
    # WINDOWED_SUM: merge_update combines s into t by an order-free rule: sums add, e.g.
    # {"payments": "t.payments + s.payments"}; minima and maxima take least(t.x, s.x) / greatest(t.x, s.x).
    merge_update: Mapping[str, str] = field(default_factory=dict)
    merge_insert: Mapping[str, str] = field(default_factory=dict)
    # WINDOWED_SUM only: the event-time column and how far behind the newest event time a window stays open.
    event_time: str = "occurred_at"
    watermark_delay: str = "10 minutes"
    description: str = ""
    # Columns Delta keeps min/max statistics of (data skipping for readers); default: the key.
    stats_columns: tuple[str, ...] = ()
    # The same fold as ``fold`` in SQL (DuckDB's dialect) over a relation ``events`` with the archive's columns:
    # the rebuild folds the whole archive with it (``spark_apps.archive_fold``; without it, with ``fold`` in Spark).
    fold_sql: str = ""
    # The columns holding personal values (from the personal fields of its event types, under their own name or
    # another: account_summary's last_device_location is a location), and the column naming the aggregate each
    # row is about (the event's aggregate_id): forgetting a data subject nulls those columns in the rows of the
    # subject's aggregates (read_models.forgetting; issue 45).
    personal_columns: tuple[str, ...] = ()
    subject_column: str = ""
    # Reference tables the fold joins as of each event's time (``read_models.enrichment``; e.g. ``dim_merchant``):
    # every engine adds their columns to the events before the fold, and ``python_fold`` takes their rows as a
    # second argument (name -> list of row dicts; ``expected_rows`` passes them).
    reference_tables: tuple[str, ...] = ()

    def __post_init__(self):
        if self.merge_strategy not in MERGE_STRATEGIES:
            raise ValueError(f"read model {self.name}: unknown merge strategy {self.merge_strategy!r}; "
                             f"known: {', '.join(MERGE_STRATEGIES)}")
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema().fields]

    def expected_rows(self, events: Iterable[Any], reference: Mapping[str, list] | None = None
                      ) -> dict[tuple, dict[str, Any]]:
        """The oracle: ``python_fold`` of ``events``, with the rows of its reference tables (name -> row dicts;
        a table not given has no rows) when the fold joins any."""
        if not self.reference_tables:
            return self.python_fold(events)
        return self.python_fold(events, {name: list((reference or {}).get(name, ())) for name in self.reference_tables})


def version_range():
    """The aggregates every CURRENT_STATE_BY_VERSION fold includes: the versions it folded (first, last) and
    how many events that was. The runner hands the fold a batch without repeated versions, and applies a key's
    row only when its events are exactly first_version..version and first_version continues the stored one."""
    from pyspark.sql import functions as F

    return [F.min("aggregate_version").alias("first_version"), F.max("aggregate_version").alias("version"),
            F.count(F.lit(1)).alias("_events")]
