"""The dead-letters triage's pure parts (expectations/dead_letters.py): records as the handler writes them parsed,
reasons grouped by kind, the report by reason and aggregate, its HTML, the watcher's signal, and the form's
refusals before anything is sent."""
import json

import pytest

from event_store.kafka_log import dead_letter_value
from expectations.dead_letters import (NO_KEY, QuarantineNotResolved, dead_letter_signal, parse_dead_letter,
                                       reason_kind, render_html, resolve_quarantine, summarize)
from lakehouse.settings import Settings

NOT_JSON = "command: not valid JSON (Expecting value: line 1 column 1 (char 0))"
NO_ID = "command: missing required field 'command_id'"


def letter(offset: int, key: bytes | None, reason: str, partition: int = 0):
    value = dead_letter_value(reason, b"\x00raw", "eventlake.commands", 3, 100 + offset)
    return parse_dead_letter(partition, offset, key, value)


def test_a_record_as_the_handler_writes_it_is_read_with_its_reason_aggregate_and_source():
    d = letter(7, b"acc-1", NOT_JSON)
    assert (d.partition, d.offset, d.aggregate, d.reason, d.source) == (0, 7, "acc-1", NOT_JSON,
                                                                          "eventlake.commands/3/107")
    assert d.recorded_at.endswith("Z")


def test_a_record_that_is_no_dead_letter_is_reported_not_dropped_and_no_key_is_named():
    d = parse_dead_letter(1, 2, None, b"\xff\xfe not json")
    assert d.aggregate == NO_KEY and d.reason.startswith("not a dead-letter record") and "xff" in d.reason
    assert parse_dead_letter(1, 3, b"k", b"[1, 2]").reason.startswith("not a dead-letter record")


def test_reasons_of_one_kind_group_together_and_field_names_stay():
    assert reason_kind(NOT_JSON) == reason_kind("command: not valid JSON (Unterminated string (char 12))") \
        == "command: not valid JSON (...)"
    assert reason_kind(NO_ID) == NO_ID
    assert (reason_kind("command: field 'amount_minor' must be int, got str '12.5 EUR'")
            == "command: field 'amount_minor' must be int, got str '...'")
    assert reason_kind("too big: 2,000,123 bytes") == "too big: N bytes"
    assert len(reason_kind("x" * 500)) == 160


def test_the_report_counts_by_reason_by_aggregate_and_both_most_first():
    letters = [letter(0, b"acc-1", NOT_JSON), letter(1, b"acc-2", NOT_JSON.replace("1 column 1", "2 column 9")),
               letter(2, b"acc-1", NOT_JSON), letter(3, None, NO_ID)]
    report = summarize("eventlake.dead-letters", letters, {0: [0, 4]})
    assert report.count == 4
    assert report.by_reason == {"command: not valid JSON (...)": 3, NO_ID: 1}
    assert list(report.by_aggregate.items()) == [("acc-1", 2), ("(no key)", 1), ("acc-2", 1)]
    assert report.by_reason_and_aggregate[0] == ("command: not valid JSON (...)", "acc-1", 2)
    assert sum(n for _, _, n in report.by_reason_and_aggregate) == 4
    assert report.reason_examples["command: not valid JSON (...)"] == NOT_JSON
    assert report.summary()["dead_letters"] == 4 and report.summary()["read"] == {"0": [0, 4]}
    assert report.lines()[0].startswith("dead letters: 4 new in eventlake.dead-letters (2 reason(s), 3 aggregate")
    json.dumps(report.summary())  # an asset event's extra


def test_nothing_new_is_said_so():
    report = summarize("t", [])
    assert report.count == 0 and report.by_reason == {} and report.lines() == ["dead letters: none new in t"]
    assert "0 new dead letter(s)" in render_html(report)


def test_the_html_report_names_each_reason_and_aggregate_and_escapes_what_it_quotes():
    page = render_html(summarize("t", [letter(0, b"<acc>", "command: bad <script>alert(1)</script>")]))
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;acc&gt;" in page
    assert "By reason" in page and "By aggregate" in page and "eventlake resolve-quarantine" in page
    assert "http" not in page  # nothing loaded from elsewhere
    earlier = render_html(summarize("t", []), ["report-2.json", "report-1.json"])
    assert earlier.index('href="report-2.json"') < earlier.index('href="report-1.json"')


class Message:
    """What confluent-kafka's Message offers the trigger's apply_function."""

    def __init__(self, key, value):
        self._key, self._value = key, value

    def topic(self):
        return "eventlake.dead-letters"

    def partition(self):
        return 1

    def offset(self):
        return 42

    def key(self):
        return self._key

    def value(self):
        return self._value


def test_the_watchers_signal_is_short_and_a_record_without_value_starts_nothing():
    signal = dead_letter_signal(Message(b"acc-9", dead_letter_value(NOT_JSON, b"x" * 10_000, "c", 0, 1)))
    assert signal == {"topic": "eventlake.dead-letters", "partition": 1, "offset": 42, "aggregate": "acc-9",
                      "reason": "command: not valid JSON (...)"}
    assert dead_letter_signal(Message(b"k", None)) is None


@pytest.mark.parametrize("account,record,reason", [("", "t/0/1", "ok"), ("acc-1", "", "ok"), ("acc-1", "t/0/1", "")])
def test_the_form_needs_an_account_a_record_and_a_reason_before_anything_is_sent(tmp_path, account, record, reason):
    with pytest.raises(QuarantineNotResolved, match="needs an account, the record"):
        resolve_quarantine(Settings(home=tmp_path), account, record, reason)


@pytest.mark.parametrize("record", ["not a record", "eventlake.events/0", "eventlake.events/x/1", "/0/1"])
def test_a_record_that_is_not_topic_partition_offset_is_refused_before_anything_is_sent(tmp_path, record):
    with pytest.raises(QuarantineNotResolved, match="is not topic/partition/offset"):
        resolve_quarantine(Settings(home=tmp_path), "acc-1", record, "checked by hand")
