"""``eventlake demo``: the whole path from commands to SQL on the local defaults.

Starts the local broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set), writes a few thousand generated
commands of every built-in domain (card payments for a few hundred accounts, telemetry of a few dozen devices,
page views of a few sites) into the one commands topic, runs the command handler, the detectors and the
projection until all have caught up, and prints what happened and where the data is. Safe to run again: each
run uses new ids, and the projection resumes from its checkpoint.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

from lakehouse.settings import Settings

__all__ = ["run_demo"]


def run_demo(settings: Settings, accounts: int = 300, commands: int = 3000, devices: int = 24,
             sites: int = 3, log=print) -> dict:
    from datetime import timedelta

    from event_store import kafka_log
    from event_store.handler import CommandHandler
    from eventlake.generator import (GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, dated,
                                     generate_commands, generate_iot_commands, generate_site_commands)
    from eventlake.query import format_table, query_duckdb
    import read_models
    from expectations.checks import context, verdict
    from infra import kafka
    from event_store.account.policy import FraudPolicy
    from event_store.account.fraud_consumer import FraudConsumer
    from spark_apps.telemetry_detector import TelemetryDetector
    from python_engine.run import PythonProjection
    from spark_apps.projection import Projection, default_engine, lineage_run
    from lakehouse.lineage import detector_run, events_file
    from spark_apps.session import build_session

    started = time.monotonic()
    step = _stepper(log, started)
    if settings.uses_local_kafka:
        broker = kafka.up(settings, log=log)
        step(f"kafka broker running (pid {broker.pid}) at {settings.bootstrap_servers}")
    else:
        step(f"using the Kafka cluster at {settings.bootstrap_servers}")
    kafka_log.ensure_topics(settings, log=log)

    run_id = datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S")
    # Dated from now (after the log's newest event): a second demo is on time, not late against the first.
    cfg = dated(GeneratorConfig(accounts=accounts, commands=commands, run_id=run_id, seed=int(run_id) % 100_000,
                                invalid_rate=0.003, malformed_rate=0.002), settings)
    # The other domains' event times end 5 minutes ago, inside the windows' watermark: on time.
    other_start = datetime.now(timezone.utc) - timedelta(minutes=35)
    iot_records = list(generate_iot_commands(IotGeneratorConfig(devices=devices, minutes=30, run_id=run_id,
                                                                seed=int(run_id) % 100_000, start=other_start)))
    site_records = list(generate_site_commands(SiteGeneratorConfig(sites=sites, views=100 * devices, minutes=30,
                                                                   run_id=run_id, seed=int(run_id) % 100_000,
                                                                   start=other_start)))
    producer = kafka_log.make_producer(settings)
    try:
        sent = kafka_log.produce_all(producer, settings.commands_topic, generate_commands(cfg))
        sent_iot = kafka_log.produce_all(producer, settings.commands_topic, iot_records)
        sent_site = kafka_log.produce_all(producer, settings.commands_topic, site_records)
    finally:
        producer.close()
    step(f"sent {sent + sent_iot + sent_site} commands to {settings.commands_topic} (run {run_id}): {sent} for "
         f"{accounts} accounts, {sent_iot} for {devices} devices, {sent_site} for {sites} sites")

    quiet = lambda *_: None  # noqa: E731
    with CommandHandler(settings, log=quiet) as handler:
        stats = handler.run(until_caught_up=True)
    step(f"command handler: {stats.line()}")

    # The fraud loop: detector -> FlagFraud -> handler records FraudSuspected -> policy -> FreezeAccount -> handler.
    # The detector is `eventlake detect-fraud`'s default engine, a Kafka consumer (no JVM).
    # Each service's OpenLineage run, as its `eventlake` verb emits it (docs/lineage.md).
    with detector_run(settings, "detect-fraud", True, quiet):
        detected = FraudConsumer(settings, log=quiet).run(until_caught_up=True)
    with CommandHandler(settings, log=quiet) as handler:
        flagged = handler.run(until_caught_up=True)
    step(f"fraud detector: {detected.observed} payments and device reports read; {flagged.accepted} FlagFraud "
         f"commands accepted ({flagged.duplicates} repeats answered as duplicates) -> FraudSuspected events")
    with detector_run(settings, "policy", True, quiet):
        policy = FraudPolicy(settings, log=quiet).run(until_caught_up=True)
    with CommandHandler(settings, log=quiet) as handler:
        frozen = handler.run(until_caught_up=True)
    step(f"fraud policy: {policy.line()}; handler: {frozen.events} AccountFrozen events")

    # Reference data (issue 46): a merchants file dropped in the landing folder, loaded into dim_merchant (SCD2)
    # before the projection, which joins each payment with its merchant as of the payment's time.
    from reference_data.loads import landing_folder, load_merchants
    from reference_data.samples import write_sample_merchants

    landed = write_sample_merchants(landing_folder(settings) / f"merchants-{run_id}.csv", cfg.merchants)
    step("reference data: " + " ".join(load_merchants(settings, str(landed), full=True).lines()))

    spark = build_session(settings, app_name="eventlake-demo", log=log)
    step("spark session ready")
    # The device's detector: out-of-range runs and silent devices (an event-time timer) -> FlagTelemetryAnomaly.
    with detector_run(settings, "detect-anomalies", True, quiet):
        TelemetryDetector(spark, settings, log=quiet).start(until_caught_up=True).awaitTermination()
    with CommandHandler(settings, log=quiet) as handler:
        anomalies = handler.run(until_caught_up=True)
    step(f"telemetry detector: {anomalies.accepted} FlagTelemetryAnomaly commands accepted "
         f"({anomalies.duplicates} repeats answered as duplicates) -> TelemetryAnomalyDetected events")
    # The engine `eventlake project` runs by default here (spark_apps.projection.default_engine); the Python
    # engine hands a batch off its common path to this Spark session.
    engine, _ = default_engine(settings)
    projection = (PythonProjection(settings, log=log, spark_session=lambda: spark) if engine == "python"
                  else Projection(spark, settings, log=log))
    with lineage_run(settings, projection.plan, True, quiet):
        run = projection.run_until_caught_up()
    step(f"projection ({engine} engine): {run.input_rows} events in {run.batches} batch(es) -> Delta tables under "
         f"{settings.warehouse}")
    ge = context()
    verdicts = [verdict(settings, name, reconcile=True, ge=ge) for name in read_models.REGISTRY]
    failed = [line for v in verdicts if v.failed for line in v.lines()]
    step(f"data quality: {len(verdicts)} tables against their Great Expectations suites (expectations/) and "
         f"reconciled with a fold of the archived log: "
         + ("all passed" if not failed else "FAILED:\n  " + "\n  ".join(failed)))

    prefix = f"acc-{run_id}-%"
    cols, rows = query_duckdb(settings, f"""
        SELECT count(*) AS accounts, sum(payments_authorized) AS authorized, sum(payments_declined) AS declined,
               sum(authorized_total_minor) AS authorized_total_minor,
               sum(CASE WHEN status = 'frozen' THEN 1 ELSE 0 END) AS frozen
        FROM account_summary WHERE account_id LIKE '{prefix}'""")
    summary = dict(zip(cols, rows[0]))
    top_sql = (f"SELECT account_id, status, payments_authorized, payments_declined, authorized_total_minor, "
               f"available_minor, currency, version FROM account_summary WHERE account_id LIKE '{prefix}' "
               f"ORDER BY authorized_total_minor DESC LIMIT 5")
    top_cols, top_rows = query_duckdb(settings, top_sql)
    alerts_sql = (f"SELECT rule, count(*) AS alerts, count(DISTINCT account_id) AS accounts FROM fraud_alerts "
                  f"WHERE account_id LIKE '{prefix}' GROUP BY rule ORDER BY rule")
    alert_cols, alert_rows = query_duckdb(settings, alerts_sql)
    _, devices_rows = query_duckdb(settings, f"""
        SELECT count(*), count(*) FILTER (WHERE status = 'decommissioned'), sum(readings_count),
               sum(anomalies_count)
        FROM device_status WHERE device_id LIKE 'dev-{run_id}-%'""")
    device_count, decommissioned, readings, flagged_devices = devices_rows[0]
    anomalies_sql = (f"SELECT rule, count(*) AS anomalies, count(DISTINCT device_id) AS devices FROM "
                     f"telemetry_anomalies WHERE device_id LIKE 'dev-{run_id}-%' GROUP BY rule ORDER BY rule")
    anomaly_cols, anomaly_rows = query_duckdb(settings, anomalies_sql)
    _, windows = query_duckdb(settings, f"SELECT count(*), sum(readings) FROM device_minute_readings "
                                        f"WHERE device_id LIKE 'dev-{run_id}-%'")
    pages_sql = (f"SELECT page, sum(views) AS views, count(*) AS minutes FROM page_minute_clicks "
                 f"WHERE site_id LIKE 'web-{run_id}-%' GROUP BY page ORDER BY views DESC, page LIMIT 5")
    page_cols, page_rows = query_duckdb(settings, pages_sql)
    _, volume = query_duckdb(settings, "SELECT count(*), sum(payments) FROM merchant_minute_volume")
    # Each payment joined with its merchant as of its time (dim_merchant, the file loaded above).
    categories_sql = ("SELECT merchant_category, sum(payments) AS payments, sum(amount_minor) AS amount_minor "
                      "FROM category_minute_volume GROUP BY merchant_category ORDER BY payments DESC, "
                      "merchant_category LIMIT 5")
    category_cols, category_rows = query_duckdb(settings, categories_sql)
    _, late = query_duckdb(settings, "SELECT count(*) FROM late_events")
    log("")
    log(f"== eventlake demo: run {run_id} ==")
    log(f"commands: {stats.commands} handled: {stats.accepted} accepted, {stats.rejected} rejected (with a reason "
        f"in {settings.results_topic}), {stats.dead_lettered} dead-lettered to {settings.dead_letters_topic}")
    log(f"events:   {stats.events + flagged.events + frozen.events + anomalies.events} appended to "
        f"{settings.events_topic} ({stats.events} from the commands, {flagged.events} FraudSuspected, "
        f"{frozen.events} AccountFrozen, {anomalies.events} TelemetryAnomalyDetected)")
    log(f"account_summary for this run: {summary['accounts']} accounts, {summary['authorized']} payments "
        f"authorized, {summary['declined']} declined, {summary['frozen']} frozen, authorized total "
        f"{summary['authorized_total_minor']} minor units")
    log(f"merchant_minute_volume: {volume[0][0]} merchant-minutes, {volume[0][1]} payments; "
        f"late_events: {late[0][0]} (beyond the watermark: recorded, not lost)")
    log(f"device_status for this run: {device_count} devices ({decommissioned} decommissioned), {readings} "
        f"readings, {flagged_devices} anomalies flagged; device_minute_readings: {windows[0][0]} device-minutes, "
        f"{windows[0][1]} readings")
    log("")
    log(f"$ eventlake query \"{top_sql}\"")
    log(format_table(top_cols, top_rows))
    log("")
    log(f"$ eventlake query \"{alerts_sql}\"")
    log(format_table(alert_cols, alert_rows))
    log("")
    log(f"$ eventlake query \"{anomalies_sql}\"")
    log(format_table(anomaly_cols, anomaly_rows))
    log("")
    log(f"$ eventlake query \"{pages_sql}\"")
    log(format_table(page_cols, page_rows))
    log("")
    log(f"$ eventlake query \"{categories_sql}\"")
    log(format_table(category_cols, category_rows))
    log("")
    log("where the data lives:")
    log(f"  Kafka:        {settings.bootstrap_servers}, topics {settings.topic_prefix}*"
        + (f" (broker data in {settings.kafka_dir})" if settings.uses_local_kafka else ""))
    log(f"  Delta tables: {settings.warehouse}  ({', '.join(read_models.REGISTRY)}, late_events, event_archive, "
        f"_dead_letters/events)")
    log(f"  checkpoints:  {settings.checkpoints}")
    if settings.lineage == "on":
        log(f"  lineage:      {settings.lineage_url or events_file(settings)}  (OpenLineage runs of every step "
            f"above, what each read and wrote: docs/lineage.md)")
    log(f"done in {time.monotonic() - started:.0f}s. Try: eventlake query \"SELECT status, count(*) FROM "
        f"account_summary GROUP BY status\"; eventlake check --reconcile; "
        f"eventlake airflow standalone (the Airflow UI)"
        + ("; stop the broker with: eventlake kafka down" if settings.uses_local_kafka else ""))
    return {"run_id": run_id, "commands": sent, "handler": stats, "projection": run, "summary": summary}


def _stepper(log, started):
    def step(message: str) -> None:
        log(f"[{time.monotonic() - started:5.1f}s] {message}")
    return step
