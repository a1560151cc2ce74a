"""A projection's Prometheus figures, the same names for both engines (``lakehouse.metrics``), so one dashboard and
one set of alert rules serve a projection whichever engine runs it.

Each engine keeps a ``QueryFigures`` per query (the read models' and the archive's): the Python engine updates its
own as it commits a batch (``python_engine.run``), the Spark engine from Structured Streaming's progress reports
(``spark_apps.progress_figures``). They are read at scrape time, from the scrape's thread.
"""
from __future__ import annotations

import time
from typing import Iterable, Mapping

from lakehouse.metrics import Sample

__all__ = ["QueryFigures", "query_samples", "seconds_behind", "READ_MODELS_QUERY", "ARCHIVE_QUERY", "OUTCOMES"]

READ_MODELS_QUERY, ARCHIVE_QUERY = "read_models", "event_archive"  # the values of the ``query`` label
# What became of the events a read models' batch read (the ``outcome`` label): applied by every read model (admitted
# by the sequence gate), late (a windowed model's event behind its watermark: set aside in ``late_events``, once per
# model it is late for), dead-lettered (records that are not valid events, and version conflicts).
OUTCOMES = ("applied", "late", "dead_lettered")


class QueryFigures:
    """What one query has done since the service started: committed batches and the records they read, their
    seconds in all and by step, when the last one committed (Unix time), and the records each partition of the
    events topic holds past the query (0 once it has read to the end). The read models' query also counts its events
    by outcome (``OUTCOMES``), the events held after a version gap as its last batch left them, and the newest
    ``recorded_at`` (Unix time) it applied: with a lag, now less that is how far behind the log it is in seconds
    (``seconds_behind``; the read models' freshness)."""

    def __init__(self) -> None:
        self.batches = 0
        self.rows = 0
        self.batch_seconds = 0.0
        self.step_seconds: dict[str, float] = {}
        self.last_commit_at: float | None = None
        self.lag: dict[int, int] = {}
        self.events: dict[str, int] = {}
        self.held: int | None = None
        self.newest_event_at: float | None = None

    def add_outcomes(self, events: Mapping[str, int], held: int | None = None,
                     newest_event_at: float | None = None) -> None:
        """Fold a committed batch's events by outcome, what it left held, and its newest applied event's time."""
        for outcome, n in events.items():
            if outcome not in OUTCOMES:
                raise ValueError(f"event outcome {outcome!r}: expected one of {OUTCOMES}")
            self.events[outcome] = self.events.get(outcome, 0) + int(n)
        if held is not None:
            self.held = int(held)
        if newest_event_at is not None and (self.newest_event_at is None or newest_event_at > self.newest_event_at):
            self.newest_event_at = float(newest_event_at)


def seconds_behind(query: QueryFigures, now: float | None = None) -> float | None:
    """How far behind the log ``query`` is: 0 when no partition holds records past it, else now less the newest
    event it applied (None: records wait and it has applied none since it started, or no lag is known yet)."""
    lag = dict(query.lag)
    if not any(lag.values()):
        return 0.0 if lag else None
    if query.newest_event_at is None:
        return None
    return max(0.0, (time.time() if now is None else now) - query.newest_event_at)


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
        if label != READ_MODELS_QUERY:
            continue
        behind = seconds_behind(query)
        if behind is not None:
            out.append(Sample("projection_lag_seconds", "gauge", "How far behind the log: 0 when every partition is "
                              "read to its end, else now less the newest recorded_at applied", behind, which))
        events = dict(query.events)
        out += [Sample("projection_events", "counter", "Events of committed batches, by outcome (applied, late, "
                       "dead_lettered)", events.get(outcome, 0), {**which, "outcome": outcome}) for outcome in OUTCOMES]
        if query.held is not None:
            out.append(Sample("projection_held_events", "gauge", "Events held after a version gap (as the last batch "
                              "left them)", query.held, which))
        if query.newest_event_at is not None:
            out.append(Sample("projection_newest_event_timestamp_seconds", "gauge", "The newest recorded_at applied "
                              "(Unix time)", query.newest_event_at, which))
    return out
