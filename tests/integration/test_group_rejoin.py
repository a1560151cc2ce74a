"""A process manager whose group consumer never rejoins after losing its session replaces it (issue 14).

librdkafka sometimes never rejoins the group after the broker restarts: in a CI run of
test_services_broker_restart.py the fraud detector and the policy read nothing after the restart, so the findings
sent after it were never flagged. Made to happen here, on the run's own thread: the consumer's first assignment is
taken back as on a lost session, and the group (which still counts it as the owner) never assigns it again.
Without kafka_clients.RejoinWatch the service would read nothing for ever.
"""
from __future__ import annotations

import threading
import uuid

import pytest

from event_store import kafka_log
from event_store.account import AccountState
from event_store.account.fraud_consumer import FraudConsumer
from event_store.account.policy import FraudPolicy
from event_store.decider import execute
from event_store.envelope import CommandEnvelope
from tests.integration.services import wait_for
from tests.integration.test_fraud_detector import script

pytestmark = pytest.mark.slow

FLAGGED = [("a2", "rapid_attempts"), ("a3", "amount_above_max"), ("a4", "location_mismatch")]


def _stuck_after_first_assignment(service) -> None:
    """The service's first assignment is lost at once (as when the broker went away past the session timeout),
    and it is given a short wait before it counts as overdue to rejoin."""
    real_assign, first = service._on_assign, [True]

    def on_assign(consumer, partitions):
        real_assign(consumer, partitions)
        if first[0] and partitions:
            first[0] = False
            service._on_lost(consumer, consumer.assignment())

    service._on_assign = on_assign
    service._rejoin.wait_s = 2.0


def _run(service, lines: list[str], until):
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        assert wait_for(until, 90, every_s=0.5), lines[-10:]
    finally:
        service.stop()
        thread.join(30)
    assert not thread.is_alive()


def _commands(settings, kind: str) -> list[CommandEnvelope]:
    commands = (CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic))
    return [c for c in commands if c.command_type == kind]


def test_a_fraud_detector_that_does_not_rejoin_replaces_its_consumer_and_flags_every_finding(settings):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in script()])
    producer.close()
    lines: list[str] = []
    detector = FraudConsumer(settings, log=lines.append)
    _stuck_after_first_assignment(detector)

    _run(detector, lines, lambda: len(_commands(settings, "FlagFraud")) >= len(FLAGGED))

    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in _commands(settings, "FlagFraud")) == \
        sorted(FLAGGED)
    assert detector.stats.consumers_renewed >= 1
    assert any("group session lost" in line for line in lines), lines
    assert any("replacing its consumer" in line for line in lines), lines


def _flagged_accounts(accounts: list[str]) -> list:
    """Each account opened, then flagged (FraudSuspected): the events the policy answers with FreezeAccount."""
    events = []
    for account in accounts:
        state = AccountState(account)
        for kind, payload in (("OpenAccount", {"customer_id": "c", "credit_limit_minor": 100_000, "currency": "USD"}),
                              ("FlagFraud", {"payment_id": f"{account}-p1", "rule": "amount_above_max"})):
            state, new, result = execute(state, CommandEnvelope.create(kind, account, payload))
            assert result.accepted, result
            events += new
    return events


def test_a_policy_that_does_not_rejoin_replaces_its_consumer_and_freezes_every_flagged_account(settings):
    settings = settings.replace(policy_group_id=f"policy-{uuid.uuid4().hex[:8]}")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    accounts = [f"acc-{i}" for i in range(6)]  # spread over the three partitions
    events = _flagged_accounts(accounts)
    assert sum(e.event_type == "FraudSuspected" for e in events) == len(accounts)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    producer.close()
    lines: list[str] = []
    policy = FraudPolicy(settings, log=lines.append)
    _stuck_after_first_assignment(policy)

    _run(policy, lines, lambda: {c.aggregate_id for c in _commands(settings, "FreezeAccount")} >= set(accounts))

    assert {c.aggregate_id for c in _commands(settings, "FreezeAccount")} == set(accounts)
    assert policy.stats.consumers_renewed >= 1
    assert any("group session lost" in line for line in lines), lines
    assert any("replacing its consumer" in line for line in lines), lines
