"""The fraud detector on a scripted stream: each rule fires exactly where expected and nowhere else."""
import pytest

from event_store import kafka_log
from event_store.account import AccountState
from event_store.envelope import CommandEnvelope
from event_store.account.fraud_rules import flag_command_id
from event_store.decider import execute
from spark_apps.fraud_detector import FraudDetector

pytestmark = pytest.mark.slow


def at(seconds: int) -> str:
    return f"2026-03-01T10:{seconds // 60:02d}:{seconds % 60:02d}.000Z"


def script(sealer=None):
    """Commands for three accounts -> their events, through the pure core (with ``sealer``: sealed as the handler
    seals them)."""
    def opened(account):
        return ("OpenAccount", account, {"customer_id": f"c-{account}", "credit_limit_minor": 100_000,
                                         "currency": "USD"})

    def pay(account, pid, amount, location, seconds):
        return ("AuthorizePayment", account, {"payment_id": pid, "amount_minor": amount, "currency": "USD",
                                              "merchant_id": "m1", "location": location, "occurred_at": at(seconds)})

    def device(account, location, seconds):
        return ("ReportDeviceLocation", account, {"location": location, "occurred_at": at(seconds)})

    commands = [
        opened("acc-a"), device("acc-a", "US-NYC", 0),
        pay("acc-a", "a1", 100, "US-NYC", 60),      # first payment: nothing
        pay("acc-a", "a2", 50, "US-NYC", 65),       # 5 s after a1: rapid_attempts
        pay("acc-a", "a3", 500, "US-NYC", 200),     # larger than every earlier one: amount_above_max
        pay("acc-a", "a4", 10, "GB-LON", 400),      # device is in US-NYC: location_mismatch
        opened("acc-b"),
        pay("acc-b", "b1", 100, "FR-PAR", 10),      # no device location yet: nothing
        pay("acc-b", "b2", 100, "DE-BER", 40),      # equal amount, 30 s apart: nothing
        opened("acc-c"), device("acc-c", "US-SFO", 100),
        pay("acc-c", "c1", 70, "US-CHI", 50),       # device report is later in event time: nothing
    ]
    states, events = {}, []
    for kind, account, payload in commands:
        state = states.get(account) or AccountState(account)
        states[account], new, result = execute(state, CommandEnvelope.create(kind, account, payload),
                                               sealer=sealer)
        assert result.accepted, result
        events += new
    return events


def test_each_rule_fires_exactly_where_expected_and_a_replay_flags_nothing_twice(spark, settings):
    events = script()
    _detects_the_script(spark, settings, events)


def test_with_sealing_on_the_locations_are_opened_for_the_rule_and_the_state_keeps_them_sealed(spark, settings):
    """Issue 45: the events' locations are tokens (the handler sealed them); the detector's Python workers open
    them through the home's key store, and Spark's state store (RocksDB, and its checkpoint) holds tokens only."""
    from event_store.personal_data import is_sealed
    from event_store.sealing import Sealer

    settings = settings.replace(personal_data_seal="on")
    kafka_log.ensure_topics(settings, log=lambda *_: None)  # the keys topic the sealer publishes its keys to
    sealer = Sealer.for_settings(settings)
    events = script(sealer)
    sealer.sync()
    assert is_sealed(next(e for e in events if e.event_type == "DeviceLocationReported").payload["location"])
    flags = _detects_the_script(spark, settings, events)
    assert {c.payload["payment_id"]: c.payload["evidence"] for c in flags}["a4"] == \
        "payment at GB-LON, device at US-NYC"
    states = [r.asDict(recursive=True) for r in spark.read.format("statestore").load(
        str(settings.checkpoints / "fraud-detector")).collect()]
    assert len(states) == 3
    held = " ".join(str(r["value"]) for r in states)
    assert "elk1:" in held and "US-NYC" not in held and "US-SFO" not in held, held


def _detects_the_script(spark, settings, events) -> list:
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic,
                          [(e.aggregate_id, e.to_json()) for e in events + events[:6]])  # a replayed stretch too
    producer.close()

    FraudDetector(spark, settings, log=lambda *_: None).start(until_caught_up=True).awaitTermination()
    flags = [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]
    expected = {("a2", "rapid_attempts"), ("a3", "amount_above_max"), ("a4", "location_mismatch")}
    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in flags) == sorted(expected)
    for c in flags:
        assert c.command_type == "FlagFraud" and c.aggregate_id == "acc-a"
        assert c.command_id == flag_command_id(c.payload["payment_id"], c.payload["rule"])
    assert {c.payload["payment_id"]: c.payload["occurred_at"] for c in flags}["a2"] == at(65)
    return flags


HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@pytest.mark.parametrize("first_provider", ["default", "hdfs"])
def test_a_restarted_detector_keeps_each_accounts_state(spark, settings, monkeypatch, first_provider):
    """Stopped after acc-a's first payment and started again, the detector still flags a2 (5 s after a1), a3 (above
    a1's amount) and a4 (away from the device reported before the stop): the per-account state crossed the restart.
    A checkpoint made with Spark's default state store (before RocksDB was chosen, ``hdfs``) keeps using it."""
    import spark_apps.fraud_detector as detector

    events = script()
    split = next(i for i, e in enumerate(events) if e.payload.get("payment_id") == "a1") + 1
    kafka_log.ensure_topics(settings, log=lambda *_: None)

    def run(part):
        producer = kafka_log.make_producer(settings)
        kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in part])
        producer.close()
        FraudDetector(spark, settings, log=lambda *_: None).start(until_caught_up=True).awaitTermination()

    if first_provider == "hdfs":
        with monkeypatch.context() as m:
            m.setitem(detector.STATE_STORE_CONF, "spark.sql.streaming.stateStore.providerClass", HDFS_PROVIDER)
            run(events[:split])
    else:
        run(events[:split])
    assert not list(kafka_log.read_all(settings, settings.commands_topic))  # nothing to flag before the stop
    run(events[split:])

    flags = [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]
    assert sorted((c.payload["payment_id"], c.payload["rule"]) for c in flags) == sorted(
        [("a2", "rapid_attempts"), ("a3", "amount_above_max"), ("a4", "location_mismatch")])
    state_files = [p.name for p in (settings.checkpoints / "fraud-detector" / "state").rglob("*") if p.is_file()]
    if first_provider == "hdfs":  # Spark's own store: a .delta file per batch and partition, no changelog
        assert any(n.endswith(".delta") for n in state_files) and not any(n.endswith(".changelog") for n in state_files)
    else:  # RocksDB with changelog checkpoints
        assert any(n.endswith(".changelog") for n in state_files), state_files
