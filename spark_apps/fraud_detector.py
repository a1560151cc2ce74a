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
from eventlake.settings import Settings
from spark_apps.events import parse_events, read_event_records
from spark_apps.projection import bound_query_stop

__all__ = ["FraudDetector", "main"]

_INPUT_TYPES = ("PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported")
_OUTPUT_SCHEMA = ("account_id string, payment_id string, rule string, time_ms long, evidence string, "
                  "command_id string")
_STATE_SCHEMA = "state string"

# Where the per-account state lives: RocksDB (off the JVM heap, so the driver's memory does not grow with the
# number of accounts) with changelog checkpoints (a batch writes only the states it changed, not a snapshot).
# The checkpoint records its provider: a checkpoint made with another one (Spark's default, before this) keeps it.
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


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
        s = self.settings
        bound_query_stop(self.spark)
        for key, value in STATE_STORE_CONF.items():
            self.spark.conf.set(key, value)
        records = read_event_records(self.spark, s)
        writer = (self.findings(records).writeStream.format("kafka").queryName("fraud_detector")
                  .option("kafka.bootstrap.servers", s.bootstrap_servers)
                  .option("kafka.acks", "all").option("kafka.enable.idempotence", "true")
                  .option("topic", s.commands_topic)
                  .option("checkpointLocation", str(self.checkpoint))
                  .outputMode("append"))
        writer = writer.trigger(availableNow=True) if until_caught_up else writer.trigger(
            processingTime=s.trigger_interval)
        query = writer.start()
        self.log(f"fraud detector: reading {s.events_topic}, flagging to {s.commands_topic} "
                 f"(checkpoint {self.checkpoint})")
        return query


def main(argv: list[str] | None = None) -> int:
    import argparse

    from eventlake.signals import stop_requested_on_sigterm
    from spark_apps.projection import stop_query
    from spark_apps.session import build_session

    parser = argparse.ArgumentParser(prog="fraud_detector", description=__doc__.splitlines()[0])
    parser.add_argument("--until-caught-up", action="store_true", help="process what the log holds now, then stop")
    args = parser.parse_args(argv)
    settings = Settings.load()
    # Installed before the (slow) session start, so that a SIGTERM meanwhile is not lost either.
    stop_requested = stop_requested_on_sigterm()
    spark = build_session(settings, app_name="eventlake-fraud-detector")
    query = FraudDetector(spark, settings).start(until_caught_up=args.until_caught_up)
    try:
        # Checked every second, whatever the query waits for (the broker may be away): a batch cut short commits
        # nothing, and the next start redoes it from the checkpoint (its findings' command ids repeat).
        while not stop_requested.is_set() and not query.awaitTermination(1):  # raises the query's failure
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop_query(query)  # bounded: a query waiting for an absent broker is left to end with the process
    read = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"fraud detector: {'stopped (SIGTERM) after reading' if stop_requested.is_set() else 'read'} {read} "
          f"events; findings are FlagFraud commands on {settings.commands_topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
