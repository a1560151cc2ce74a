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

import functools
import json
from dataclasses import replace
from typing import Callable, Iterator

from event_store.account import AGGREGATE_TYPE
from event_store.account.fraud_rules import FraudState, Observation, detect, flag_command_id
from event_store.personal_data import TOKEN_PREFIX, is_sealed
from event_store.sealing import Unsealer
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


# home -> the Unsealer of its key store, per Python worker (Spark reuses its workers from batch to batch)
_UNSEALERS: dict[str, Unsealer] = {}


def _unsealer(settings: Settings) -> Unsealer:
    unsealer = _UNSEALERS.get(str(settings.home))
    if unsealer is None:
        unsealer = _UNSEALERS[str(settings.home)] = Unsealer(settings)
    return unsealer


class _Locations:
    """One account's sealed device and payment locations opened for rule 3 (null once its subject is forgotten),
    and the token each opened value came from, so the state is stored with tokens again: Spark's state store and
    its checkpoints never hold a location in plain text (the Kafka consumer detector's ``_opened``/``_sealed``)."""

    def __init__(self, unsealer: Unsealer):
        self.unsealer, self.tokens = unsealer, {}

    def opened(self, value):
        if not is_sealed(value):
            return value
        plain = self.unsealer.value(value, "location")
        if plain is not None:
            self.tokens.setdefault(plain, value)
        return plain

    def sealed(self, state: FraudState) -> FraudState:
        return replace(state, devices=tuple((t, self.tokens.get(location, location) if location is not None
                                             else None) for t, location in state.devices))


def detect_in_group(key, frames, state, settings: Settings | None = None) -> Iterator:
    """applyInPandasWithState function: one account's new events (any order) -> its findings. With ``settings``
    (``functools.partial``), sealed locations are opened through its home's key store and kept sealed in the
    state (``_Locations``)."""
    import pandas as pd

    current = _decode(state.get[0]) if state.exists else FraudState()
    rows = pd.concat(list(frames), ignore_index=True).sort_values("aggregate_version")
    locations = None
    if settings is not None and (rows["location"].str.startswith(TOKEN_PREFIX, na=False).any()
                                 or any(is_sealed(location) for _, location in current.devices)):
        unsealer = _unsealer(settings)
        unsealer.refresh()  # a subject forgotten since reads as null from now on
        locations = _Locations(unsealer)
        current = replace(current, devices=tuple((t, locations.opened(v)) for t, v in current.devices))
        rows["location"] = [locations.opened(v) for v in rows["location"]]
    findings = []
    for r in rows.itertuples(index=False):
        current, found = detect(current, Observation(
            r.event_type, int(r.aggregate_version), int(r.time_ms), r.payment_id,
            None if pd.isna(r.amount_minor) else int(r.amount_minor), None if pd.isna(r.location) else r.location))
        findings += found
    state.update((_encode(locations.sealed(current) if locations is not None else current),))
    if findings:
        yield pd.DataFrame([{"account_id": key[0], "payment_id": f.payment_id, "rule": f.rule, "time_ms": f.time_ms,
                             "evidence": f.evidence, "command_id": flag_command_id(f.payment_id, f.rule)}
                            for f in findings])


class FraudDetector:
    def __init__(self, spark, settings: Settings, log: Callable[[str], None] = print):
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
            functools.partial(detect_in_group, settings=self.settings), _OUTPUT_SCHEMA, _STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
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
    return run_detector(settings, "fraud_detector", "fraud detector", "FlagFraud", FraudDetector, until_caught_up)


def main(argv: list[str] | None = None) -> int:
    return run_service(argv, "fraud_detector", __doc__.splitlines()[0], "fraud detector", "FlagFraud", FraudDetector)


if __name__ == "__main__":
    raise SystemExit(main())
