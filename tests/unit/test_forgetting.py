"""A data subject forgotten in the read models (read_models.forgetting) on real delta-rs tables under a home: the
subject's aggregates found by the tokens of the archive, their personal columns nulled in every read model that
has them, other customers and other columns untouched, the old files purged; a dry run changes nothing."""
import json

import pyarrow as pa
from deltalake import write_deltalake

import read_models
from event_store.personal_data import SubjectKeys, keys_dir
from lakehouse.settings import Settings
from lakehouse.tables import read_table
from read_models.catalog import ARCHIVE_TABLE, Catalog
from read_models.forgetting import forget_in_read_models, personal_columns_of, subject_aggregates


def test_each_read_models_personal_columns_are_the_personal_fields_of_its_events():
    columns = {m.name: personal_columns_of(m) for m in read_models.select(None)}
    assert columns["account_summary"] == ("customer_name", "customer_email", "last_device_location")
    assert columns["payments"] == ("location",) and columns["fraud_alerts"] == ("evidence",)
    assert columns["telemetry_anomalies"] == ()  # the device's evidence is no one's personal data
    for model in read_models.select(None):  # each declares its own (a column named as a field is one)
        assert set(personal_columns_of(model)) == set(model.personal_columns), model.name
        assert set(model.personal_columns) <= set(model.columns), model.name
        assert bool(model.subject_column) == bool(model.personal_columns), model.name


def personal_home(tmp_path, **changes):
    # The home's files alone (no broker here): the keys topic's part is tests/integration/test_keys_topic.py's.
    settings = Settings.load({}).replace(home=tmp_path / "home", subject_keys_topic="off", **changes)
    keys = SubjectKeys(keys_dir(settings.home))
    archive = [{"aggregate_type": "account", "aggregate_id": a, "customer_id": customer, "customer_name": name,
                "location": place}
               for a, customer, name, place in [
                   ("acc-ada-1", "cust-ada", keys.seal("cust-ada", "customer_name", "Ada Lovelace"), None),
                   ("acc-ada-1", None, None, keys.seal("cust-ada", "location", "IS-RKV")),
                   ("acc-ada-2", None, None, keys.seal("cust-ada", "location", "IS-AKU")),
                   ("acc-grace", "cust-grace", keys.seal("cust-grace", "customer_name", "Grace Hopper"), None),
                   ("acc-old", "cust-old", "Plain Name", None),  # written with sealing off: no token
                   ("acc-old", None, None, "US-NYC")]]
    write_deltalake(str(settings.table_path(ARCHIVE_TABLE)), pa.Table.from_pylist(archive))
    catalog = Catalog(settings)
    write_deltalake(str(catalog.current("account_summary").table), pa.Table.from_pylist([
        {"account_id": "acc-ada-1", "customer_id": "cust-ada", "customer_name": "Ada Lovelace",
         "customer_email": "ada@example.org", "last_device_location": "IS-RKV", "balance": 1},
        {"account_id": "acc-grace", "customer_id": "cust-grace", "customer_name": "Grace Hopper",
         "customer_email": None, "last_device_location": None, "balance": 2}]))
    write_deltalake(str(catalog.current("payments").table), pa.Table.from_pylist([
        {"account_id": "acc-ada-1", "payment_id": "p1", "location": "IS-RKV"},
        {"account_id": "acc-ada-2", "payment_id": "p2", "location": "IS-AKU"},
        {"account_id": "acc-grace", "payment_id": "p3", "location": "US-SFO"}]))
    return settings


def _rows(settings, name):
    table = read_table(Catalog(settings).current(name).table)
    return sorted(tuple(r.values()) for r in table.to_pylist())


def test_a_subjects_values_are_nulled_in_every_read_model_and_the_rest_stays(tmp_path):
    settings = personal_home(tmp_path)
    assert subject_aggregates(settings, "cust-ada") == [("account", "acc-ada-1"), ("account", "acc-ada-2")]
    before = {name: _rows(settings, name) for name in ("account_summary", "payments")}
    lines = []
    dry = forget_in_read_models(settings, "cust-ada", "request #7", dry_run=True, log=lines.append)
    # account_summary, payments, then the archive (Ada's events in it are sealed: no plain value to null)
    assert [e.rows_holding for e in dry] == [1, 2, 0]
    assert {name: _rows(settings, name) for name in before} == before
    # The tables' files were written just now: by default they wait out the grace period (a writer's file may not
    # be committed yet), and the run says so; with none, it completes.
    waited = forget_in_read_models(settings, "cust-ada", "request #7", log=lines.append)
    assert [(e.rows_nulled, e.complete) for e in waited] == [(1, False), (2, False), (0, True)]
    assert all(e.files_deferred for e in waited[:2])
    done = forget_in_read_models(settings, "cust-ada", "request #7", grace_s=0, log=lines.append)
    assert [(e.rows_holding, e.complete, e.files_purged > 0) for e in done] == [(0, True, True), (0, True, True),
                                                                                   (0, True, False)]
    assert _rows(settings, "account_summary") == [("acc-ada-1", "cust-ada", None, None, None, 1),
                                                  ("acc-grace", "cust-grace", "Grace Hopper", None, None, 2)]
    assert _rows(settings, "payments") == [("acc-ada-1", "p1", None), ("acc-ada-2", "p2", None),
                                           ("acc-grace", "p3", "US-SFO")]
    assert any("2 aggregate(s) of theirs in the archive" in line for line in lines)
    # Not a byte of Ada's name or email under the tables, Delta logs included (their statistics quoted them).
    stored = b"".join(p.read_bytes() for p in settings.warehouse.rglob("*") if p.is_file())
    assert b"Ada Lovelace" not in stored and b"ada@example.org" not in stored and b"Grace Hopper" in stored
    assert all(e.rows_holding == e.files_holding == 0
               for e in forget_in_read_models(settings, "cust-ada", "request #7", grace_s=0, log=print))
    assert forget_in_read_models(settings, "cust-nobody", "request #8") == []


def test_eventlake_forget_deletes_the_key_then_the_values_and_says_what_it_did(tmp_path, monkeypatch, capsys):
    from eventlake.cli import main

    settings = personal_home(tmp_path)
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.setenv("EVENTLAKE_SUBJECT_KEYS_TOPIC", "off")  # the home's files alone, as personal_home's
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # no broker, whatever runs on this machine
    assert main(["forget", "cust-ada", "--reason", "request #9", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "key would be deleted" in out and "dry run: nothing changed" in out
    assert SubjectKeys(keys_dir(settings.home)).state("cust-ada") == "key"
    assert main(["forget", "cust-ada", "--reason", "request #9"]) == 4  # files of the last minutes: run again
    out = capsys.readouterr().out
    assert "not complete: run again later: files written in the grace period" in out
    # No broker in this home: the forget commands (SubjectForgotten on the log) are not sent, and the report says so.
    assert "log: account acc-ada-1: forget command not sent: KafkaAccessError" in out
    assert "a forget command was not sent or was refused" in out
    assert "commands topic eventlake.commands: handled commands not deleted: KafkaAccessError" in out
    assert "the handled commands were not deleted from the commands topic" in out
    assert SubjectKeys(keys_dir(settings.home)).state("cust-ada") == "forgotten"
    assert main(["forget", "cust-ada", "--reason", "request #9", "--grace-minutes", "0", "--no-log-event"]) == 0
    out = capsys.readouterr().out
    assert "log: not recorded (--no-log-event)" in out
    assert "key deleted before" in out and "complete: no read model table" in out
    assert "personal_data_seal is off: the events topic keeps the subject's plain values" in out
    assert _rows(settings, "account_summary")[0] == ("acc-ada-1", "cust-ada", None, None, None, 1)


def test_the_dead_letters_of_a_subject_lose_their_bytes_and_keep_why_and_where(tmp_path):
    """A dead letter keyed by one of the subject's accounts (an event written around the handler, in plain text)
    and one whose bytes hold a token of the subject (under another key) lose their bytes; their reason, topic and
    offset stay; another customer's dead letter keeps everything; the old file holding them is purged."""
    from datetime import datetime, timezone

    from read_models.catalog import DEAD_LETTER_TABLE
    from read_models.forgetting import DEAD_LETTER_BYTES

    settings = personal_home(tmp_path)
    token = SubjectKeys(keys_dir(settings.home)).seal("cust-ada", "location", "IS-RKV")
    at = datetime(2026, 11, 30, tzinfo=timezone.utc)
    letters = [(b'{"aggregate_id": "acc-ada-1", "customer_name": "Ada Lovelace"', "acc-ada-1", 1),
               (b'{"location": "' + token.encode() + b'", "amount_minor": "x"}', "acc-\u00e9'q", 2),
               (b'{"customer_name": "Grace Hopper"', "acc-grace", 3)]
    write_deltalake(str(settings.table_path(DEAD_LETTER_TABLE)), pa.Table.from_pylist([
        {"reason": f"reason {n}", "raw_value": raw.decode(), "raw_value_base64": "b64", "kafka_topic": "events",
         "kafka_partition": 0, "kafka_offset": n, "dead_lettered_at": at, "raw_bytes": raw, "kafka_key": key}
        for raw, key, n in letters]))

    erased = forget_in_read_models(settings, "cust-ada", "request #10", grace_s=0, log=lambda *_: None)

    letters_erasure = [e for e in erased if e.table.endswith("_dead_letters/events")]
    assert [(e.rows_nulled, e.files_purged, e.complete) for e in letters_erasure] == [(2, 1, True)]
    rows = sorted(read_table(settings.table_path(DEAD_LETTER_TABLE)).to_pylist(), key=lambda r: r["kafka_offset"])
    assert [(r["reason"], r["kafka_offset"]) for r in rows] == [("reason 1", 1), ("reason 2", 2), ("reason 3", 3)]
    assert [[r[c] for c in DEAD_LETTER_BYTES] for r in rows[:2]] == [[None, None, None], [None, None, None]]
    assert rows[2]["raw_bytes"] == letters[2][0] and rows[2]["raw_value"] == letters[2][0].decode()
    stored = b"".join(p.read_bytes() for p in settings.table_path(DEAD_LETTER_TABLE).rglob("*") if p.is_file())
    assert b"Ada Lovelace" not in stored and token.encode() not in stored and b"Grace Hopper" in stored


def _projection_checkpoint(settings, name="projection-account_summary+payments"):
    from projection_core.checkpoint import Checkpoint

    checkpoint = Checkpoint(settings.checkpoints / name, settings.events_topic, 1)
    checkpoint.start({0: 0})
    checkpoint.plan(0, {0: 5})
    checkpoint.commit(0)
    return checkpoint


def test_forget_waits_for_a_batch_planned_before_the_key_went_then_nulls_what_it_wrote(tmp_path):
    """A projection's batch planned before the key went may have unsealed the subject's values; when it commits after
    forget's UPDATE it writes them back. forget waits for it: the values it writes late are nulled too."""
    import threading
    import time

    from deltalake import DeltaTable

    from projection_core.forget_subject import forget_subject

    settings = personal_home(tmp_path)
    checkpoint = _projection_checkpoint(settings)
    checkpoint.plan(1, {0: 9})  # in flight as the key goes
    keys = SubjectKeys(keys_dir(settings.home))
    table = str(Catalog(settings).current("payments").table)

    def the_batch_in_flight():  # it read Ada's place before the key went; it writes and commits a little after
        deadline = time.monotonic() + 30
        while keys.state("cust-ada") != "forgotten" and time.monotonic() < deadline:
            time.sleep(0.05)
            keys.reload()
        time.sleep(2.0)
        DeltaTable(table).merge(pa.Table.from_pylist([{"account_id": "acc-ada-2", "payment_id": "p4",
                                                       "location": "IS-AKU"}]),
                                "t.payment_id = s.payment_id", source_alias="s", target_alias="t") \
            .when_not_matched_insert_all().execute()
        checkpoint.commit(1)

    batch = threading.Thread(target=the_batch_in_flight)
    batch.start()
    lines = []
    report = forget_subject(settings, "cust-ada", "request #11", grace_s=0, wait_s=60, log=lines.append,
                            record=False)
    batch.join()
    assert report.complete and not report.in_flight, report.lines()
    assert any("waiting" in line and "projection-account_summary+payments batch 1" in line for line in lines), lines
    assert _rows(settings, "payments") == [("acc-ada-1", "p1", None), ("acc-ada-2", "p2", None),
                                           ("acc-ada-2", "p4", None), ("acc-grace", "p3", "US-SFO")]


def test_a_batch_that_never_commits_or_a_rebuild_running_leaves_forget_incomplete_and_named(tmp_path, monkeypatch,
                                                                                           capsys):
    """A projection killed in a batch planned before the key went (it runs it again when it starts) and a rebuild
    holding a read model: forget erases what it may, names what it could not, and exits 4; once they are done, a
    second run completes."""
    from eventlake.cli import main
    from projection_core.rebuild_lock import RebuildLock

    settings = personal_home(tmp_path)
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.setenv("EVENTLAKE_SUBJECT_KEYS_TOPIC", "off")
    checkpoint = _projection_checkpoint(settings, "generations/payments/g0002/projection-payments")
    checkpoint.plan(1, {0: 9})
    rebuild = RebuildLock(settings, "account_summary", log=lambda *_: None).acquire()
    try:
        code = main(["forget", "cust-ada", "--reason", "request #12", "--grace-minutes", "0", "--wait-seconds", "0.5",
                     "--no-log-event"])
        out = capsys.readouterr().out
    finally:
        rebuild.release()
    assert code == 4, out
    assert "generations/payments/g0002/projection-payments batch 1: planned before the key went" in out
    assert "account_summary: a rebuild of it is already running" in out and "not erased" in out
    assert "a projection's batch planned before the key went had not committed" in out
    assert _rows(settings, "account_summary")[0][2] == "Ada Lovelace"  # left, under the rebuild's lock
    assert _rows(settings, "payments")[0] == ("acc-ada-1", "p1", None)
    checkpoint.commit(1)
    assert main(["forget", "cust-ada", "--reason", "request #12", "--grace-minutes", "0", "--no-log-event"]) == 0, \
        capsys.readouterr()
    assert _rows(settings, "account_summary")[0] == ("acc-ada-1", "cust-ada", None, None, None, 1)


def test_a_subject_whose_events_were_written_with_sealing_off_is_found_by_their_customer_id_and_forgotten(tmp_path):
    """No token names them: their accounts are found by the customer_id their AccountOpened names; their plain values
    are nulled in the read models and in the archive (whose copies of their sealed values, and everyone else's
    values, stay), and purged from the tables' history."""
    settings = personal_home(tmp_path)
    catalog = Catalog(settings)
    write_deltalake(str(catalog.current("account_summary").table), pa.Table.from_pylist([
        {"account_id": "acc-old", "customer_id": "cust-old", "customer_name": "Plain Name",
         "customer_email": "plain@example.org", "last_device_location": "US-NYC", "balance": 3}]), mode="append")
    write_deltalake(str(catalog.current("payments").table), pa.Table.from_pylist([
        {"account_id": "acc-old", "payment_id": "p5", "location": "US-NYC"}]), mode="append")
    assert subject_aggregates(settings, "cust-old") == [("account", "acc-old")]

    erased = forget_in_read_models(settings, "cust-old", "request #15", grace_s=0, log=lambda *_: None)

    assert [e.rows_nulled for e in erased if e.table.endswith(ARCHIVE_TABLE)] == [2]
    assert _rows(settings, "account_summary")[2] == ("acc-old", "cust-old", None, None, None, 3)
    assert ("acc-old", "p5", None) in _rows(settings, "payments")
    archive = {(r["aggregate_id"], r["customer_id"]): r for r in read_table(settings.table_path(ARCHIVE_TABLE))
               .to_pylist() if r["customer_id"]}
    assert archive[("acc-old", "cust-old")]["customer_name"] is None
    assert archive[("acc-ada-1", "cust-ada")]["customer_name"].startswith("elk1:")  # sealed: left as it is
    stored = b"".join(p.read_bytes() for p in settings.warehouse.rglob("*") if p.is_file())
    assert b"Plain Name" not in stored and b"plain@example.org" not in stored and b"US-NYC" not in stored
    assert b"Ada Lovelace" in stored and b"Grace Hopper" in stored  # in the read models: not forgotten


def test_the_reports_quoting_a_subjects_values_go_and_the_others_stay(tmp_path):
    """A Data Docs page quoting Ada's name (HTML-escaped), a validation result quoting her place (JSON), a dead-letter
    report quoting her email: deleted before the tables forget, and listed; a page quoting Grace only stays. A dry
    run lists them and deletes nothing."""
    from projection_core.forget_subject import forget_subject

    settings = personal_home(tmp_path)
    ada = settings.data_docs / "validations" / "account_summary" / "g0001-v3" / "run" / "account_summary.html"
    place = settings.check_results / "validations" / "payments" / "g0001-v2" / "run" / "payments.json"
    letters = settings.data_docs / "dead_letters" / "report-20261130T000000Z.json"
    grace = settings.data_docs / "validations" / "account_summary" / "g0001-v2" / "run" / "account_summary.html"
    for path, text in ((ada, "<td>Ada Lovelace</td>"), (place, json.dumps({"unexpected": ["IS-AKU"]})),
                       (letters, json.dumps({"raw": "ada@example.org"})), (grace, "<td>Grace Hopper</td>")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    dry = forget_subject(settings, "cust-ada", "request #16", dry_run=True, log=lambda *_: None)
    assert [(f.holding, f.deleted) for f in dry.reports] == [(2, 0), (1, 0)] and ada.exists()
    report = forget_subject(settings, "cust-ada", "request #16", grace_s=0, log=lambda *_: None, record=False)
    assert [(f.holding, f.deleted) for f in report.reports] == [(2, 2), (1, 1)], report.lines()
    assert not ada.exists() and not place.exists() and not letters.exists() and grace.exists()
    assert any("data_docs: 2 file(s) quoted the subject's values; deleted 2" in line for line in report.lines())
    assert report.complete


def test_a_query_as_of_a_moment_before_the_erasure_says_it_was_erased_and_shows_no_value(tmp_path, monkeypatch,
                                                                                          capsys):
    """`eventlake query --as-of` a version or time before a forget: the read fails naming the erasure (its version,
    time and reason), never the values; at the erasure's version and later the values are null."""
    from eventlake.cli import main

    settings = personal_home(tmp_path)
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.setenv("EVENTLAKE_SUBJECT_KEYS_TOPIC", "off")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    sql = "SELECT customer_name FROM account_summary ORDER BY account_id"
    assert main(["query", "--as-of", "0", sql]) == 0
    assert "Ada Lovelace" in capsys.readouterr().out  # time travel reads the values before the erasure
    assert main(["forget", "cust-ada", "--reason", "request #17", "--grace-minutes", "0", "--no-log-event"]) == 0
    capsys.readouterr()
    for as_of in ("0", "2026-01-01T00:00:00Z"):
        assert main(["query", "--as-of", as_of, sql]) != 0
        out, err = capsys.readouterr()
        assert "account_summary was erased at version 1" in err and "reason 'request #17'" in err, err
        assert "Ada" not in out + err
    assert main(["query", "--as-of", "1", sql]) == 0
    assert capsys.readouterr().out.split()[:3] == ["customer_name", "-------------", "NULL"]


def test_a_warehouse_under_a_storage_uri_is_erased_too(tmp_path):
    """The tables under a storage URI (here a file: one, through delta-rs' object store as an hdfs:// or s3a:// one
    would be): the subject's values nulled, and no byte of them left in any file of the warehouse; before the
    erasure handled URIs, forget said complete and left every old file and commit holding them."""
    from projection_core.forget_subject import forget_subject

    settings = personal_home(tmp_path, warehouse_uri=f"file://{tmp_path}/lake")
    lake = tmp_path / "lake"
    assert b"Ada Lovelace" in b"".join(p.read_bytes() for p in lake.rglob("*") if p.is_file())
    report = forget_subject(settings, "cust-ada", "request #18", grace_s=0, log=lambda *_: None, record=False)
    assert report.complete, report.lines()
    assert sorted(report.changed_models) == ["account_summary", "payments"]
    stored = b"".join(p.read_bytes() for p in lake.rglob("*") if p.is_file())
    assert [v for v in (b"Ada Lovelace", b"ada@example.org", b"IS-RKV", b"IS-AKU") if v in stored] == []
    assert b"Grace Hopper" in stored and b"US-SFO" in stored
