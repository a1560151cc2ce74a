"""A batch of the events topic's records parsed into event rows, without Spark: the Python engine's parser
(``python_engine``), run by the engine and by its second parser process (``python_engine.parse_worker``)
alike, so that both give the same verdicts and rows.

``Records`` holds a batch's Kafka records; ``parse_records`` turns them into an Arrow table of event rows in
``event_row_schema`` (the columns Spark's ``parse_events`` makes) and the records that are no valid event, with
the reason. Its verdict is ``EventEnvelope.from_json``'s for every record (tests/unit/test_event_parser.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from event_store.errors import InvalidRecord
from event_store.fields import ISO_TIME

__all__ = ["Records", "event_row_schema", "parse_records", "rows_table"]


def event_row_schema():
    """The event rows' Arrow schema (``event_archive``'s columns, a ``_pending`` / held table's), as Spark's
    ``parse_events`` makes them: the envelope, the registered domains' payload columns, the Kafka position."""
    import pyarrow as pa

    from spark_apps.events import ENVELOPE_COLUMNS, payload_layout

    kinds = {str: pa.string(), int: pa.int64()}
    fields = []
    for name in ENVELOPE_COLUMNS:
        kind = (pa.int64() if name in ("schema_version", "aggregate_version")
                else pa.timestamp("us", tz="UTC") if name in ("occurred_at", "recorded_at") else pa.string())
        fields.append(pa.field(name, kind))
    fields += [pa.field(name, kinds[kind]) for name, kind in payload_layout()]
    fields += [pa.field("kafka_topic", pa.string()), pa.field("kafka_partition", pa.int32()),
               pa.field("kafka_offset", pa.int64())]
    return pa.schema(fields)


@dataclass
class Records:
    """One batch's Kafka records: (partition, offset, key, value) in log order per partition."""
    rows: list = field(default_factory=list)
    ends: dict = field(default_factory=dict)
    starts: dict = field(default_factory=dict)

    @property
    def span(self) -> tuple:
        """Where the batch starts and ends in every partition: two readers' batches of one span hold the same
        records."""
        return tuple(sorted(self.starts.items())), tuple(sorted(self.ends.items()))


def parse_records(records: Records, topic: str):
    """(event rows as an Arrow table, [(partition, offset, reason)] of the records that are not valid events).

    The ordinary valid event is decoded by ``plain_event_parts`` (compiled msgspec decoders, every check but the
    envelope's two times); such events are turned into columns an event type at a time, and their times are
    checked for the whole batch at once (``_times_hold``) and read by Arrow. Anything else, and any record whose
    times are in doubt, takes ``EventEnvelope.from_json``: the same verdict either way
    (tests/unit/test_event_parser.py). The rows keep the records' order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from event_store.envelope import in_range, plain_event_parts

    schema = event_row_schema()
    by_type: dict[str, list] = {}
    rows, bad = [], []
    for position, (partition, offset, _, value) in enumerate(records.rows):
        parts = plain_event_parts(value) if value is not None else None
        if parts is not None:  # the usual case
            group = by_type.get(parts[0].event_type)
            if group is None:
                group = by_type[parts[0].event_type] = []
            group.append((*parts, partition, offset, position))
            continue
        kind, found = _reference_verdict(value, topic, partition, offset)
        if kind == "bad":
            bad.append((partition, offset, found))
        else:
            rows.append((*found, position))
    times = ("occurred_at", "recorded_at")
    tables = [_plain_columns(event_type, group, schema, topic) for event_type, group in by_type.items()]
    table = pa.concat_tables(tables) if tables else None
    if table is not None and not all(_times_hold(table.column(name)) for name in times):
        # Some time is not what the fast check admits: each row's times are checked as the reference path does,
        # and the rows that fail go to it for their verdict.
        keep = [in_range(o) and in_range(r) for o, r in zip(*(table.column(n).to_pylist() for n in times))]
        if not all(keep):
            values = {(p, o): v for p, o, _, v in records.rows}
            failed = table.filter(pc.invert(pa.array(keep, pa.bool_())))
            for partition, offset, position in zip(*(failed.column(n).to_pylist()
                                                     for n in ("kafka_partition", "kafka_offset", "_position"))):
                kind, found = _reference_verdict(values[(partition, offset)], topic, partition, offset)
                (bad.append((partition, offset, found)) if kind == "bad" else rows.append((*found, position)))
            table = table.filter(pa.array(keep, pa.bool_()))
    if table is not None:
        table = _timed(table, schema, times)
    if rows or table is None:
        ordinary = rows_table(rows, schema.append(pa.field("_position", pa.int64())))
        table = ordinary if table is None else pa.concat_tables([table, ordinary])
    if len(tables) + bool(rows) > 1:  # rows from more than one list: back in the records' order
        table = table.take(pc.sort_indices(table.column("_position")))
    return table.drop_columns(["_position"]), bad


def _plain_columns(event_type: str, group: list[tuple], schema, topic: str):
    """The event rows (``schema`` and a _position column, the times as text) of ``group``: (envelope, payload,
    partition, offset, position) of events of ``event_type`` that ``plain_event_parts`` decoded."""
    from operator import attrgetter, itemgetter

    import msgspec
    import pyarrow as pa

    from event_store import schemas
    from spark_apps.events import ENVELOPE_COLUMNS

    fields = schemas.EVENTS[event_type]
    optional = set(schemas.payload_decoder(fields)[1])
    heads, payloads = list(map(itemgetter(0), group)), list(map(itemgetter(1), group))
    n = len(group)
    columns = []
    for column in schema:
        name = column.name
        if name in ("occurred_at", "recorded_at"):
            columns.append(pa.array(list(map(attrgetter(name), heads)), pa.string()))
        elif name == "kafka_topic":
            columns.append(pa.array([topic] * n, pa.string()))
        elif name == "kafka_partition":
            columns.append(pa.array(list(map(itemgetter(2), group)), column.type))
        elif name == "kafka_offset":
            columns.append(pa.array(list(map(itemgetter(3), group)), column.type))
        elif name in fields:
            values = list(map(attrgetter(name), payloads))
            if name in optional:
                values = [None if v is msgspec.UNSET else v for v in values]
            columns.append(pa.array(values, column.type))
        elif name in ENVELOPE_COLUMNS:
            columns.append(pa.array(list(map(attrgetter(name), heads)), column.type))
        else:
            columns.append(pa.nulls(n, column.type))
    columns.append(pa.array(list(map(itemgetter(4), group)), pa.int64()))
    return pa.Table.from_arrays(columns, names=[*schema.names, "_position"])


def _reference_verdict(value, topic: str, partition: int, offset: int):
    """("ok", event row) or ("bad", reason) of one record, by ``EventEnvelope.from_json``."""
    from event_store.envelope import EventEnvelope, parse_time
    from spark_apps.events import ENVELOPE_COLUMNS, payload_columns

    try:
        e = EventEnvelope.from_json(value if value is not None else b"")
    except InvalidRecord as error:
        return "bad", str(error)
    return "ok", (*(getattr(e, name) for name in ENVELOPE_COLUMNS[:6]), parse_time(e.occurred_at, "occurred_at"),
                  parse_time(e.recorded_at, "recorded_at"), *(getattr(e, name) for name in ENVELOPE_COLUMNS[8:]),
                  *map(e.payload.get, payload_columns()), topic, partition, offset)


def rows_table(rows: list[tuple], schema):
    """Rows (tuples in ``schema``'s order) as an Arrow table of ``schema``."""
    import pyarrow as pa

    columns = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


# fields.ISO_TIME for RE2 (Arrow's regular expressions), whose end of input is \z. RE2's \d and \s are ASCII only, so
# it admits no more than Python's; what it refuses goes to the row-by-row check.
_ISO_TIME_RE2 = ISO_TIME.replace("\\Z", "\\z")


def _times_hold(texts) -> bool:
    """Whether every time in the Arrow text column ``texts`` is one ``field_problem`` passes (the pattern, a real
    date, the event time range), decided for the whole column; False when any is in doubt."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from event_store import schemas

    if texts.null_count or not pc.all(pc.match_substring_regex(texts, _ISO_TIME_RE2)).as_py():
        return False
    try:
        instants = texts.cast(pa.timestamp("us", tz="UTC"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False  # e.g. February 30th
    low = pa.scalar(schemas.EVENT_TIME_MIN, pa.timestamp("us", tz="UTC"))
    high = pa.scalar(schemas.EVENT_TIME_MAX, pa.timestamp("us", tz="UTC"))
    return bool(pc.all(pc.and_(pc.greater_equal(instants, low), pc.less(instants, high))).as_py())


def _timed(table, schema, times: tuple[str, ...]):
    """``table`` with its text time columns (all valid) as ``schema``'s timestamps: cast by Arrow, or by
    ``parse_time`` a value at a time when Arrow's reader refuses one (Python's reader is the reference)."""
    import pyarrow as pa

    from event_store.envelope import parse_time

    for name in times:
        field, i = schema.field(name), table.schema.get_field_index(name)
        try:
            column = table.column(i).cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            column = pa.array([parse_time(t, name) for t in table.column(i).to_pylist()], field.type)
        table = table.set_column(i, field, column)
    return table
