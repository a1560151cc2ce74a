"""The fraud detector consumer (``eventlake detect-fraud``'s default engine) against the real broker: each rule fires
exactly where expected, a replay and hostile records flag nothing, the state crosses a restart and a kill -9."""
from __future__ import annotations

import json
import random
import time
from datetime import datetime, timedelta, timezone

import pytest

from event_store import kafka_log
from event_store.account import AccountState
from event_store.account.fraud_consumer import FraudConsumer, observation
from event_store.account.fraud_state import SNAPSHOT_FOLDER, STATE_FOLDER
from event_store.account.fraud_rules import FraudState, detect, flag_command_id
from event_store.decider import execute
from event_store.envelope import CommandEnvelope
from tests.integration.services import Service, service_env, wait_for
from tests.integration.test_fraud_detector import script

QUIET = {"log": lambda *_: None}


def _publish(settings, events, extra=()):
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic,
                          [(e.aggregate_id, e.to_json()) for e in events] + list(extra))
    producer.close()


def _flags(settings) -> list[CommandEnvelope]:
    return [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]


def _oracle(events) -> set[tuple[str, str, str]]:
    found, states = set(), {}
    for e in sorted(events, key=lambda e: (e.aggregate_id, e.aggregate_version)):
        if e.event_type in ("PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported"):
            states[e.aggregate_id], new = detect(states.get(e.aggregate_id, FraudState()), observation(e))
            found |= {(e.aggregate_id, f.payment_id, f.rule) for f in new}
    return found


EXPECTED = [("a2", "rapid_attempts"), ("a3", "amount_above_max"), ("a4", "location_mismatch")]


@pytest.mark.slow
def test_each_rule_fires_exactly_where_expected_and_replays_and_hostile_records_flag_nothing(settings):
    events = script()
    kafka_log.ensure_topics(settings, **QUIET)
    forged = dict(json.loads(next(e for e in events if e.event_type == "PaymentAuthorized").to_json()))
    del forged["payload"]["amount_minor"]  # a PaymentAuthorized written around the handler, without an amount
    hostile = [("acc-a", b"\xff not json PaymentAuthorized"), ("acc-a", json.dumps(forged).encode()),
               ("acc-a", b"x" * 500_000)]
    lines: list[str] = []
    _publish(settings, events + events[:6], hostile)  # a replayed stretch, then records that are no events

    stats = FraudConsumer(settings, log=lines.append).run(until_caught_up=True)

    flags = _flags(settings)
    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in flags) == sorted(EXPECTED)
    for c in flags:
        assert c.command_type == "FlagFraud" and c.aggregate_id == "acc-a"
        assert c.command_id == flag_command_id(c.payload["payment_id"], c.payload["rule"])
    assert stats.skipped == 2 and stats.findings == 3
    skipped = [line for line in lines if line.startswith("fraud detector: skipped events record")]
    assert len(skipped) == 2 and any("amount_minor" in line for line in skipped), lines


@pytest.mark.slow
def test_a_restarted_detector_keeps_each_accounts_state_in_its_snapshots(settings):
    """Stopped after acc-a's first payment and started again (a new process would do the same: the state is read
    from the snapshots), the detector still flags a2, a3 and a4."""
    events = script()
    split = next(i for i, e in enumerate(events) if e.payload.get("payment_id") == "a1") + 1
    kafka_log.ensure_topics(settings, **QUIET)
    _publish(settings, events[:split])
    FraudConsumer(settings, **QUIET).run(until_caught_up=True)
    assert not _flags(settings)
    snapshots = sorted(p.name for p in (settings.checkpoints / SNAPSHOT_FOLDER).iterdir())
    assert snapshots and all(name.startswith("partition-") and name.endswith(".json") for name in snapshots)

    _publish(settings, events[split:])
    FraudConsumer(settings, **QUIET).run(until_caught_up=True)
    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in _flags(settings)) == sorted(EXPECTED)
    from event_store.account.fraud_state import status_line
    from spark_apps.status import log_end

    assert status_line(settings, log_end(settings)).startswith(
        "fraud detector (eventlake detect-fraud): lag 0 events at its last state snapshots (3 partition(s), newest 20")


def _random_stream(accounts: int, payments: int, seed: int = 7):
    """Many accounts' events through the pure core: payments at random amounts, places and times, device reports."""
    rng = random.Random(seed)
    start = datetime(2026, 3, 1, 10, tzinfo=timezone.utc)
    states, events = {}, []

    def at(seconds: float) -> str:
        return (start + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    commands = [("OpenAccount", f"acc-{a}", {"customer_id": "c", "credit_limit_minor": 10**9, "currency": "USD"})
                for a in range(accounts)]
    clock = {a: 0.0 for a in range(accounts)}
    for i in range(payments):
        a = rng.randrange(accounts)
        clock[a] += rng.choice([2, 5, 30, 60, 120])
        place = rng.choice(["US-NYC", "US-NYC", "US-NYC", "GB-LON"])
        if rng.random() < 0.2:
            commands.append(("ReportDeviceLocation", f"acc-{a}", {"location": place, "occurred_at": at(clock[a])}))
        else:
            commands.append(("AuthorizePayment", f"acc-{a}", {
                "payment_id": f"p{i}", "amount_minor": rng.randint(100, 10_000), "currency": "USD",
                "merchant_id": "m1", "location": place, "occurred_at": at(clock[a])}))
    for kind, account, payload in commands:
        state = states.get(account) or AccountState(account)
        states[account], new, result = execute(state, CommandEnvelope.create(kind, account, payload))
        events += new
    return events


@pytest.mark.slow
def test_killed_with_sigkill_mid_stream_and_started_again_no_finding_is_lost_or_changed(settings, tmp_path):
    """`eventlake detect-fraud` killed (-9) between two snapshots while events arrive, then started again: the
    findings equal the rules' over the whole log; what it flagged again carries the same command ids (the handler
    answers those as duplicates)."""
    events = _random_stream(accounts=40, payments=3_000)
    expected = _oracle(events)
    assert len(expected) > 100
    kafka_log.ensure_topics(settings, **QUIET)
    env = service_env(settings)
    third = len(events) // 3
    _publish(settings, events[:third])
    service = Service("detect-fraud", ["detect-fraud"], env, tmp_path)
    try:
        folder = settings.checkpoints / SNAPSHOT_FOLDER
        assert wait_for(lambda: folder.exists() and any(folder.iterdir()), 120, every_s=0.5), service.tail()
        _publish(settings, events[third:2 * third])
        assert wait_for(lambda: len(_flags(settings)) > 0, 60, every_s=0.5), service.tail()
        time.sleep(1)
        service.kill()  # SIGKILL, between two snapshots (every 10 s)
        assert service.process.returncode == -9
    finally:
        service.kill()
    _publish(settings, events[2 * third:])
    again = Service("detect-fraud-again", ["detect-fraud", "--until-caught-up"], env, tmp_path)
    assert again.process.wait(180) == 0, again.tail()
    assert "from offset" in again.output(), again.tail()  # it started from its snapshots, not the log's start

    flags = _flags(settings)
    print(f"{len(events)} events, {len(expected)} findings, {len(flags)} FlagFraud records; after the restart:",
          again.output().splitlines()[-1])
    assert {(c.aggregate_id, c.payload["payment_id"], c.payload["rule"]) for c in flags} == expected
    assert all(c.command_id == flag_command_id(c.payload["payment_id"], c.payload["rule"]) for c in flags)


@pytest.mark.slow
def test_the_state_lives_on_disk_past_a_cache_of_nothing_and_a_lost_disk_restores_from_the_snapshot(settings):
    """Issue 42: with no cache at all every account's state is read from its partition's state store (LMDB under
    the home) and the findings are still the rules' own. The home lost (another machine), the next run copies the
    snapshots under the checkpoints into new stores and goes on from their offsets: every finding once, none
    twice, none missing."""
    import shutil

    settings = settings.replace(fraud_state_cache_mb=0)
    events = _random_stream(accounts=40, payments=1_500, seed=5)
    expected = _oracle(events)
    kafka_log.ensure_topics(settings, **QUIET)
    half = len(events) // 2
    _publish(settings, events[:half])
    first = FraudConsumer(settings, **QUIET).run(until_caught_up=True)
    assert first.state_writes and first.snapshots
    stores = settings.home / STATE_FOLDER
    assert sorted(p.name for p in stores.iterdir()) == [f"{settings.events_topic}-{n}" for n in range(3)]
    snapshot = (settings.checkpoints / SNAPSHOT_FOLDER / "partition-0.json").read_bytes().splitlines()
    header, accounts = json.loads(snapshot[0]), [json.loads(line)[0] for line in snapshot[1:]]
    assert header["partition"] == 0 and header["offset"] > 0 and accounts and len(set(accounts)) == len(accounts)

    shutil.rmtree(stores)
    _publish(settings, events[half:])
    lines: list[str] = []
    again = FraudConsumer(settings, log=lines.append).run(until_caught_up=True)
    assert sum("copied from the snapshot" in line for line in lines) == 3, lines
    assert again.events == len(events) - half  # from the snapshots' offsets, not the log's start
    flags = [(c.aggregate_id, c.payload["payment_id"], c.payload["rule"]) for c in _flags(settings)]
    assert len(flags) == len(set(flags)) and set(flags) == expected


@pytest.mark.slow
def test_a_second_instance_takes_over_partitions_mid_stream_with_their_state(settings):
    """Two detectors in one group (two pods of the Deployment): the second joins while the first is working, the
    partitions it takes come with their snapshots, and together they flag exactly what the rules find."""
    import threading

    events = _random_stream(accounts=40, payments=3_000, seed=11)
    expected = _oracle(events)
    kafka_log.ensure_topics(settings, **QUIET)
    half = len(events) // 2
    _publish(settings, events[:half])
    first, second = FraudConsumer(settings, **QUIET), FraudConsumer(settings, **QUIET)
    threads = [threading.Thread(target=d.run, daemon=True) for d in (first, second)]
    threads[0].start()
    assert wait_for(lambda: first.stats.observed > 0, 60, every_s=0.2)
    threads[1].start()
    assert wait_for(lambda: second.stats.events > 0 or second._partitions, 60, every_s=0.2)
    _publish(settings, events[half:])

    def flagged():
        return {(c.aggregate_id, c.payload["payment_id"], c.payload["rule"]) for c in _flags(settings)}

    try:
        assert wait_for(lambda: flagged() >= expected, 120, every_s=1), len(expected - flagged())
    finally:
        first.stop(), second.stop()
        for t in threads:
            t.join(30)
    assert flagged() == expected
    assert first.stats.observed and second.stats.observed  # both did part of the work
