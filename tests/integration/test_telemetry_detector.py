"""The telemetry detector on scripted streams: each rule fires exactly where expected and nowhere else, in event
time (the watermark advanced by readings of other devices), across restarts of the detector; its
FlagTelemetryAnomaly commands are what the real handler records as TelemetryAnomalyDetected.

The events are made by the device aggregate through the pure core (the handler's ``execute``) and written to the
events topic, as test_fraud_detector does. Each ``detect`` below is one run of the detector until caught up: a new
query from the same checkpoint, so every phase after the first is a restart. Spark uses a batch's watermark in the
*next* batch; a run ends with a no-data batch that fires the timers the last data made due."""
import datetime as dt

import pytest

from event_store import iot, kafka_log
from event_store.decider import execute
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from event_store.iot.telemetry_rules import OUT_OF_RANGE_RUN, SILENT_DEVICE, flag_command_id
from spark_apps.telemetry_detector import WATERMARK_DELAY, TelemetryDetector

pytestmark = pytest.mark.slow

T0 = dt.datetime(2026, 3, 1, 10, tzinfo=dt.timezone.utc)
S = 1000  # ms
DELAY_S = 600
assert WATERMARK_DELAY == "10 minutes"  # the scripts' times below are chosen against it
IN, OUT = 20_000, 60_000  # every device's range is 0 .. 50 000 milli


def at(seconds: int) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Fleet:
    """Device commands decided by the aggregate (``execute``, as the handler does) -> the events to log."""

    def __init__(self):
        self.states = {}

    def _decide(self, kind: str, device: str, payload: dict, **envelope) -> list[EventEnvelope]:
        state = self.states.get(device) or iot.DeviceState(device)
        self.states[device], events, result = execute(state, CommandEnvelope.create(kind, device, payload, **envelope))
        assert result.accepted, result
        return events

    def register(self, device: str, heartbeat_s: int = 3600, seconds: int = 0) -> list[EventEnvelope]:
        return self._decide("RegisterDevice", device, {
            "site_id": "site-1", "sensor_kind": "temperature", "unit": "C", "range_min_milli": 0,
            "range_max_milli": 50_000, "heartbeat_interval_s": heartbeat_s}, issued_at=at(seconds))

    def read(self, device: str, *readings: tuple[int, int]) -> list[EventEnvelope]:
        """Readings (seconds after T0, value_milli), each named ``<device>@<seconds>``."""
        return [e for seconds, value in readings for e in self._decide("RecordReading", device, {
            "reading_id": f"{device}@{seconds}", "value_milli": value, "unit": "C", "measured_at": at(seconds)})]

    def decommission(self, device: str, seconds: int) -> list[EventEnvelope]:
        return self._decide("DecommissionDevice", device, {"reason": "replaced"}, issued_at=at(seconds))


def produce(settings, events: list[EventEnvelope]) -> None:
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events])
    producer.close()


def detect(spark, settings) -> None:
    TelemetryDetector(spark, settings, log=lambda *_: None).start(until_caught_up=True).awaitTermination()


def flags(settings) -> list[CommandEnvelope]:
    return [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]


def found(settings) -> list[tuple[str, str, str | None]]:
    """(device, rule, reading_id) of every flag, sorted. A run's flag is checked here: its command id derives from
    the reading that completed the run, and it is dated at that reading's measured_at (silences: in the tests)."""
    out = []
    for c in flags(settings):
        assert (c.command_type, c.aggregate_type) == ("FlagTelemetryAnomaly", "device")
        p = c.payload
        if p["rule"] == OUT_OF_RANGE_RUN:
            assert c.command_id == flag_command_id(c.aggregate_id, OUT_OF_RANGE_RUN, p["reading_id"])
            assert p["occurred_at"] == at(int(p["reading_id"].split("@")[1]))
        out.append((c.aggregate_id, p["rule"], p.get("reading_id")))
    return sorted(out, key=str)


def test_each_rule_fires_exactly_where_expected_in_event_time_and_a_replay_flags_nothing_twice(spark, settings):
    fleet = Fleet()
    phase1 = [e for device, heartbeat_s in (("run", 3600), ("late", 3600), ("too-late", 3600), ("silent", 60),
                                            ("retired", 60), ("ticker", 3600))
              for e in fleet.register(device, heartbeat_s)]
    phase1 += fleet.read("run", (10, OUT), (20, OUT), (30, IN),    # a run of 2: nothing
                         (40, OUT), (50, OUT), (60, OUT),          # a run of 3: flagged at run@60
                         (70, OUT))                                # a 4th extends it: nothing
    phase1 += fleet.read("late", (100, OUT), (120, OUT), (130, IN))  # 100 and 120: a run of 2, not consecutive yet
    phase1 += fleet.read("too-late", (20, OUT), (25, OUT), (30, IN))
    phase1 += fleet.read("silent", (30, IN))        # its heartbeat (60 s) ends at 90 s
    phase1 += fleet.read("retired", (10, IN))       # its heartbeat ends at 70 s
    phase1 += fleet.read("ticker", (650, IN))       # the watermark after this phase: 650 - 600 = 50 s
    produce(settings, phase1)
    detect(spark, settings)
    assert found(settings) == [("run", OUT_OF_RANGE_RUN, "run@60")]

    phase2 = list(phase1)                           # the whole first phase replayed
    phase2 += fleet.read("run", (80, OUT))          # the run goes on across the restart: nothing
    phase2 += fleet.read("late", (110, OUT))        # late (after 120 s was seen) but after the watermark (50 s):
    #                                                 completes 100, 110, 120
    phase2 += fleet.read("too-late", (15, OUT))     # would complete 15, 20, 25, but is before the watermark (50 s):
    #                                                 Spark drops it before the rules see it
    phase2 += fleet.decommission("retired", 20)     # dated before the watermark too, and still folded (no event time
    #                                                 for Spark), so its silence is never flagged
    phase2 += fleet.read("ticker", (1000, IN))      # the watermark: 400 s, past silent's and retired's deadlines
    produce(settings, phase2)
    detect(spark, settings)
    expected = [("late", OUT_OF_RANGE_RUN, "late@110"), ("run", OUT_OF_RANGE_RUN, "run@60"),
                ("silent", SILENT_DEVICE, "silent@30")]
    assert found(settings) == expected
    silence = next(c for c in flags(settings) if c.payload["rule"] == SILENT_DEVICE)
    assert silence.command_id == flag_command_id("silent", SILENT_DEVICE, f"since:{(T0.timestamp() + 30) * S:.0f}")
    assert silence.payload["occurred_at"] == at(90)  # dated at the deadline, whenever the timer fired

    phase3 = fleet.read("ticker", (2000, IN))       # time goes on: the silence is flagged once, the rest stays quiet
    phase3 += fleet.register("mute", heartbeat_s=60, seconds=100)  # never heard from: silent since its registration,
    #                                                 past its deadline (160 s) when it first reaches the detector
    produce(settings, phase3)
    detect(spark, settings)
    expected.insert(1, ("mute", SILENT_DEVICE, None))
    assert found(settings) == expected
    mute = next(c for c in flags(settings) if c.aggregate_id == "mute")
    assert "reading_id" not in mute.payload and mute.payload["occurred_at"] == at(160)

    # The real handler takes the flags: each becomes a TelemetryAnomalyDetected on its device (whose events it
    # rebuilds from the events topic, the replay counted once), in the device's partition.
    with CommandHandler(settings, log=lambda *_: None) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
    results = [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]
    assert len(results) == 4 and all(r.status == "accepted" and not r.duplicate for r in results), results
    recorded = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    anomalies = [e for e in recorded if e.event_type == "TelemetryAnomalyDetected"]
    assert sorted(((e.aggregate_id, e.payload["rule"], e.payload.get("reading_id")) for e in anomalies),
                  key=str) == expected
    assert {e.command_id for e in anomalies} == {c.command_id for c in flags(settings)}


def test_a_restarted_detector_keeps_each_devices_state_and_timers(spark, settings):
    """A run of 2 before a stop and 1 after flags once; a timer set before the stop fires after it (the device
    sends nothing after the restart: only the timer, restored from the checkpoint, can flag it). The first run
    is the long-running service (a processing-time trigger), stopped once it has read everything."""
    fleet = Fleet()
    before = fleet.register("d") + fleet.register("quiet", heartbeat_s=60) + fleet.register("ticker")
    before += fleet.read("d", (10, OUT), (20, OUT))
    before += fleet.read("quiet", (30, IN))        # its heartbeat ends at 90 s
    before += fleet.read("ticker", (600, IN))      # the watermark: 0 s
    produce(settings, before)
    query = TelemetryDetector(spark, settings, log=lambda *_: None).start()
    query.processAllAvailable()
    query.stop()
    assert flags(settings) == []

    produce(settings, fleet.read("d", (30, OUT)) + fleet.read("ticker", (1000, IN)))  # the watermark: 400 s
    detect(spark, settings)
    assert found(settings) == [("d", OUT_OF_RANGE_RUN, "d@30"), ("quiet", SILENT_DEVICE, "quiet@30")]
    state_files = [p.name for p in (settings.checkpoints / "telemetry-detector" / "state").rglob("*") if p.is_file()]
    assert any(n.endswith(".changelog") for n in state_files), state_files  # RocksDB with changelog checkpoints
