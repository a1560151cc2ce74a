"""The Spark engine's Prometheus figures, under the Python engine's names (``projection_core.figures``), taken from
Structured Streaming's progress reports by a ``StreamingQueryListener``.

Spark reports a query's progress after each batch it commits (``durationMs`` then holds ``addBatch``) and, while
the query waits for data, every ``spark.sql.streaming.noDataProgressEventInterval`` (10 s) with no batch. Each report
names, per source, the offsets its last batch ended at (``endOffset``) and the newest ones the broker gave
(``latestOffset``): their difference per partition is the lag, 0 once the query has read to the log's end (both
count a transaction marker at the end, so a caught-up query shows 0 there too). Spark commits no offsets to a
consumer group, so Kafka's own lag exporters cannot see this: the listener is where it comes from.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Callable, Mapping

from lakehouse.metrics import Sample
from projection_core.figures import READ_MODELS_QUERY, QueryFigures, query_samples

__all__ = ["ProgressFigures", "observe"]


def observe(figures: QueryFigures, progress: Mapping, topic: str, now: float | None = None) -> None:
    """Fold one progress report of a query into its figures: a committed batch (one whose ``durationMs`` holds
    ``addBatch``) counts with its rows and time; every report gives the lag of ``topic``'s partitions."""
    durations = progress.get("durationMs") or {}
    if "addBatch" in durations:
        figures.batches += 1
        figures.rows += int(progress.get("numInputRows") or 0)
        figures.batch_seconds += durations.get("triggerExecution", durations["addBatch"]) / 1000.0
        figures.last_commit_at = time.time() if now is None else now
    lag = {}
    for source in progress.get("sources") or []:
        ends, latest = _offsets(source.get("endOffset"), topic), _offsets(source.get("latestOffset"), topic)
        lag.update({p: max(0, latest[p] - ends.get(p, 0)) for p in latest})
    if lag:
        figures.lag = lag


def _offsets(text, topic: str) -> dict[int, int]:
    """A Kafka source's offsets as Spark reports them (JSON text ``{"topic": {"0": 12, ...}}``, or None / "null"
    before the first batch) -> partition -> offset."""
    try:
        offsets = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {}
    return {int(p): int(o) for p, o in ((offsets or {}).get(topic) or {}).items()}


def _listener_base():
    from pyspark.sql.streaming import StreamingQueryListener
    return StreamingQueryListener


class ProgressFigures:
    """Figures per query of one projection (query name -> (label, ``QueryFigures``)), kept by a listener on the
    Spark session between ``attach`` and ``detach``. The read models' per-step seconds are the projection's own
    (``step_seconds``, what its batch lines print). Spark's listener bus delivers reports a moment after the query
    made them: ``detach`` first folds what the queries report and the listener has not delivered yet, so the
    figures of a stopped projection hold every batch it ran."""

    def __init__(self, topic: str, step_seconds: dict[str, float], log: Callable[[str], None] = print):
        self.topic, self.step_seconds, self.log = topic, step_seconds, log
        self.queries: dict[str, tuple[str, QueryFigures]] = {}
        self._last: dict[str, tuple] = {}  # query name -> (batchId, timestamp) of the last report folded
        # (label, batch id) -> the batch's outcomes (``QueryFigures.add_outcomes``' arguments), folded with the report
        # of its commit
        self._outcomes: dict[tuple[str, int], dict] = {}
        self._lock = threading.Lock()
        self._listener = None
        self._spark = None
        self._failed = False

    def track(self, query_name: str, label: str) -> None:
        """Keep figures for the query named ``query_name`` (labelled ``READ_MODELS_QUERY`` or ``ARCHIVE_QUERY``), from
        its next report."""
        figures = QueryFigures()
        if label == READ_MODELS_QUERY:
            figures.step_seconds = self.step_seconds
        with self._lock:
            self.queries[query_name] = (label, figures)
            self._last.pop(query_name, None)

    def on_progress(self, progress: Mapping) -> None:
        """Fold a report of a tracked query, once: reports come in order, one already folded is skipped."""
        name = progress.get("name")
        with self._lock:
            entry = self.queries.get(name)
            key = (int(progress.get("batchId", -1)), str(progress.get("timestamp", "")))
            if entry is None or key <= self._last.get(name, (-2, "")):
                return
            self._last[name] = key
            try:
                observe(entry[1], progress, self.topic)
                if "addBatch" in (progress.get("durationMs") or {}):
                    outcomes = self._outcomes.pop((entry[0], key[0]), None)
                    for older in [k for k in self._outcomes if k[0] == entry[0] and k[1] < key[0]]:
                        del self._outcomes[older]  # a batch whose report was never delivered (the query stopped)
                    if outcomes is not None:
                        entry[1].add_outcomes(**outcomes)
            except (TypeError, ValueError, KeyError) as e:  # a report of a shape we do not know: said once
                if not self._failed:
                    self._failed = True
                    self.log(f"projection: a progress report of {name} not understood ({e!r}); its metrics may "
                             f"stand still")

    def batch_outcomes(self, label: str, batch_id: int, events: Mapping[str, int], held: int | None = None,
                       newest_event_at: float | None = None) -> None:
        """What batch ``batch_id`` of the query labelled ``label`` did with its events (``QueryFigures.add_outcomes``),
        counted when its commit is reported (a batch run again after a failure: its last run counts)."""
        with self._lock:
            self._outcomes[(label, batch_id)] = {"events": dict(events), "held": held,
                                                 "newest_event_at": newest_event_at}

    def query_figures(self, label: str) -> list[QueryFigures]:
        """The figures of the queries labelled ``label``."""
        with self._lock:
            return [figures for which, figures in self.queries.values() if which == label]

    def attach(self, spark) -> None:
        """Listen to ``spark``'s streaming queries (reports of queries not tracked here are ignored)."""
        if self._listener is not None:
            return
        owner = self

        class Listener(_listener_base()):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                owner.on_progress(event.progress)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        self._listener, self._spark = Listener(), spark
        spark.streams.addListener(self._listener)

    def detach(self, queries=()) -> None:
        """Fold the reports ``queries`` (Spark's query objects) hold that the listener has not delivered yet, then
        stop listening."""
        for query in queries:
            for progress in query.recentProgress:
                self.on_progress(progress)
        if self._listener is not None:
            self._spark.streams.removeListener(self._listener)
            self._listener = self._spark = None

    def samples(self) -> list[Sample]:
        with self._lock:
            entries = list(self.queries.values())
        return query_samples(entries)
