"""A projection's Prometheus figures, the same names for both engines (``lakehouse.metrics``), so one dashboard and
one set of alert rules serve a projection whichever engine runs it.

Each engine keeps a ``QueryFigures`` per query (the read models' and the archive's): the Python engine updates its
own as it commits a batch (``python_engine.run``), the Spark engine from Structured Streaming's progress reports
(``spark_apps.progress_figures``). They are read at scrape time, from the scrape's thread.
"""
from __future__ import annotations

from typing import Iterable

from lakehouse.metrics import Sample

__all__ = ["QueryFigures", "query_samples", "READ_MODELS_QUERY", "ARCHIVE_QUERY"]

READ_MODELS_QUERY, ARCHIVE_QUERY = "read_models", "event_archive"  # the values of the ``query`` label


class QueryFigures:
    """What one query has done since the service started: committed batches and the records they read, their
    seconds in all and by step, when the last one committed (Unix time), and the records each partition of the
    events topic holds past the query (0 once it has read to the end)."""

    def __init__(self) -> None:
        self.batches = 0
        self.rows = 0
        self.batch_seconds = 0.0
        self.step_seconds: dict[str, float] = {}
        self.last_commit_at: float | None = None
        self.lag: dict[int, int] = {}


def query_samples(queries: Iterable[tuple[str, QueryFigures]]) -> list[Sample]:
    """The samples of ``queries`` ((label, figures): label is ``READ_MODELS_QUERY`` or ``ARCHIVE_QUERY``). The dicts
    are copied before they are walked: the engine may add a step or a partition while a scrape reads them."""
    out = []
    for label, query in queries:
        which = {"query": label}
        out += [Sample("projection_batches", "counter", "Batches committed", query.batches, which),
                Sample("projection_records", "counter", "Records of the events topic projected", query.rows, which),
                Sample("projection_batch_seconds", "counter", "Time spent in committed batches",
                       query.batch_seconds, which)]
        steps = dict(query.step_seconds)
        out += [Sample("projection_step_seconds", "counter", "Time spent in committed batches, by step",
                       seconds, {**which, "step": step}) for step, seconds in sorted(steps.items())]
        if query.last_commit_at is not None:
            out.append(Sample("projection_last_commit_timestamp_seconds", "gauge",
                              "When the last batch committed (Unix time)", query.last_commit_at, which))
        out += [Sample("projection_lag_records", "gauge", "Records in the events topic past the projection, by "
                       "partition", lag, {**which, "partition": str(partition)})
                for partition, lag in sorted(dict(query.lag).items())]
    return out
