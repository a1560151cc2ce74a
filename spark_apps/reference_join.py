"""The reference tables a fold joins (``ReadModel.reference_tables``), added to its input on Spark: the rows read by
``projection_core.reference`` (delta-rs, cached per version), handed to Spark as a small local relation and joined
as of each event's time by ``read_models.enrichment`` (broadcast)."""
from __future__ import annotations

from projection_core.reference import ReferenceTables
from read_models.enrichment import enriched_spark
from read_models.spec import ReadModel

__all__ = ["with_reference"]


def with_reference(events, model: ReadModel, reference: ReferenceTables):
    """``events`` (a DataFrame of event rows) with the columns of ``model``'s reference tables as of each event's
    time; ``events`` itself for a model that joins none."""
    if not model.reference_tables:
        return events
    spark = events.sparkSession
    return enriched_spark(events, {name: spark.createDataFrame(reference.arrow(name))
                                   for name in model.reference_tables})
