"""Property-based test of the projection on the real broker and real Spark + Delta: whatever the log holds
(duplicates, replays, forged conflicts and events after a gap, spread over partitions) and wherever the
rounds of publishing and the batch boundaries fall, every read model equals its oracle, the models agree
(expectations.CROSS_MODEL_CHECKS) and each reconciles with the archive (expectations/reconciliation.py).

Few examples (each runs the projection up to three times); the Hypothesis profile sets how many
(tests/conftest.py: "ci" 3, "thorough" 33).
"""
from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, Phase, given, note
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import read_models
from event_store import kafka_log
from expectations import check_agreements
from expectations.reconciliation import reconcile
from read_models.sequence import sequence
from spark_apps.projection import Projection
from tests.log_strategies import logs
from tests.oracle import assert_matches_oracle

pytestmark = pytest.mark.slow

_EXAMPLES = max(3, hypothesis_settings().max_examples // 30)


def _publish(settings, records) -> None:
    """(partition, event) records, each to its own partition in the order given (per partition: the log's)."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    try:
        futures = [producer.send(settings.events_topic, key=e.aggregate_id.encode(), value=e.to_json(),
                                 partition=p) for p, e in records]
        producer.flush()
        for f in futures:
            f.get(timeout=60)
    finally:
        producer.close()


def _assert_reconciled(settings, events) -> None:
    """Every read model reconciles with the archive; one no batch has written yet must have no rows to hold."""
    admitted = sequence(events).admitted
    for model in read_models.select(None):
        result = reconcile(settings, model.name)
        if not result.compared and "no projection batch has written" in result.reason:
            assert not model.python_fold(admitted), result.lines()
        else:
            assert result.success, result.lines()


# No shrinking: each step would be another full run; the example is printed as drawn (the unit properties in
# tests/unit/test_properties.py shrink the same logs to a few records).
@hypothesis_settings(max_examples=_EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(log=logs(forge=True, max_accounts=3, max_commands=25, max_partitions=3), data=st.data())
def test_every_read_model_equals_its_oracle_whatever_the_log_and_the_batches(spark, settings, tmp_path, log,
                                                                             data):
    assert settings.topic_partitions >= len(log.partitions)
    example = uuid.uuid4().hex[:8]  # fixtures are per test, examples many: topics and tables of their own
    s = settings.replace(topic_prefix=f"{settings.topic_prefix}{example}.", home=tmp_path / example)
    where = {id(e): p for p, records in enumerate(log.partitions) for e in records}
    records = [(where[id(e)], e) for e in log.merged]
    cuts = sorted(data.draw(st.lists(st.integers(1, len(records)), max_size=2, unique=True), label="rounds end"))
    rounds = [records[a:b] for a, b in zip([0] + cuts, cuts + [len(records)]) if b > a]
    for published in rounds:
        _publish(s, published)
        # At most about two batches per round (each costs seconds); the boundaries fall anywhere.
        limit = data.draw(st.integers(max(1, len(published) // 2), len(published) + 5), label="max offsets")
        run = Projection(spark, s, log=lambda *_: None).run_until_caught_up(max_offsets_per_trigger=limit)
        note(f"round of {len(published)} records, max_offsets_per_trigger={limit}: {run.batches} batches")

    # The oracle over each partition's records in their order (an aggregate lives in one partition).
    assert_matches_oracle(spark, s, [e for p in log.partitions for e in p])
    for agreement in check_agreements(s):
        assert agreement.success, agreement.lines()
    _assert_reconciled(s, [e for p in log.partitions for e in p])


def test_the_reconciliation_takes_the_first_record_at_a_version_by_log_position(spark, settings):
    """A forged record before the real one takes its version, also when later batches hold the real one: the
    reconciliation reads the archive in log order (partition, offset), as the projection decided."""
    from eventlake.generator import GeneratorConfig
    from tests.domain_helpers import events_for
    from tests.log_strategies import forged

    clean = events_for(GeneratorConfig(accounts=1, commands=8, seed=3, run_id="order"))
    # The forgeries wait for version 1 in the first batch, then take versions 2.. in the second; the real
    # events there are version conflicts. (delta-rs lists the archive's newest file first.)
    rounds = [[forged(e, f"forged-{e.aggregate_version}") for e in clean[1:]], clean]
    for published in rounds:
        _publish(settings, [(0, e) for e in published])
        Projection(spark, settings, log=lambda *_: None).run_until_caught_up()
    assert_matches_oracle(spark, settings, [e for r in rounds for e in r])
    _assert_reconciled(settings, [e for r in rounds for e in r])
