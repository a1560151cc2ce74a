"""Kafka records -> typed event rows, and the records that are not valid events -> dead-letter rows.

Pure DataFrame -> DataFrame functions; the writer lives in ``projection``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

from event_store import domains
from event_store.domains import DOMAINS
from event_store.schemas import EVENT_ENVELOPE, EVENT_SCHEMA_VERSIONS, EVENT_TIME_MAX, EVENT_TIME_MIN, EVENTS, Field, \
    string_field_names
from lakehouse.kafka_security import spark_kafka_options
from lakehouse.errors import BadInput

__all__ = ["envelope_schema", "read_event_records", "parse_events", "parsed_row_schema", "check_records", "split_checked", "upcast_rows",
           "spark_upcasters", "missing_spark_upcasters", "payload_columns", "payload_layout", "event_columns",
           "PayloadColumnError", "DEAD_LETTER_COLUMNS", "ENVELOPE_COLUMNS", "KAFKA_COLUMNS"]

ENVELOPE_COLUMNS = ("event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id", "aggregate_version",
                    "occurred_at", "recorded_at", "command_id", "correlation_id", "causation_id")
KAFKA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset")
# The payload kinds a column carries, as Spark SQL types. An int is a long: the JSON reader nulls a value of
# another JSON type, which the null check then reports (hence required ints only, see _layout).
_SPARK_TYPES = {str: "string", int: "long"}


class PayloadColumnError(BadInput, ValueError):
    """A registered event schema the Spark side cannot turn into columns (a kind it cannot carry, one name with
    two kinds, a name taken by the envelope ...): the message names the domain, event type and field."""


class _Layout(NamedTuple):
    """What the Spark side derives from the registered domains (docs/DESIGN.md, "Adding a domain")."""
    payload: tuple[tuple[str, type], ...]  # (column, kind), in the event tables' column order
    upcasters: Mapping[tuple[str, int], Mapping[str, Callable[[Any], Any]]]
    not_a_string: str  # see _envelope_reason


_LAYOUT: _Layout | None = None
_ROW_SCHEMA = None  # parsed_row_schema's answer for the domains registered now
_REASONS: tuple | None = None  # (Spark context, envelope reason, payload reason): see _reason_columns


def _layout() -> _Layout:
    """The payload columns, Spark upcasters and string-field pattern of the domains registered now (kept until a
    domain is registered or removed, so a test's domain registered after import is seen by the next parser)."""
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = _Layout(_derive_payload_columns(), _derive_upcasters(), _derive_not_a_string())
    return _LAYOUT


def _forget_layout() -> None:
    global _LAYOUT, _ROW_SCHEMA, _REASONS
    _LAYOUT = _ROW_SCHEMA = _REASONS = None


domains.on_change(_forget_layout)


def _derive_payload_columns() -> tuple[tuple[str, type], ...]:
    """Every payload field of every registered event type as one column: domains in registration order, each in
    its ``payload_column_order`` then the order its schemas first name the rest. A name shared by event types
    (of one domain or several) is one column, so it must have one kind everywhere."""
    columns: dict[str, tuple[type, str]] = {}  # column -> (kind, "domain/event type" that declared it first)
    for domain in DOMAINS.values():
        fields: dict[str, tuple[type, str]] = {}
        for event_type, schema in domain.events.items():
            for name, spec in schema.items():
                where = f"domain {domain.aggregate_type!r}, event type {event_type!r}, payload field {name!r}"
                if spec.kind not in _SPARK_TYPES:
                    raise PayloadColumnError(
                        f"{where}: kind {spec.kind.__name__} has no Spark column type here (the event tables "
                        f"carry {', '.join(k.__name__ for k in _SPARK_TYPES)}); add the kind, its column type "
                        f"and its checks to spark_apps.events first")
                if spec.kind is int and not spec.required:
                    raise PayloadColumnError(
                        f"{where}: an optional integer field cannot be told apart from one of another JSON type by "
                        f"Spark's JSON reader (both read as null); give it a check in spark_apps.events first")
                seen = fields.setdefault(name, (spec.kind, where))
                if seen[0] is not spec.kind:
                    raise PayloadColumnError(f"{where}: kind {spec.kind.__name__}, but {_owner(seen[1])} has it "
                                             f"as {seen[0].__name__}; one column has one kind")
        strays = [n for n in domain.payload_column_order if n not in fields]
        if strays or len(set(domain.payload_column_order)) != len(domain.payload_column_order):
            raise PayloadColumnError(f"domain {domain.aggregate_type!r}: payload_column_order names "
                                     f"{', '.join(map(repr, strays)) or 'a field twice'}"
                                     + (", not a payload field of its events" if strays else ""))
        ordered = [*domain.payload_column_order, *(n for n in fields if n not in domain.payload_column_order)]
        for name in ordered:
            kind, where = fields[name]
            if name in ENVELOPE_COLUMNS or name in KAFKA_COLUMNS or name.startswith("_") or name in ("value", "key"):
                raise PayloadColumnError(f"{where}: named like a column of the event rows themselves; rename it")
            if name in columns and columns[name][0] is not kind:
                raise PayloadColumnError(f"{where}: kind {kind.__name__}, but {_owner(columns[name][1])} has it "
                                         f"as {columns[name][0].__name__}; one column has one kind")
            columns.setdefault(name, (kind, where))
    return tuple((name, kind) for name, (kind, _) in columns.items())


def _owner(where: str) -> str:
    return where.rsplit(", payload field", 1)[0]


def _derive_upcasters():
    return {key: columns for domain in DOMAINS.values() for key, columns in domain.spark_upcasters.items()}


def _derive_not_a_string() -> str:
    # Spark's JSON reader gives a string column the text of ANY JSON value (a number 5 becomes "5"), where Python
    # sees an int: a member named like a string field whose value starts like a number, a boolean, an array or an
    # object is found in the record's text, at any depth (schemas.misused_string_name is the same rule in
    # Python). Inside a JSON string a quote is escaped, so the pattern only matches a real member name.
    return '"(' + "|".join(sorted(string_field_names())) + r')"\s*:\s*([-0-9tf\[{])'


def payload_columns() -> tuple[str, ...]:
    """The flattened payload columns of the event rows, in table order (the registered domains' event fields)."""
    return tuple(name for name, _ in _layout().payload)


def payload_layout() -> tuple[tuple[str, type], ...]:
    """``payload_columns`` with each column's Python type (``str`` or ``int``), for schemas built without Spark."""
    return tuple(_layout().payload)


def event_columns() -> tuple[str, ...]:
    """The columns of a valid event row (``parse_events``' first half; event_archive's columns)."""
    return (*ENVELOPE_COLUMNS, *payload_columns(), *KAFKA_COLUMNS)


def spark_upcasters():
    """(event type, from version) -> {column: F -> expression} bringing the flattened row to from version + 1:
    every registered domain's ``spark_upcasters``, the vectorised twin of event_store.upcasting.UPCASTERS (a test
    keeps the two in step)."""
    return _layout().upcasters


def missing_spark_upcasters() -> list[tuple[str, int]]:
    upcasters = spark_upcasters()
    return [(name, v) for name, current in EVENT_SCHEMA_VERSIONS.items() for v in range(1, current)
            if (name, v) not in upcasters]


def upcast_rows(events):
    """Old schema versions -> the current one, on read (the log is never rewritten)."""
    from pyspark.sql import functions as F

    for (event_type, version), columns in sorted(spark_upcasters().items(), key=lambda kv: kv[0][1]):
        at_version = (F.col("event_type") == event_type) & (F.col("schema_version") == version)
        events = events.withColumns({name: F.when(at_version, expr(F)).otherwise(F.col(name))
                                     for name, expr in columns.items()})
        events = events.withColumn("schema_version", F.when(at_version, F.lit(version + 1))
                                   .otherwise(F.col("schema_version")))
    return events


# The built-in domains' schemas must make columns: fail at import, naming the field, not at the first batch.
try:
    _layout()
except PayloadColumnError as e:
    raise ImportError(f"spark_apps.events: {e}") from e

# raw_value: the record's bytes as text, always valid UTF-8 (an invalid sequence becomes U+FFFD, so every SQL
# reader can show it); raw_bytes: the exact bytes; raw_value_base64: the same bytes as text. raw_bytes comes last
# so that a table created before it had the column (and upgraded in place) has the same column order as a new one;
# kafka_key (the aggregate id the record was written for) was added after it.
DEAD_LETTER_COLUMNS = ("reason", "raw_value", "raw_value_base64", "kafka_topic", "kafka_partition", "kafka_offset",
                       "dead_lettered_at", "raw_bytes", "kafka_key")


def envelope_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {str: StringType(), int: LongType()}
    payload = StructType([StructField(n, types[kind]) for n, kind in _layout().payload])
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
            .options(**spark_kafka_options(settings))
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


def parsed_row_schema(spark):
    """The schema of ``parse_events``' valid rows (the archive's and the held events' columns), kept until a
    domain is registered or removed. Working it out analyses the whole parser's plan (seconds of driver work),
    and every projection start needs it for the tables it ensures."""
    global _ROW_SCHEMA
    if _ROW_SCHEMA is None:
        from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, \
            TimestampType

        empty = spark.createDataFrame([], StructType([
            StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
            StructField("partition", IntegerType()), StructField("offset", LongType()),
            StructField("timestamp", TimestampType())]))
        _ROW_SCHEMA = parse_events(empty)[0].schema
    return _ROW_SCHEMA


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
    not_a_string = _layout().not_a_string
    return reason.when(text.rlike(not_a_string), F.format_string(
        "field '%s' must be a JSON string, got a value starting with %s", F.regexp_extract(text, not_a_string, 1),
        F.regexp_extract(text, not_a_string, 2)))


def _payload_reason(F):
    """The first problem of the (upcast) payload for the row's event type, from schemas.EVENTS, in its schema's
    order (the one the Python validator reports first). One CASE on event_type, each branch checking only that
    type's fields: a row pays for its own type's checks, whatever the other registered types are."""
    kind = F.col("event_type")
    dispatch = None
    for event_type, schema in EVENTS.items():
        reason = None
        for name, spec in schema.items():
            value = F.col(name)
            checks = [(value.isNull(), f"payload is missing required field '{name}'")] if spec.required else []
            checks += [(value.isNotNull() & bad, f"payload field '{name}' {problem}")
                       for bad, problem in _field_problems(spec, value, F)]
            for bad, problem in checks:
                reason = F.when(bad, F.lit(problem)) if reason is None else reason.when(bad, F.lit(problem))
        if reason is not None:
            is_type = kind == event_type
            dispatch = F.when(is_type, reason) if dispatch is None else dispatch.when(is_type, reason)
    return F.lit(None).cast("string") if dispatch is None else dispatch


def _reason_columns(F):
    """(envelope reason, payload reason) as Columns over the columns ``check_records`` names ``e`` and ``_text``.
    Built once per Spark context and set of registered domains: building them takes thousands of calls into the
    JVM (about a second of the driver's time, in every micro-batch of both projection queries); a Column is an
    unresolved expression, the same for every batch."""
    global _REASONS
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    reasons = _REASONS
    if reasons is None or reasons[0] is not context:
        reasons = _REASONS = (context, _envelope_reason(F.col("e"), F.col("_text"), F), _payload_reason(F))
    return reasons[1], reasons[2]


def check_records(records):
    """Kafka records -> flattened event rows (upcast to the current schema versions) with a ``_reason`` (null
    when the record is a valid event) and the record's bytes kept only where there is a reason. What a valid
    event is comes from event_store.schemas, the definition the Python readers use too. Persist this when both
    halves are used, so the JSON is parsed once and the cache holds typed columns, not the raw records."""
    from pyspark.sql import functions as F

    e = F.col("e")
    text = F.col("_text")
    envelope_reason, payload_reason = _reason_columns(F)
    parsed = records.select(
        F.col("value"), F.col("value").cast("string").alias("_text"), F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"), F.col("offset").alias("kafka_offset"), F.col("key"),
    ).select(
        "value", "_text", "kafka_topic", "kafka_partition", "kafka_offset", "key",
        # explode of a one-element array: the same row, but a filter on the parsed fields cannot be pushed
        # below it, so the JSON is parsed once even when both halves (events, dead letters) are read.
        F.explode(F.array(F.from_json(text, envelope_schema(), {"mode": "PERMISSIVE"}))).alias("e"),
    )
    envelope_fields = ENVELOPE_COLUMNS
    payload = payload_columns()
    flat = parsed.select(
        *[e[n].alias(n) for n in envelope_fields],
        *[e["payload"][n].alias(n) for n in payload],
        "kafka_topic", "kafka_partition", "kafka_offset", "value", "key",
        envelope_reason.alias("_envelope_reason"))
    flat = upcast_rows(flat)
    reason = F.coalesce(F.col("_envelope_reason"), payload_reason)
    return flat.withColumn("_reason", reason).select(
        *[F.col(n) for n in envelope_fields[:6]],
        F.col("occurred_at").try_cast("timestamp").alias("occurred_at"),
        F.col("recorded_at").try_cast("timestamp").alias("recorded_at"),
        *[F.col(n) for n in envelope_fields[8:]],
        *[F.col(n) for n in payload],
        "kafka_topic", "kafka_partition", "kafka_offset", "_reason",
        F.when(F.col("_reason").isNotNull(), F.col("value")).alias("_raw"),
        # The record's key names its aggregate (every writer keys events by aggregate id): quarantine per aggregate.
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
