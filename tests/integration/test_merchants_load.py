"""Merchants loaded into dim_merchant for real (delta-rs, DuckDB, Great Expectations; no broker, no Spark): from a
CSV file, JSON lines and a SQLite database; the same file twice loads once; each kind of bad input is refused with
the file and the reason, nothing loaded, the source left where it was."""
import json
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from lakehouse.settings import Settings
from lakehouse.tables import read_table
from read_models.catalog import DIM_MERCHANT_TABLE, MERCHANT_LOADS_TABLE, MERCHANT_STAGING
from reference_data.loads import MerchantsRefused, load_merchants, quarantine_folder
from reference_data.merchants import MerchantInputError

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HEADER = "merchant_id,name,mcc,country,risk_level\n"


@pytest.fixture
def home(tmp_path):
    return Settings(home=tmp_path / "home")


def dim(settings):
    rows = read_table(settings.table_path(DIM_MERCHANT_TABLE)).to_pylist()
    return sorted(rows, key=lambda r: (r["merchant_id"], r["valid_from"]))


def write(path, text):
    path.write_text(text)
    return str(path)


def test_csv_then_json_lines_then_sqlite_keep_scd2_history_and_the_same_file_loads_once(home, tmp_path):
    first = write(tmp_path / "m1.csv", HEADER + "m1,Shop,5411,US,low\nm2,Fuel,5541,US,medium\n")
    report = load_merchants(home, first, as_of=T0)
    assert (report.status, report.version, report.counts["inserted"]) == ("loaded", 0, 2)
    again = load_merchants(home, first, as_of=T0 + timedelta(hours=1))
    assert again.status == "already loaded" and again.version == 0 and "already loaded" in again.lines()[0]
    lines = [{"merchant_id": "m1", "name": "Shop", "mcc": 5411, "country": "US", "risk_level": "high"},
             {"merchant_id": "m3", "name": "Books", "mcc": "5942", "country": "GB", "risk_level": "low"}]
    second = write(tmp_path / "m2.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    report = load_merchants(home, second, full=True, as_of=T0 + timedelta(days=1))
    assert report.counts == {"inserted": 1, "changed": 1, "closed": 1, "unchanged": 0} and report.version == 1
    rows = dim(home)
    assert [(r["merchant_id"], r["risk_level"], r["is_current"]) for r in rows] == [
        ("m1", "low", False), ("m1", "high", True), ("m2", "medium", False), ("m3", "low", True)]
    assert rows[0]["valid_to"] == rows[1]["valid_from"] == T0 + timedelta(days=1)
    db = tmp_path / "ref.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE merchants (merchant_id TEXT, name TEXT, mcc INTEGER, country TEXT, risk_level TEXT)")
        con.executemany("INSERT INTO merchants VALUES (?, ?, ?, ?, ?)",
                        [("m1", "Shop", 5411, "US", "high"), ("m3", "Books", 5942, "GB", "low"),
                         ("m2", "Fuel", 5541, "US", "medium")])
    report = load_merchants(home, f"sqlite:///{db}", full=True, as_of=T0 + timedelta(days=2))
    assert report.counts == {"inserted": 1, "changed": 0, "closed": 0, "unchanged": 2} and report.version == 2
    assert sum(r["is_current"] for r in dim(home)) == 3
    assert not any(home.table_path(MERCHANT_STAGING).iterdir())  # staged batches removed once merged
    # Lineage (lakehouse.lineage, the file transport): each load a run, its source in, dim_merchant and the loads
    # ledger out; a file, then the same file again, then JSON lines, then the SQLite table.
    from lakehouse.lineage import events_file, read_events

    runs = [e for e in read_events(events_file(home)) if e["job"]["name"] == "load_merchants"]
    assert [e["eventType"] for e in runs] == ["START", "COMPLETE"] * 4
    assert [(i["namespace"], i["name"]) for e in runs[::2] for i in e["inputs"]] == [
        ("file", first), ("file", first), ("file", second), (f"sqlite:///{str(db).lstrip('/')}", "merchants")]
    assert [o["name"] for o in runs[0]["outputs"]] == [str(home.table_path(DIM_MERCHANT_TABLE)),
                                                       str(home.table_path(MERCHANT_LOADS_TABLE))]


BAD = {
    "wrong header": ("bad.csv", HEADER.replace("risk_level", "risk") + "m1,Shop,5411,US,low\n",
                     MerchantInputError, r"bad\.csv: wrong header \(missing risk_level; unknown 'risk'\)"),
    "wrong type": ("bad.jsonl", '{"merchant_id": "m1", "name": "Shop", "mcc": 5411, "country": "US", '
                   '"risk_level": ["low"]}\n', MerchantInputError, r"bad\.jsonl: line 1: risk_level is list"),
    "wrong value": ("bad.csv", HEADER + "m1,Shop,54x1,US,low\n", MerchantsRefused, r"failed 1 expectation"),
    "duplicate ids": ("bad.csv", HEADER + "m1,Shop,5411,US,low\nm1,Other,5411,US,low\n", MerchantsRefused,
                      r"bad\.csv: the batch failed 1 expectation"),
    "empty file": ("bad.csv", "", MerchantInputError, r"bad\.csv: empty file"),
    "header only": ("bad.csv", HEADER, MerchantInputError, r"bad\.csv: no merchants in it"),
    "not UTF-8": ("bad.csv", None, MerchantInputError, r"bad\.csv: not UTF-8 text \(byte 0xff"),
    "oversized": ("bad.csv", HEADER + "m1,Shop,5411,US,low\n" * 80, MerchantInputError,
                  r"bad\.csv: 1,\d+ bytes, over the limit of 1,000 \(setting reference_max_bytes"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_with_the_file_and_the_reason_and_nothing_is_loaded(home, tmp_path, case):
    name, text, error, message = BAD[case]
    home = home.replace(reference_max_bytes=1000)
    path = tmp_path / name
    if text is None:
        path.write_bytes(HEADER.encode() + b"m1,Caf\xff,5411,US,low\n")
    else:
        path.write_text(text)
    before = path.read_bytes()
    with pytest.raises(error, match=message) as raised:
        load_merchants(home, str(path), as_of=T0)
    assert path.read_bytes() == before  # nothing lost: the source is where it was
    assert not (home.table_path(DIM_MERCHANT_TABLE) / "_delta_log").exists()  # nothing loaded
    load_id = next(home.table_path("_quarantine/merchants").iterdir()).name
    report = json.loads((quarantine_folder(home, load_id) / "report.json").read_text())
    assert str(path) in json.dumps(report)
    if error is MerchantsRefused:
        assert raised.value.lines and (quarantine_folder(home, load_id) / "batch" / "_delta_log").is_dir()


def test_the_cli_prints_the_counts_and_the_version_and_a_bad_file_exits_with_its_reason(tmp_path, monkeypatch, capsys):
    from eventlake.cli import main

    monkeypatch.setenv("EVENTLAKE_HOME", str(tmp_path / "home"))
    good = write(tmp_path / "m.csv", HEADER + "m1,Shop,5411,US,low\n")
    assert main(["load", "merchants", good]) == 0
    assert "1 inserted, 0 changed, 0 closed, 0 unchanged; dim_merchant at Delta version 0" in capsys.readouterr().out
    bad = write(tmp_path / "bad.csv", "id,name\nm1,Shop\n")
    assert main(["load", "merchants", bad]) == 2
    assert f"{bad}: wrong header" in capsys.readouterr().err
    assert main(["load", "merchants", good, "--from-db", "sqlite:///x.db"]) == 2
