"""What every detector app shares (the account's ``fraud_detector``, the device's ``telemetry_detector``): the
state store, the streaming query that writes a detector's findings to the commands topic, and the service loop.

A detector reads the events topic, folds its domain's pure rules per aggregate and writes each finding as a
command (its id derived from the finding, so a replay repeats ids the handler answers as duplicates). It never
writes events: the command handler stays the single writer. The detector object gives ``spark``, ``settings``,
``log``, ``checkpoint`` and ``findings(records)`` (Kafka records -> (key, value) command records).
"""
from __future__ import annotations

from typing import Callable

from lakehouse.kafka_security import spark_kafka_options
from lakehouse.settings import Settings
from spark_apps.events import read_event_records
from spark_apps.spark_projection import bound_query_stop

__all__ = ["STATE_STORE_CONF", "DetectorFigures", "start_findings_query", "run_service", "run_detector"]

# Where per-aggregate state (and timers) live: RocksDB (off the JVM heap, so the driver's memory does not grow with
# the number of aggregates; transformWithState requires it) with changelog checkpoints (a batch writes only the
# states it changed, not a snapshot). A checkpoint records its provider: one made with another (Spark's default,
# before this) keeps it.
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


class DetectorFigures:
    """A Spark detector's Prometheus figures (``lakehouse.metrics``), folded from its query's progress reports
    (``observe``, each report once, in order): committed batches, the events records they read and the findings they
    wrote as commands, their time, the last commit, and the records past it per partition of the events topic (the
    fraud detector's and the policy's name for it, ``consumer_lag_records``, so one alert rule serves them all)."""

    def __init__(self, topic: str):
        from projection_core.figures import QueryFigures

        self.topic = topic
        self.query = QueryFigures()
        self.findings = 0
        self._last = (-2, "")

    def observe(self, reports) -> None:
        from spark_apps.progress_figures import observe

        for progress in reports:
            key = (int(progress.get("batchId", -1)), str(progress.get("timestamp", "")))
            if key <= self._last:
                continue
            self._last = key
            observe(self.query, progress, self.topic)
            if "addBatch" in (progress.get("durationMs") or {}):
                self.findings += max(0, int((progress.get("sink") or {}).get("numOutputRows") or 0))  # -1: unknown

    def samples(self) -> list:
        from lakehouse.metrics import Sample, consumer_lag_samples

        c, q = "counter", self.query
        out = [Sample("detector_batches", c, "Committed batches", q.batches),
               Sample("detector_events", c, "Events records the committed batches read", q.rows),
               Sample("detector_batch_seconds", c, "Time running the committed batches", q.batch_seconds),
               Sample("detector_findings", c, "Findings written to the commands topic as commands", self.findings)]
        if q.last_commit_at is not None:
            out.append(Sample("detector_last_commit_timestamp_seconds", "gauge", "When the last batch committed "
                              "(Unix time)", q.last_commit_at))
        return out + consumer_lag_samples(q.lag)


def start_findings_query(detector, query_name: str, label: str, until_caught_up: bool = False,
                         state_store_conf: dict[str, str] | None = None):
    """Start ``detector``'s query: the events topic -> its findings -> the commands topic (acks=all, idempotent
    producer), checkpointed at ``detector.checkpoint``; with ``until_caught_up`` it stops at the log's end."""
    s = detector.settings
    bound_query_stop(detector.spark)
    for key, value in (STATE_STORE_CONF if state_store_conf is None else state_store_conf).items():
        detector.spark.conf.set(key, value)
    records = read_event_records(detector.spark, s)
    writer = (detector.findings(records).writeStream.format("kafka").queryName(query_name)
              .options(**spark_kafka_options(s))
              .option("kafka.acks", "all").option("kafka.enable.idempotence", "true")
              .option("topic", s.commands_topic)
              .option("checkpointLocation", str(detector.checkpoint))
              .outputMode("append"))
    writer = writer.trigger(availableNow=True) if until_caught_up else writer.trigger(
        processingTime=s.trigger_interval)
    query = writer.start()
    detector.log(f"{label}: reading {s.events_topic}, flagging to {s.commands_topic} (checkpoint "
                 f"{detector.checkpoint})")
    return query


def run_service(argv: list[str] | None, prog: str, description: str, label: str, command_type: str,
                make: Callable[[object, Settings], object]) -> int:
    """A detector's ``main``: ``--until-caught-up`` or a service that stops on SIGTERM within seconds."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--until-caught-up", action="store_true", help="process what the log holds now, then stop")
    args = parser.parse_args(argv)
    return run_detector(Settings.load(role="client"), prog, label, command_type, make, args.until_caught_up)


def run_detector(settings: Settings, prog: str, label: str, command_type: str,
                 make: Callable[[object, Settings], object], until_caught_up: bool = False) -> int:
    """Run the detector ``make`` builds until caught up or, as a service, until SIGTERM (``run_service`` and the
    CLI's detector verbs)."""
    from event_store.kafka_access import check_access
    from lakehouse import metrics
    from lakehouse.signals import stop_requested_on_sigterm
    from spark_apps.session import build_session
    from spark_apps.spark_projection import stop_query

    check_access(settings, timeout_s=5.0, require_answer=False)  # refused (SASL): one line, before Spark starts
    # Installed before the (slow) session start, so that a SIGTERM meanwhile is not lost either.
    stop_requested = stop_requested_on_sigterm()
    spark = build_session(settings, app_name=f"eventlake-{prog.replace('_', '-')}", streaming=True)
    query = make(spark, settings).start(until_caught_up=until_caught_up)
    figures = DetectorFigures(settings.events_topic)
    server = metrics.serve(settings, prog.replace("_", "-"), figures.samples, lambda line: print(line, flush=True))
    try:
        # Checked every second, whatever the query waits for (the broker may be away): a batch cut short commits
        # nothing, and the next start redoes it from the checkpoint (its findings' command ids repeat).
        while not stop_requested.is_set() and not query.awaitTermination(1):  # raises the query's failure
            figures.observe(query.recentProgress)
    except KeyboardInterrupt:
        pass
    finally:
        stop_query(query)  # bounded: a query waiting for an absent broker is left to end with the process
        if server is not None:
            server.close()
    read = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"{label}: {'stopped (SIGTERM) after reading' if stop_requested.is_set() else 'read'} {read} "
          f"events; findings are {command_type} commands on {settings.commands_topic}")
    return 0
