"""The Python engine's Prometheus figures (``lakehouse.metrics``): per query (the read models' and the archive's),
batches, records, time in batches and by step, the last commit's time and the lag per partition."""
from __future__ import annotations

from lakehouse.metrics import Sample

__all__ = ["figures"]


def figures(engine) -> list[Sample]:
    """``engine``: a running ``python_engine.run.PythonProjection`` (read from the scrape's thread while the engine's
    loop goes on: its dicts are copied before they are walked)."""
    out = [Sample("projection_handed_over_batches", "counter",
                  "Batches off the Python engine's common path, run by the Spark engine", engine.handed_over)]
    for query in list(engine.queries):
        which = {"query": "event_archive" if query.name != engine.plan.name else "read_models"}
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
