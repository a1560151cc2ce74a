"""Every reader's event parser (``EventEnvelope.from_json``: compiled msgspec decoders for the ordinary valid event,
the reference path for anything else) gives exactly what the reference path gives: the same events, the same
rejections word for word."""
import json
import random

import pytest

from event_store.envelope import EventEnvelope, load_json, plain_event
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from tests.domain_helpers import events_for, events_of, iot_events_for
from tests.unit.test_handler_core import outcome


def reference_event(raw):
    """EventEnvelope.from_json as it was: the standard library's JSON, then from_dict."""
    return EventEnvelope.from_dict(load_json(raw, "event"))


def sample_events():
    return [*events_for(GeneratorConfig(accounts=10, commands=200, seed=4, run_id="ep"), flag_every=3),
            *iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=4, run_id="ep"), flag_every=4),
            *events_of(generate_site_commands(SiteGeneratorConfig(sites=1, views=40, minutes=10, seed=4,
                                                                  run_id="ep")))]


def test_every_generated_event_of_every_domain_takes_the_fast_path_and_reads_the_same():
    events = sample_events()
    assert len({e.event_type for e in events}) >= 8
    for e in events:
        raw = e.to_json()
        fast = plain_event(EventEnvelope, raw)
        assert fast is not None, raw  # the ordinary event is not left to the slow path
        assert fast == reference_event(raw) == e


ODD_VALUES = [None, True, False, 0, -1, 1, 1.0, 1.5, 10**25, -10**30, "", " ", "\u2003", "x", "US-NYC\n", "USD",
              "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z\n", "2026-01-01T00:00:00", "2026-02-30T00:00:00Z",
              "0001-01-01T00:00:00Z", "1899-12-31T23:59:59Z", "9999-06-01T00:00:00+00:00", "2026-01-01T00:00:00+25:00",
              [], {}, ["x"], {"rule": 5}]


def test_randomly_damaged_events_get_the_same_verdict_on_both_paths():
    rng = random.Random(12)
    for e in sample_events():
        obj = json.loads(e.to_json())
        for _ in range(4):
            damaged = json.loads(e.to_json())
            target = damaged["payload"] if rng.random() < 0.6 else damaged
            name = rng.choice(sorted(target) + ["surplus", "rule", "payment_id"])
            target[name] = rng.choice(ODD_VALUES + [obj.get(name)])
            raw = json.dumps(damaged).encode()
            assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw), raw


@pytest.mark.parametrize("raw", [b"{nope", b"[1]", b"", b"null", b'{"a": NaN}', b'{"event_id": "\\ud800"}',
                                 b'\xef\xbb\xbf{"event_id": "e"}', b'{"a": 1e400}', "{\"event_id\": \"e\"}"])
def test_unreadable_records_get_the_reference_reason(raw):
    assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw)
    assert outcome(EventEnvelope.from_json, raw).startswith("InvalidRecord")


def test_a_repeated_key_counts_once_with_its_last_value_on_both_paths():
    e = sample_events()[0]
    raw = e.to_json().replace(b'"aggregate_version":1', b'"aggregate_version":1,"aggregate_version":0')
    assert raw != e.to_json()
    assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw)
    assert outcome(EventEnvelope.from_json, raw).startswith("InvalidRecord")


def test_an_older_schema_version_is_upcast_on_the_reference_path():
    from tests.unit.test_upcasting import v1_payment_authorized

    raw = json.dumps(v1_payment_authorized()).encode()
    assert plain_event(EventEnvelope, raw) is None
    assert EventEnvelope.from_json(raw) == reference_event(raw)
    assert EventEnvelope.from_json(raw).schema_version == 2


def test_not_blank_is_the_negation_of_isspace_over_every_code_point():
    # fields.pattern_checker decides NOT_BLANK (r"\S", searched) with str.isspace instead of the regular expression.
    import re
    import sys

    from event_store.fields import NOT_BLANK

    search = re.compile(NOT_BLANK).search
    for code in range(sys.maxunicode + 1):
        text = chr(code)
        assert (search(text) is None) == text.isspace(), hex(code)
    assert search("") is None


# Valid and invalid times the batch check must decide as the reference does, offsets and fractions included.
ODD_TIMES = ["2026-01-01T00:00:00.5+05:30", "2026-01-01T00:00:00.123456-11:59", "1900-01-01T00:00:00Z",
             "9998-12-31T23:59:59.999999Z", "1900-01-01T00:30:00+01:00", "9998-12-31T23:00:00-05:00",
             "2024-02-29T12:00:00Z", "2023-02-29T12:00:00Z", "2026-04-31T00:00:00Z",
             "\u0662\u0660\u0662\u0666-01-01T00:00:00Z", "2026-01-01T00:00:00.1234567Z", "2026-01-01T24:00:00Z",
             "2026-01-01 00:00:00Z", "0000-01-01T00:00:00Z", "2026-01-01T00:00:00+00:00",
             "2026-06-30T23:59:59.000001+23:59"]


def batch_records():
    """(partition, offset, key, value) records: every generated event, each odd time in each envelope time,
    random damages, unreadable records, null values and an older schema version, interleaved."""
    from tests.unit.test_upcasting import v1_payment_authorized

    rng = random.Random(5)
    values = [e.to_json() for e in sample_events()]
    for i, odd in enumerate(ODD_TIMES * 2):
        obj = json.loads(values[i * 7 % len(values)])
        obj["occurred_at" if i < len(ODD_TIMES) else "recorded_at"] = odd
        values.insert(rng.randrange(len(values)), json.dumps(obj).encode())
    for e in sample_events()[::5]:
        damaged = json.loads(e.to_json())
        target = damaged["payload"] if rng.random() < 0.6 else damaged
        target[rng.choice(sorted(target))] = rng.choice(ODD_VALUES)
        values.insert(rng.randrange(len(values)), json.dumps(damaged).encode())
    for raw in [b"{nope", b"", None, json.dumps(v1_payment_authorized()).encode()]:
        values.insert(rng.randrange(len(values)), raw)
    return [(i % 3, 100 + i, None, value) for i, value in enumerate(values)]


def reference_rows(records):
    """The event rows and rejections of ``records`` by the reference path, a record at a time."""
    from event_store.envelope import parse_time
    from spark_apps.events import ENVELOPE_COLUMNS, payload_columns
    from spark_apps.event_rows import event_row_schema, rows_table

    rows, bad = [], []
    for partition, offset, _, value in records:
        try:
            e = reference_event(value if value is not None else b"")
        except Exception as error:  # InvalidRecord
            bad.append((partition, offset, str(error)))
            continue
        row = {name: getattr(e, name) for name in ENVELOPE_COLUMNS}
        row.update(occurred_at=parse_time(e.occurred_at, "o"), recorded_at=parse_time(e.recorded_at, "r"))
        rows.append((*row.values(), *map(e.payload.get, payload_columns()), "events", partition, offset))
    return rows_table(rows, event_row_schema()), bad


@pytest.mark.parametrize("cut", [None, 1, 40])
def test_the_projections_batch_parser_gives_the_reference_rows_in_the_records_order(cut):
    from spark_apps.event_rows import parse_records

    class Records:
        rows = batch_records()[:cut] if cut else batch_records()

    table, bad = parse_records(Records, "events")
    expected, expected_bad = reference_rows(Records.rows)
    assert table.schema == expected.schema
    assert table.to_pylist() == expected.to_pylist()
    assert sorted(bad) == sorted(expected_bad)
    if cut is None:
        assert len(expected_bad) > 20 and expected.num_rows > 300
        reasons = " ".join(reason for _, _, reason in bad)
        assert "occurred_at" in reasons and "recorded_at" in reasons and "out of range" in reasons


@pytest.mark.parametrize("name", ["occurred_at", "recorded_at"])
@pytest.mark.parametrize("odd", ODD_TIMES)
def test_one_odd_time_among_ordinary_events_gets_the_reference_verdict(odd, name):
    # Alone in its batch, so that the batch check (pattern, date and range for a whole column) decides it.
    from spark_apps.event_rows import parse_records

    values = [e.to_json() for e in sample_events()[:30]]
    obj = json.loads(values[11])
    obj[name] = odd
    values[11] = json.dumps(obj).encode()

    class Records:
        rows = [(0, i, None, value) for i, value in enumerate(values)]

    table, bad = parse_records(Records, "events")
    expected, expected_bad = reference_rows(Records.rows)
    assert (table.to_pylist(), bad) == (expected.to_pylist(), expected_bad)


def test_a_batch_with_no_ordinary_event_gets_the_reference_rows():
    from spark_apps.event_rows import parse_records
    from tests.unit.test_upcasting import v1_payment_authorized

    old = json.dumps(v1_payment_authorized()).encode()

    class Records:
        rows = [(0, 1, None, old), (0, 2, None, b"{nope"), (1, 3, None, None)]

    table, bad = parse_records(Records, "events")
    expected, expected_bad = reference_rows(Records.rows)
    assert (table.to_pylist(), bad) == (expected.to_pylist(), expected_bad)
    assert table.num_rows == 1 and len(bad) == 2


def test_a_large_batch_parsed_by_two_processes_gives_the_reference_rows_and_survives_the_worker_dying(monkeypatch):
    import os
    import signal
    import time

    from python_engine import parsing
    from spark_apps.event_rows import Records
    from python_engine.parsing import ParseWorker

    monkeypatch.setattr(parsing, "PARALLEL_PARSE_MIN", 10)  # batch_records() is a large batch
    records = Records(rows=batch_records())
    expected, expected_bad = reference_rows(records.rows)
    said: list[str] = []
    worker = ParseWorker(said.append)
    try:
        table, bad = worker.parse(records, "events")  # starts the worker; this one is parsed here alone
        assert worker.process is not None and worker.batches == 0
        deadline = time.monotonic() + 60
        while not worker._up() and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(2):
            table, bad = worker.parse(records, "events")
            assert table.schema == expected.schema
            assert table.to_pylist() == expected.to_pylist()
            assert sorted(bad) == sorted(expected_bad)
        assert worker.batches == 2  # both parsed by two processes
        assert len(expected_bad) > 20 and not said

        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
        table, bad = worker.parse(records, "events")
        assert (table.to_pylist(), sorted(bad)) == (expected.to_pylist(), sorted(expected_bad))
        assert worker.failed and worker.process is None and worker.batches == 2
        assert len(said) == 1 and "second parser process stopped being used" in said[0] and "-9" in said[0]
        table, _ = worker.parse(records, "events")  # alone from now on
        assert table.to_pylist() == expected.to_pylist() and len(said) == 1
    finally:
        worker.close()


def test_a_small_batch_never_starts_the_second_parser():
    from spark_apps.event_rows import Records
    from python_engine.parsing import ParseWorker

    worker = ParseWorker(print)
    records = batch_records()[:50]  # (its ids differ from one call to the next)
    table, bad = worker.parse(Records(rows=records), "events")
    expected, expected_bad = reference_rows(records)
    assert (table.to_pylist(), sorted(bad)) == (expected.to_pylist(), sorted(expected_bad))
    assert worker.process is None


def test_the_second_parser_is_stopped_after_a_run_of_small_batches_and_started_again_by_a_large_one(monkeypatch):
    from python_engine import parsing
    from spark_apps.event_rows import Records
    from python_engine.parsing import ParseWorker

    monkeypatch.setattr(parsing, "PARALLEL_PARSE_MIN", 10)
    monkeypatch.setattr(parsing, "IDLE_BATCHES", 3)
    records = batch_records()
    worker = ParseWorker(print)
    try:
        worker.prepare()
        assert worker.process is not None
        for _ in range(2):
            worker.parse(Records(rows=records[:5]), "events")
        assert worker.process is not None
        worker.parse(Records(rows=records[:5]), "events")
        assert worker.process is None and not worker.failed
        worker.parse(Records(rows=records), "events")
        assert worker.process is not None
    finally:
        worker.close()
