"""The starting tables of a test whose subject is not the Spark engine (a rebuild, a generation switch, a
reprocess, the checks, a domain's end-to-end run): projected by the Python engine, which gives the same rows as the
Spark engine (tests/integration/test_engine_contracts.py proves it for every read model) in a fraction of its CPU.
A batch off the Python engine's common path (repeated event ids, a version gap, ...) is handed to the test's Spark
session, as ``eventlake project`` hands it to its own. The Spark engine's guarantees keep their tests on Spark
(test_projection, test_projection_properties, test_projection_crashes, test_generations' live query, ...)."""
from __future__ import annotations

from projection_core.errors import ProjectionRun
from python_engine.run import PythonProjection

__all__ = ["project_in_python", "publish_events"]


def publish_events(settings, events) -> None:
    """``events`` (EventEnvelopes) onto the settings' events topic, keyed by aggregate, in their order."""
    from event_store import kafka_log

    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    finally:
        producer.close()


def project_in_python(spark, settings, models=None, archive: bool | None = None,
                      max_offsets_per_trigger: int | None = None, log=lambda *_: None) -> ProjectionRun:
    """Project the log until caught up, as ``Projection(spark, settings, models, archive=...)
    .run_until_caught_up(max_offsets_per_trigger)`` does, on the Python engine."""
    engine = PythonProjection(settings, models, log=log, archive=archive, spark_session=lambda: spark)
    return engine.run_until_caught_up(max_offsets_per_trigger=max_offsets_per_trigger)
