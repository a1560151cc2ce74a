"""The fraud detector: a stateful Structured Streaming app keyed by account (``applyInPandasWithState``).

It is the account domain's detector. It reads payment and device-location events, runs the pure rules of
``event_store.account.fraud_rules`` in event time, and writes each finding to the commands topic as a
``FlagFraud`` command for the account aggregate type. It never writes events: the command handler records
``FraudSuspected``, so the events topic keeps a single writer and gap-free versions. A finding's command id
derives from payment and rule, so a replay (or Kafka's at-least-once sink) flags nothing twice: the handler
answers a repeated command id with the first result.

Run it with ``eventlake detect-fraud [--until-caught-up]`` or spark-submit this file.
"""
from __future__ import annotations

import json
from typing import Callable, Iterator

from event_store.account import AGGREGATE_TYPE
from event_store.account.fraud_rules import FraudState, Observation, detect, flag_command_id
from event_store.sealing import refuse_spark
from lakehouse.settings import Settings
from spark_apps import detector_app
from spark_apps.detector_app import run_detector, run_service, start_findings_query
from spark_apps.events import parse_events

__all__ = ["FraudDetector", "main", "run_detection"]

_INPUT_TYPES = ("PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported")
_OUTPUT_SCHEMA = ("account_id string, payment_id string, rule string, time_ms long, evidence string, "
                  "command_id string")
_STATE_SCHEMA = "state string"

STATE_STORE_CONF = detector_app.STATE_STORE_CONF  # RocksDB with changelog checkpoints (detector_app)


def _encode(state: FraudState) -> str:
    return json.dumps([state.last_version, state.max_amount, state.attempts, state.devices])


def _decode(text: str) -> FraudState:
    last_version, max_amount, attempts, devices = json.loads(text)
    return FraudState(last_version, max_amount, tuple(map(tuple, attempts)), tuple(map(tuple, devices)))


def detect_in_group(key, frames, state) -> Iterator:
    """applyInPandasWithState function: one account's new events (any order) -> its findings."""
    import pandas as pd

    current = _decode(state.get[0]) if state.exists else FraudState()
    rows = pd.concat(list(frames), ignore_index=True).sort_values("aggregate_version")
    findings = []
    for r in rows.itertuples(index=False):
        current, found = detect(current, Observation(
            r.event_type, int(r.aggregate_version), int(r.time_ms), r.payment_id,
            None if pd.isna(r.amount_minor) else int(r.amount_minor), r.location))
        findings += found
    state.update((_encode(current),))
    if findings:
        yield pd.DataFrame([{"account_id": key[0], "payment_id": f.payment_id, "rule": f.rule, "time_ms": f.time_ms,
                             "evidence": f.evidence, "command_id": flag_command_id(f.payment_id, f.rule)}
                            for f in findings])


class FraudDetector:
    def __init__(self, spark, settings: Settings, log: Callable[[str], None] = print):
        refuse_spark(settings, "fraud detector (engine spark)")  # rule 3 compares plain locations
        self.spark, self.settings, self.log = spark, settings, log
        self.checkpoint = settings.checkpoints / "fraud-detector"

    def findings(self, records):
        """Kafka records -> FlagFraud command records (key, value) for the Kafka sink."""
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        events, _ = parse_events(records)  # invalid records are the projection's dead letters, not ours
        observed = (events.filter(F.col("event_type").isin(*_INPUT_TYPES))
                    .select("aggregate_id", "aggregate_version", "event_type", "payment_id", "amount_minor",
                            "location", (F.unix_micros("occurred_at") / 1000).cast("long").alias("time_ms")))
        found = observed.groupBy("aggregate_id").applyInPandasWithState(
            detect_in_group, _OUTPUT_SCHEMA, _STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
        iso = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
        occurred = F.date_format(F.timestamp_millis("time_ms"), iso)
        command = F.struct(
            F.col("command_id"), F.lit("FlagFraud").alias("command_type"), F.col("account_id").alias("aggregate_id"),
            F.lit(AGGREGATE_TYPE).alias("aggregate_type"),
            F.struct("payment_id", "rule", "evidence", occurred.alias("occurred_at")).alias("payload"),
            F.date_format(F.current_timestamp(), iso).alias("issued_at"),
            F.col("command_id").alias("correlation_id"), F.lit("fraud-detector").alias("causation_id"))
        return found.select(F.col("account_id").alias("key"), F.to_json(command).alias("value"))

    def start(self, until_caught_up: bool = False):
        return start_findings_query(self, "fraud_detector", "fraud detector", until_caught_up, STATE_STORE_CONF)


def run_detection(settings: Settings, until_caught_up: bool = False) -> int:
    """Run the fraud detector (what ``main`` and the CLI run)."""
    refuse_spark(settings, "fraud detector (engine spark)")  # before Spark starts
    return run_detector(settings, "fraud_detector", "fraud detector", "FlagFraud", FraudDetector, until_caught_up)


def main(argv: list[str] | None = None) -> int:
    return run_service(argv, "fraud_detector", __doc__.splitlines()[0], "fraud detector", "FlagFraud", FraudDetector)


if __name__ == "__main__":
    raise SystemExit(main())
