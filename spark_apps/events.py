"""Kafka records -> typed event rows, and the records that are not valid events -> dead-letter rows.

Pure DataFrame -> DataFrame functions; the writer lives in ``projection``.
"""
from __future__ import annotations

from event_store.schemas import EVENT_SCHEMA_VERSIONS, EVENTS

__all__ = ["envelope_schema", "read_event_records", "parse_events", "check_records", "split_checked", "upcast_rows", "missing_spark_upcasters", "DEAD_LETTER_COLUMNS",
           "EVENT_COLUMNS"]

# Payload fields of every event type, flattened into columns of the event rows.
_PAYLOAD_LONGS = ("credit_limit_minor", "amount_minor")
_PAYLOAD_STRINGS = ("customer_id", "currency", "payment_id", "merchant_id", "location", "reason", "rule",
                    "evidence", "merchant_country")


def _spark_upcasters():
    """(event type, from version) -> {column: F -> expression} bringing the flattened row to from version + 1.
    The vectorised twin of event_store.upcasting.UPCASTERS (a test keeps the two in step)."""
    return {
        ("PaymentAuthorized", 1): {"merchant_country": lambda F: F.substring_index(F.col("location"), "-", 1)},
    }


def missing_spark_upcasters() -> list[tuple[str, int]]:
    upcasters = _spark_upcasters()
    return [(name, v) for name, current in EVENT_SCHEMA_VERSIONS.items() for v in range(1, current)
            if (name, v) not in upcasters]


def upcast_rows(events):
    """Old schema versions -> the current one, on read (the log is never rewritten)."""
    from pyspark.sql import functions as F

    for (event_type, version), columns in sorted(_spark_upcasters().items(), key=lambda kv: kv[0][1]):
        at_version = (F.col("event_type") == event_type) & (F.col("schema_version") == version)
        events = events.withColumns({name: F.when(at_version, expr(F)).otherwise(F.col(name))
                                     for name, expr in columns.items()})
        events = events.withColumn("schema_version", F.when(at_version, F.lit(version + 1))
                                   .otherwise(F.col("schema_version")))
    return events

EVENT_COLUMNS = ("event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id", "aggregate_version",
                 "occurred_at", "recorded_at", "command_id", "correlation_id", "causation_id",
                 *_PAYLOAD_STRINGS, *_PAYLOAD_LONGS, "kafka_topic", "kafka_partition", "kafka_offset")
# raw_value: the record's bytes as text, always valid UTF-8 (an invalid sequence becomes U+FFFD, so every SQL
# reader can show it); raw_bytes: the exact bytes; raw_value_base64: the same bytes as text. raw_bytes comes last
# so that a table created before it had the column (and upgraded in place) has the same column order as a new one.
DEAD_LETTER_COLUMNS = ("reason", "raw_value", "raw_value_base64", "kafka_topic", "kafka_partition", "kafka_offset",
                       "dead_lettered_at", "raw_bytes")


def envelope_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    payload = StructType([StructField(n, StringType()) for n in _PAYLOAD_STRINGS]
                         + [StructField(n, LongType()) for n in _PAYLOAD_LONGS])
    strings = ("event_id", "event_type", "aggregate_type", "aggregate_id", "occurred_at", "recorded_at",
               "command_id", "correlation_id", "causation_id")
    return StructType([StructField(n, StringType()) for n in strings]
                      + [StructField("schema_version", LongType()), StructField("aggregate_version", LongType()),
                         StructField("payload", payload)])


def read_event_records(spark, settings, max_offsets_per_trigger: int | None = None):
    """The events topic as a stream of Kafka records: from the first offset, committed transactions only,
    stopping on a gap in the log (``failOnDataLoss``), at most ``maxOffsetsPerTrigger`` per batch, read by
    three tasks per core."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.bootstrap_servers)
            .option("subscribe", settings.events_topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "true")
            .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger or settings.max_offsets_per_trigger))
            # Kafka partitions are split into more tasks than cores, so no core idles while the last
            # partition is read (3 partitions on 2 cores would leave one core idle a third of the time).
            .option("minPartitions", str(3 * spark.sparkContext.defaultParallelism))
            .load())


def parse_events(records):
    """(valid events, dead letters) from a DataFrame of Kafka records (value, topic, partition, offset)."""
    return split_checked(check_records(records))


def check_records(records):
    """Kafka records -> flattened event rows with a ``_reason`` (null when the record is a valid event) and the
    record's bytes kept only where there is a reason. Persist this when both halves are used, so the JSON is
    parsed once and the cache holds typed columns, not the raw records."""
    from pyspark.sql import functions as F

    e = F.col("e")
    parsed = records.select(
        F.col("value"), F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        # explode of a one-element array: the same row, but a filter on the parsed fields cannot be pushed
        # below it, so the JSON is parsed once even when both halves (events, dead letters) are read.
        F.explode(F.array(F.from_json(F.col("value").cast("string"), envelope_schema(),
                                      {"mode": "PERMISSIVE"}))).alias("e"),
    ).withColumns({"occurred_ts": e["occurred_at"].cast("timestamp"),
                   "recorded_ts": e["recorded_at"].cast("timestamp")})
    reason = (
        F.when(e.isNull() | (e["event_id"].isNull() & e["event_type"].isNull()),
               F.lit("not an event envelope: invalid JSON or no event_id/event_type"))
        .when(e["event_id"].isNull(), F.lit("missing event_id"))
        .when(e["event_type"].isNull(), F.lit("missing event_type"))
        .when(~e["event_type"].isin(*EVENTS), F.concat(F.lit("unknown event_type "), e["event_type"]))
        .when(e["aggregate_id"].isNull(), F.lit("missing aggregate_id"))
        .when(e["aggregate_version"].isNull() | (e["aggregate_version"] < 1),
              F.lit("aggregate_version missing or < 1"))
        .when(e["schema_version"].isNull() | (e["schema_version"] < 1), F.lit("schema_version missing or < 1"))
        .when(e["schema_version"] > _current_version(e["event_type"]),
              F.format_string("%s schema_version %d is newer than this code reads (up to %d); upgrade eventlake",
                              e["event_type"], e["schema_version"], _current_version(e["event_type"])))
        .when(F.col("occurred_ts").isNull(), F.lit("occurred_at missing or not an ISO-8601 timestamp"))
        .when(F.col("recorded_ts").isNull(), F.lit("recorded_at missing or not an ISO-8601 timestamp"))
    )
    envelope_fields = ("event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id",
                       "aggregate_version")
    return parsed.withColumn("_reason", reason).select(
        *[e[n].alias(n) for n in envelope_fields],
        F.col("occurred_ts").alias("occurred_at"), F.col("recorded_ts").alias("recorded_at"),
        *[e[n].alias(n) for n in ("command_id", "correlation_id", "causation_id")],
        *[e["payload"][n].alias(n) for n in (*_PAYLOAD_STRINGS, *_PAYLOAD_LONGS)],
        "kafka_topic", "kafka_partition", "kafka_offset", "_reason",
        F.when(F.col("_reason").isNotNull(), F.col("value")).alias("_raw"))


def split_checked(checked):
    """(valid events, dead letters) from ``check_records`` output."""
    from pyspark.sql import functions as F

    dead = checked.filter(F.col("_reason").isNotNull()).select(
        F.col("_reason").alias("reason"), F.make_valid_utf8(F.col("_raw").cast("string")).alias("raw_value"),
        F.base64("_raw").alias("raw_value_base64"), "kafka_topic", "kafka_partition", "kafka_offset",
        F.current_timestamp().alias("dead_lettered_at"), F.col("_raw").alias("raw_bytes"))
    valid = checked.filter(F.col("_reason").isNull()).drop("_reason", "_raw")
    return upcast_rows(valid), dead


def _current_version(event_type):
    from pyspark.sql import functions as F

    versions = F.create_map(*[x for name, v in EVENT_SCHEMA_VERSIONS.items() for x in (F.lit(name), F.lit(v))])
    return versions[event_type]
