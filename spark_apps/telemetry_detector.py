"""The telemetry detector: a stateful Structured Streaming app keyed by device, with event-time timers
(``transformWithStateInPandas``).

It is the IoT domain's detector, the twin of the account's fraud detector (``spark_apps/fraud_detector.py``). It
reads the device events of the events topic (``DeviceRegistered``, ``ReadingRecorded``, ``DeviceDecommissioned``),
folds each device's events in version order through the pure rules of ``event_store.iot.telemetry_rules``
(``detect``; ``on_timer`` when its timer fires), and writes each finding to the commands topic as a
``FlagTelemetryAnomaly`` command for the device aggregate type. It never writes events: the command handler records
``TelemetryAnomalyDetected``, so the events topic keeps a single writer and gap-free versions. A finding's command id
is ``flag_command_id(device, rule, anchor)`` (the reading that completed a run, or the time the silence started), so
a replay, a batch redone after a crash or Kafka's at-least-once sink flags nothing twice: the handler answers a
repeated command id with its first result. Events at or below a device's last folded version change nothing.

**Why transformWithState.** The silence rule fires on the *absence* of events, so it needs a timer, and the rules
work in event time. ``transformWithStateInPandas`` (state API v2) with ``TimeMode "EventTime"`` keeps per-device
timers in the state store next to the state (RocksDB: it requires that provider), any number per key, fired as the
watermark passes them. ``applyInPandasWithState`` has one timeout per key and no event-time timers of its own kind
(``GroupStateTimeout.EventTimeTimeout`` is the same idea with a single timestamp); it was not needed.

**Event time.** A reading's event time is its ``measured_at`` (the envelope's ``occurred_at``): the rules order
readings by it and measure silences in it. Registration and decommissioning are dated by the command's
``issued_at``; the rules use a registration's time as the first "last seen".

**The watermark** is the newest reading time the detector has seen, across every device and every partition,
minus ``WATERMARK_DELAY`` (10 minutes). Only readings carry it, each capped by its ``recorded_at`` (the handler's
clock), so a reading dated ahead of its recording moves it no further than that recording (as the windowed read
models' watermark). Registrations and decommissions have no event time for Spark (a null column): they never move
the watermark and are never dropped as late, so a decommission processed after the watermark passed its date still
stops the silence rule. Spark computes the watermark at the end of each micro-batch and uses it in the next one; it
never moves back, and it is kept in the checkpoint, so a restart goes on from it. A reading whose time is at or
before the previous batch's watermark is dropped by Spark before the rules see it: a reading up to the delay late
is placed by its ``measured_at`` (it may complete a run, extend one or split one), a later one is not judged by
the detector at all (it is still in the log and the read models).

**Timers.** Each device has at most one timer, at ``next_timer_ms(state)``: the first millisecond past its
heartbeat after the newest event time it is known at (registration or reading). Every batch that changes a device
moves its timer; a decommissioned device, or one whose silence is flagged, has none. A timer fires in the first
batch whose watermark has reached it, and ``on_timer`` then flags the silence once (dated at its deadline, so the
command id does not depend on when it fired). So a device that last reported at ``t`` is flagged once the detector
has processed a reading, of *any* device, measured after ``t + heartbeat + WATERMARK_DELAY``, in the micro-batch
after the one that carried that reading. Spark runs that batch at once even when no new data follows (a "no-data
batch", run whenever the watermark moved; also at the end of ``--until-caught-up``), so a silence does not wait
for the next record. A device whose deadline the watermark had already passed when its events were folded (a
device seen for the first time long after it went silent) is flagged in that same batch.

**What that means for a whole-fleet silence.** Event time advances only with readings. If every device stops
reporting (the site's network is down, the handler or the producers stop), the watermark stops too, and no
silence is flagged, however long it lasts: the timers wait. When readings come back, every device silent past its
heartbeat (plus the delay) before the newest of them is flagged at once, dated at its own deadline. Likewise one
chatty device advances the clock for all, and a partition whose devices report behind the others by more than the
delay has its readings dropped as late and its devices flagged silent. A fleet-wide outage is a processing-time
question (no reading *arrived* for a while), which this detector does not ask: watch the events topic's lag or
the newest ``measured_at`` in ``device_status`` for that.

Run it with ``eventlake detect-anomalies [--until-caught-up]`` or spark-submit this file.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from event_store.iot import AGGREGATE_TYPE
from event_store.iot.telemetry_rules import (Finding, Observation, TelemetryState, decode_state, detect,
                                             encode_state, flag_command_id, next_timer_ms, on_timer)
from lakehouse.settings import Settings
from spark_apps import detector_app
from spark_apps.detector_app import run_detector, run_service, start_findings_query
from spark_apps.events import parse_events

__all__ = ["TelemetryDetector", "fold_rows", "WATERMARK_DELAY",
           "STATE_STORE_CONF", "main", "run_detection"]

_INPUT_TYPES = ("DeviceRegistered", "ReadingRecorded", "DeviceDecommissioned")
_INPUT_COLUMNS = ("aggregate_version", "event_type", "reading_id", "value_milli", "range_min_milli",
                  "range_max_milli", "heartbeat_interval_s")
_OUTPUT_SCHEMA = ("device_id string, rule string, reading_id string, time_ms long, evidence string, "
                  "command_id string")
_STATE_SCHEMA = "state string"
# How late a reading may be and still be judged, and how long after its heartbeat a silence waits for readings of
# other devices (see the module docstring). The windowed read models allow the same.
WATERMARK_DELAY = "10 minutes"

STATE_STORE_CONF = detector_app.STATE_STORE_CONF  # RocksDB with changelog checkpoints (detector_app)


def _int(value: Any) -> int | None:
    # Spark longs with nulls reach pandas as float64 (NaN for null); |values| <= 10^12 are exact there.
    return None if value is None or value != value else int(value)


def fold_rows(state: TelemetryState, rows) -> tuple[TelemetryState, list[Finding]]:
    """One device's new event rows (a pandas frame, any order) folded in version order -> (state, findings)."""
    findings: list[Finding] = []
    for r in rows.sort_values("aggregate_version").itertuples(index=False):
        state, found = detect(state, Observation(
            r.event_type, int(r.aggregate_version), int(r.time_ms), r.reading_id, _int(r.value_milli),
            _int(r.range_min_milli), _int(r.range_max_milli), _int(r.heartbeat_interval_s)))
        findings += found
    return state, findings


def _output(device_id: str, findings: list[Finding]):
    import pandas as pd

    return pd.DataFrame([{"device_id": device_id, "rule": f.rule, "reading_id": f.reading_id, "time_ms": f.time_ms,
                          "evidence": f.evidence, "command_id": flag_command_id(device_id, f.rule, f.anchor)}
                         for f in findings], columns=["device_id", "rule", "reading_id", "time_ms", "evidence",
                                                      "command_id"])


def _processor():
    """A new StatefulProcessor running the rules per device (defined here so that importing this module does
    not import pyspark; cloudpickle ships the class to the Python workers)."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class TelemetryProcessor(StatefulProcessor):
        def init(self, handle) -> None:
            self.handle = handle
            self.state = handle.getValueState("telemetry", _STATE_SCHEMA)

        def _load(self) -> TelemetryState:
            return decode_state(self.state.get()[0]) if self.state.exists() else TelemetryState()

        def _save(self, state: TelemetryState, expired: int | None = None) -> None:
            """Store ``state`` and keep exactly one timer, at ``next_timer_ms(state)`` (or none)."""
            self.state.update((encode_state(state),))
            due = next_timer_ms(state)
            timers = [t for t in self.handle.listTimers() if t != expired]  # a fired timer is removed by Spark
            for t in timers:
                if t != due:
                    self.handle.deleteTimer(t)
            if due is not None and due not in timers:
                self.handle.registerTimer(due)

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            state, findings = fold_rows(self._load(), pd.concat(list(rows), ignore_index=True))
            # A silence the watermark has already passed needs no timer: it is due in this batch.
            state, silent = on_timer(state, timerValues.getCurrentWatermarkInMs())
            self._save(state)
            if findings or silent:
                yield _output(key[0], findings + silent)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator:
            if not self.state.exists():
                return
            state, silent = on_timer(self._load(), timerValues.getCurrentWatermarkInMs())
            self._save(state, expired=expiredTimerInfo.getExpiryTimeInMs())
            if silent:
                yield _output(key[0], silent)

        def close(self) -> None:
            pass

    return TelemetryProcessor()


class TelemetryDetector:
    def __init__(self, spark, settings: Settings, log: Callable[[str], None] = print,
                 watermark_delay: str = WATERMARK_DELAY):
        self.spark, self.settings, self.log, self.watermark_delay = spark, settings, log, watermark_delay
        self.checkpoint = settings.checkpoints / "telemetry-detector"

    def findings(self, records):
        """Kafka records -> FlagTelemetryAnomaly command records (key, value) for the Kafka sink."""
        from pyspark.sql import functions as F

        events, _ = parse_events(records)  # invalid records are the projection's dead letters, not ours
        is_reading = F.col("event_type") == "ReadingRecorded"
        observed = (events.filter((F.col("aggregate_type") == AGGREGATE_TYPE) & F.col("event_type").isin(*_INPUT_TYPES))
                    .select("aggregate_id", *_INPUT_COLUMNS,
                            (F.unix_micros("occurred_at") / 1000).cast("long").alias("time_ms"),
                            # Spark's event time: readings only, on the handler's clock (module docstring).
                            F.when(is_reading, F.least("occurred_at", "recorded_at")).alias("event_time"))
                    .withWatermark("event_time", self.watermark_delay))
        found = observed.groupBy("aggregate_id").transformWithStateInPandas(
            _processor(), _OUTPUT_SCHEMA, "Append", "EventTime")
        iso = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
        occurred = F.date_format(F.timestamp_millis("time_ms"), iso)
        command = F.struct(
            F.col("command_id"), F.lit("FlagTelemetryAnomaly").alias("command_type"),
            F.col("device_id").alias("aggregate_id"), F.lit(AGGREGATE_TYPE).alias("aggregate_type"),
            F.struct("rule", "reading_id", "evidence", occurred.alias("occurred_at")).alias("payload"),
            F.date_format(F.current_timestamp(), iso).alias("issued_at"),
            F.col("command_id").alias("correlation_id"), F.lit("telemetry-detector").alias("causation_id"))
        return found.select(F.col("device_id").alias("key"), F.to_json(command).alias("value"))

    def start(self, until_caught_up: bool = False):
        return start_findings_query(self, "telemetry_detector", "telemetry detector", until_caught_up, STATE_STORE_CONF)


def run_detection(settings: Settings, until_caught_up: bool = False) -> int:
    """Run the telemetry detector (what ``main`` and the CLI run)."""
    return run_detector(settings, "telemetry_detector", "telemetry detector", "FlagTelemetryAnomaly",
                        TelemetryDetector, until_caught_up)


def main(argv: list[str] | None = None) -> int:
    return run_service(argv, "telemetry_detector", __doc__.splitlines()[0], "telemetry detector", "FlagTelemetryAnomaly", TelemetryDetector)


if __name__ == "__main__":
    raise SystemExit(main())
