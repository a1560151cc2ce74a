"""The Python engine's Prometheus figures (``lakehouse.metrics``): per query (the read models' and the archive's),
``projection_core.figures``' names, which the Spark engine serves too; and the batches handed to the Spark engine."""
from __future__ import annotations

from lakehouse.metrics import Sample
from projection_core.figures import ARCHIVE_QUERY, READ_MODELS_QUERY, query_samples

__all__ = ["figures"]


def figures(engine) -> list[Sample]:
    """``engine``: a running ``python_engine.run.PythonProjection`` (read from the scrape's thread while the engine's
    loop goes on)."""
    return [Sample("projection_handed_over_batches", "counter",
                   "Batches off the Python engine's common path, run by the Spark engine", engine.handed_over),
            *query_samples((READ_MODELS_QUERY if query.name == engine.plan.name else ARCHIVE_QUERY, query)
                           for query in list(engine.queries))]
