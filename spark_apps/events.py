"""Kafka records -> typed event rows, and the records that are not valid events -> dead-letter rows.

Pure DataFrame -> DataFrame functions; the writer lives in ``projection``.
"""
from __future__ import annotations

from event_store.schemas import EVENT_ENVELOPE, EVENT_SCHEMA_VERSIONS, EVENT_TIME_MAX, EVENT_TIME_MIN, EVENTS, Field, \
    string_field_names

__all__ = ["envelope_schema", "read_event_records", "parse_events", "check_records", "split_checked", "upcast_rows", "missing_spark_upcasters", "DEAD_LETTER_COLUMNS",
           "EVENT_COLUMNS"]

# Payload fields of every event type, flattened into columns of the event rows.
_PAYLOAD_LONGS = ("credit_limit_minor", "amount_minor")
_PAYLOAD_STRINGS = ("customer_id", "currency", "payment_id", "merchant_id", "location", "reason", "rule",
                    "evidence", "merchant_country", "record", "resolved_by")
# The columns are named here (their order is the tables' column order); which fields exist and what a valid
# value is comes from event_store.schemas, and these must be exactly its payload fields by type.
_SCHEMA_FIELDS = {(n, spec.kind) for schema in EVENTS.values() for n, spec in schema.items()}
if _SCHEMA_FIELDS != {(n, str) for n in _PAYLOAD_STRINGS} | {(n, int) for n in _PAYLOAD_LONGS}:
    raise ImportError(f"spark_apps.events: payload columns differ from event_store.schemas.EVENTS: "
                      f"{sorted(_SCHEMA_FIELDS)}")
if any(not spec.required for schema in EVENTS.values() for spec in schema.values() if spec.kind is int):
    raise ImportError("spark_apps.events: an optional integer payload field cannot be told apart from one of "
                      "another JSON type by Spark's reader; give it a check here first")


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
# so that a table created before it had the column (and upgraded in place) has the same column order as a new one;
# kafka_key (the account the record was written for) was added after it.
DEAD_LETTER_COLUMNS = ("reason", "raw_value", "raw_value_base64", "kafka_topic", "kafka_partition", "kafka_offset",
                       "dead_lettered_at", "raw_bytes", "kafka_key")


def envelope_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    payload = StructType([StructField(n, StringType()) for n in _PAYLOAD_STRINGS]
                         + [StructField(n, LongType()) for n in _PAYLOAD_LONGS])
    strings = ("event_id", "event_type", "aggregate_type", "aggregate_id", "occurred_at", "recorded_at",
               "command_id", "correlation_id", "causation_id")
    return StructType([StructField(n, StringType()) for n in strings]
                      + [StructField("schema_version", LongType()), StructField("aggregate_version", LongType()),
                         StructField("payload", payload)])


def read_event_records(spark, settings, max_offsets_per_trigger: int | None = None, starting_offsets: str = "earliest"):
    """The events topic as a stream of Kafka records: from the first offset (or ``starting_offsets``, Spark's
    JSON of partition -> offset, for a new checkpoint only), committed transactions only,
    stopping on a gap in the log (``failOnDataLoss``), at most ``maxOffsetsPerTrigger`` per batch, read by
    three tasks per core."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.bootstrap_servers)
            .option("subscribe", settings.events_topic)
            .option("startingOffsets", starting_offsets)
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


def _java_pattern(pattern: str) -> str:
    """A schemas pattern for Spark's rlike (Java regex): \\Z is Python's end of input, \\z Java's; (?U) gives
    \\d, \\s and \\S their Unicode meaning, as in Python's str patterns."""
    return "(?U)" + pattern.replace("\\Z", "\\z")


def _field_problems(spec: Field, value, F) -> list:
    """(bad value condition, problem text) pairs for a non-null ``value`` column, generated from ``spec`` as
    schemas.field_problem checks it in Python (the Spark JSON reader already nulls longs of another type)."""
    out = []
    if spec.choices is not None:
        out.append((~value.isin(*sorted(spec.choices)), f"is not {spec.describe or 'an allowed value'}"))
    if spec.max_length is not None:
        out.append((F.length(value) > spec.max_length, f"is longer than {spec.max_length} characters"))
    if spec.timestamp:
        instant = value.try_cast("timestamp")
        out.append((~value.rlike(_java_pattern(spec.pattern)) | instant.isNull(),
                    "is not an ISO-8601 UTC timestamp (e.g. 2026-01-01T00:00:00Z)"))
        out.append(((instant < F.lit(EVENT_TIME_MIN.replace(tzinfo=None)))
                    | (instant >= F.lit(EVENT_TIME_MAX.replace(tzinfo=None))),
                    f"is out of range: event times lie from {EVENT_TIME_MIN:%Y-%m-%d} up to (not including) "
                    f"{EVENT_TIME_MAX:%Y-%m-%d}"))
    elif spec.pattern is not None:
        out.append((~value.rlike(_java_pattern(spec.pattern)),
                    "must not be empty" if spec.pattern == r"\S" else f"is not {spec.describe}"))
    if spec.gt is not None:
        out.append((value <= spec.gt, f"must be > {spec.gt}"))
    if spec.le is not None:
        out.append((value > spec.le, f"must be <= {spec.le:,}"))
    return out


# Spark's JSON reader gives a string column the text of ANY JSON value (a number 5 becomes "5"), where Python
# sees an int: a member named like a string field whose value starts like a number, a boolean, an array or an
# object is found in the record's text, at any depth (schemas.misused_string_name is the same rule in Python).
# Inside a JSON string a quote is escaped, so the pattern only matches a real member name.
_NOT_A_STRING = '"(' + "|".join(sorted(string_field_names())) + r')"\s*:\s*([-0-9tf\[{])'


def _envelope_reason(e, text, F):
    """The first problem of the envelope, in schemas.EVENT_ENVELOPE's order (null when there is none)."""
    # Bytes that are not UTF-8 (Spark's JSON reader would take them into the strings as they are; the Python
    # readers refuse them) make a record invalid whatever else it holds.
    reason = (F.when(~F.is_valid_utf8(text), F.lit("not valid JSON: the record's bytes are not UTF-8"))
              .when(e.isNull() | (e["event_id"].isNull() & e["event_type"].isNull()),
                    F.lit("not an event envelope: invalid JSON or no event_id/event_type")))
    for name, spec in EVENT_ENVELOPE.items():
        value = e[name]
        reason = reason.when(value.isNull(), F.lit(f"missing required field '{name}'"))
        for bad, problem in _field_problems(spec, value, F):
            reason = reason.when(bad, F.lit(f"field '{name}' {problem}"))
        if name == "schema_version":
            current = _current_version(e["event_type"])
            reason = reason.when(value > current, F.format_string(
                "%s schema_version %d is newer than this code reads (up to %d); upgrade eventlake",
                e["event_type"], value, current))
    return reason.when(text.rlike(_NOT_A_STRING), F.format_string(
        "field '%s' must be a JSON string, got a value starting with %s", F.regexp_extract(text, _NOT_A_STRING, 1),
        F.regexp_extract(text, _NOT_A_STRING, 2)))


def _payload_reason(F):
    """The first problem of the (upcast) payload columns for the row's event type, from schemas.EVENTS."""
    kind = F.col("event_type")
    reason = None
    for name in (*_PAYLOAD_STRINGS, *_PAYLOAD_LONGS):
        value = F.col(name)
        by_spec: dict[Field, list[str]] = {}
        for event_type, schema in EVENTS.items():
            if name in schema:
                by_spec.setdefault(schema[name], []).append(event_type)
        for spec, types in by_spec.items():
            applies = kind.isin(*types)
            checks = [(value.isNull(), f"payload is missing required field '{name}'")] if spec.required else []
            checks += [(value.isNotNull() & bad, f"payload field '{name}' {problem}")
                       for bad, problem in _field_problems(spec, value, F)]
            for bad, problem in checks:
                condition = applies & bad
                reason = F.when(condition, F.lit(problem)) if reason is None else reason.when(condition, F.lit(problem))
    return reason


def check_records(records):
    """Kafka records -> flattened event rows (upcast to the current schema versions) with a ``_reason`` (null
    when the record is a valid event) and the record's bytes kept only where there is a reason. What a valid
    event is comes from event_store.schemas, the definition the Python readers use too. Persist this when both
    halves are used, so the JSON is parsed once and the cache holds typed columns, not the raw records."""
    from pyspark.sql import functions as F

    e = F.col("e")
    text = F.col("_text")
    parsed = records.select(
        F.col("value"), F.col("value").cast("string").alias("_text"), F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"), F.col("offset").alias("kafka_offset"), F.col("key"),
    ).select(
        "value", "_text", "kafka_topic", "kafka_partition", "kafka_offset", "key",
        # explode of a one-element array: the same row, but a filter on the parsed fields cannot be pushed
        # below it, so the JSON is parsed once even when both halves (events, dead letters) are read.
        F.explode(F.array(F.from_json(text, envelope_schema(), {"mode": "PERMISSIVE"}))).alias("e"),
    )
    envelope_fields = ("event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id",
                       "aggregate_version", "occurred_at", "recorded_at", "command_id", "correlation_id",
                       "causation_id")
    flat = parsed.select(
        *[e[n].alias(n) for n in envelope_fields],
        *[e["payload"][n].alias(n) for n in (*_PAYLOAD_STRINGS, *_PAYLOAD_LONGS)],
        "kafka_topic", "kafka_partition", "kafka_offset", "value", "key",
        _envelope_reason(e, text, F).alias("_envelope_reason"))
    flat = upcast_rows(flat)
    reason = F.coalesce(F.col("_envelope_reason"), _payload_reason(F))
    return flat.withColumn("_reason", reason).select(
        *[F.col(n) for n in envelope_fields[:6]],
        F.col("occurred_at").try_cast("timestamp").alias("occurred_at"),
        F.col("recorded_at").try_cast("timestamp").alias("recorded_at"),
        *[F.col(n) for n in envelope_fields[8:]],
        *[F.col(n) for n in (*_PAYLOAD_STRINGS, *_PAYLOAD_LONGS)],
        "kafka_topic", "kafka_partition", "kafka_offset", "_reason",
        F.when(F.col("_reason").isNotNull(), F.col("value")).alias("_raw"),
        # The record's key names its account (every writer keys events by aggregate id): quarantine per account.
        F.when(F.col("_reason").isNotNull(), F.make_valid_utf8(F.col("key").cast("string"))).alias("_key"))


def split_checked(checked):
    """(valid events, dead letters) from ``check_records`` output."""
    from pyspark.sql import functions as F

    dead = checked.filter(F.col("_reason").isNotNull()).select(
        F.col("_reason").alias("reason"), F.make_valid_utf8(F.col("_raw").cast("string")).alias("raw_value"),
        F.base64("_raw").alias("raw_value_base64"), "kafka_topic", "kafka_partition", "kafka_offset",
        F.current_timestamp().alias("dead_lettered_at"), F.col("_raw").alias("raw_bytes"),
        F.col("_key").alias("kafka_key"))
    valid = checked.filter(F.col("_reason").isNull()).drop("_reason", "_raw", "_key")
    return upcast_rows(valid), dead


def _current_version(event_type):
    from pyspark.sql import functions as F

    versions = F.create_map(*[x for name, v in EVENT_SCHEMA_VERSIONS.items() for x in (F.lit(name), F.lit(v))])
    return versions[event_type]
