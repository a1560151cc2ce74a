"""`eventlake query --format csv|json`: every row, values a program can read back as they were."""
import csv
import datetime as dt
import io
import json
from decimal import Decimal

from eventlake.query import format_csv, format_json_lines, format_table

COLUMNS = ["account_id", "balance_minor", "opened_at", "note", "raw", "rate"]
ROWS = [("acc-1", 1250, dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.timezone.utc), 'said "hi", then left',
         b"\xff\x00", Decimal("0.10")),
        ("acc-2", -7, None, "line\nbreak", None, None)]


def test_csv_is_every_row_with_a_header_and_reads_back():
    parsed = list(csv.reader(io.StringIO(format_csv(COLUMNS, ROWS))))
    assert parsed[0] == COLUMNS
    assert parsed[1] == ["acc-1", "1250", "2026-01-02T03:04:05.600000+00:00", 'said "hi", then left', "ff00", "0.10"]
    assert parsed[2] == ["acc-2", "-7", "", "line\nbreak", "", ""]
    assert len(parsed) == 3


def test_json_is_one_object_per_row_with_nulls_numbers_and_iso_timestamps():
    lines = format_json_lines(COLUMNS, ROWS).split("\n")
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first == {"account_id": "acc-1", "balance_minor": 1250, "opened_at": "2026-01-02T03:04:05.600000+00:00",
                     "note": 'said "hi", then left', "raw": "ff00", "rate": "0.10"}
    assert second["opened_at"] is None and second["note"] == "line\nbreak" and second["balance_minor"] == -7


def test_no_rows_give_a_header_only_csv_and_no_json_lines():
    assert format_csv(COLUMNS, []) == ",".join(COLUMNS)
    assert format_json_lines(COLUMNS, []) == ""
    assert format_table(["x"], []).endswith("(0 rows)")
