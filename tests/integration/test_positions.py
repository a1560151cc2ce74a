"""Positions at a transaction marker (issue 47): a log whose last records came from a transactional producer ends
one offset past a commit marker, not past a record. A caught-up projection shows no lag in ``eventlake status`` and
the reconciliation does not wait for the archive to reach a table position that lies past the marker."""
from __future__ import annotations

import pytest

import read_models
from event_store import kafka_log
from eventlake.generator import GeneratorConfig
from expectations.reconciliation import archive_end, reconcile, table_position
from projection_core import positions
from python_engine.run import PythonProjection
from read_models.catalog import Catalog
from spark_apps.spark_projection import Projection
from spark_apps.status import projection_statuses, render
from tests.domain_helpers import events_for

pytestmark = pytest.mark.slow


def _publish_in_transactions(settings, events, per_transaction: int) -> None:
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings, transactional_id=f"{settings.topic_prefix}positions")
    try:
        producer.init_transactions()
        for start in range(0, len(events), per_transaction):
            producer.begin_transaction()
            for e in events[start:start + per_transaction]:
                producer.send(settings.events_topic, key=e.aggregate_id.encode(), value=e.to_json())
            producer.commit_transaction()
    finally:
        producer.close()


def test_an_idle_log_ending_in_a_transaction_marker_is_caught_up(spark, settings):
    events = events_for(GeneratorConfig(accounts=6, commands=40, seed=47, run_id="pos"))
    _publish_in_transactions(settings, events, per_transaction=15)
    stable = {tp.partition: o for tp, o in kafka_log.end_offsets(settings, settings.events_topic).items()}
    ends = positions.record_ends(settings)
    # Each partition written to ends in a commit marker: the record end is one short of the stable end.
    assert any(ends.values()) and all(stable[p] == end + 1 for p, end in ends.items() if end), (stable, ends)

    model = read_models.get("account_summary")
    # The read model by Spark's query (its batches end at the stable offset, past the marker), the archive by the
    # Python engine (its batches end after the last record read): the positions of the issue.
    Projection(spark, settings, [model], log=lambda *_: None, archive=False).run_until_caught_up()
    PythonProjection(settings, [], archive=True, log=lambda *_: None).run_until_caught_up()
    table_end, _ = table_position(settings, Catalog(settings).current(model.name))
    assert table_end != archive_end(settings) and positions.behind(archive_end(settings), table_end)

    statuses = projection_statuses(settings, sum(ends.values()), ends)
    assert len(statuses) == 2 and all(s.lag == 0 for s in statuses), statuses
    assert "lag 1 events" not in render(settings) and render(settings).count("lag 0 events") == 2
    result = reconcile(settings, model.name)
    assert result.success and result.differences == 0, result.lines()
