"""Personal data sealed on the write path and unsealed by the readers (event_store.sealing, issue 45): the decider
with a sealer, a forgotten subject's commands, the event schemas' sealable fields, event rows unsealed, and the
setting that keeps Spark readers from writing tokens."""
from __future__ import annotations

import json

import pytest

from event_store.account import AccountState, subject_of
from event_store.batch_decision import DecisionCounts, RecordLimits, StagedChanges, decide_records
from event_store.decider import event_id_for, execute, execute_encoded
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.errors import InvalidRecord
from event_store.personal_data import SubjectKeys, is_sealed, keys_dir
from event_store.sealing import Sealer, Unsealer, personal_columns, sealing_on
from event_store.snapshots import PartitionState
from lakehouse.settings import Settings, SettingsError

T = "2026-01-01T00:00:00.000Z"
NAME, EMAIL = "Ada Lovelace", "ada@example.org"
PLAIN = (NAME, EMAIL, "IS-RKV", "NZ-WLG")


def command(kind: str, account: str, payload: dict, command_id: str) -> CommandEnvelope:
    return CommandEnvelope.create(kind, account, payload, command_id=command_id, issued_at=T)


def open_account(account: str = "acc-1", customer: str = "cust-1", command_id: str = "c-open", **extra):
    return command("OpenAccount", account, {"customer_id": customer, "credit_limit_minor": 10_000,
                                            "currency": "USD", **extra}, command_id)


def located(account: str = "acc-1", location: str = "IS-RKV", command_id: str = "c-loc"):
    return command("ReportDeviceLocation", account, {"location": location, "occurred_at": T}, command_id)


def pay(account: str = "acc-1", location: str = "NZ-WLG", command_id: str = "c-pay", payment_id: str = "p-1"):
    return command("AuthorizePayment", account, {"payment_id": payment_id, "amount_minor": 500, "currency": "USD",
                                                 "merchant_id": "m-1", "location": location, "occurred_at": T},
                   command_id)


@pytest.fixture
def keys(tmp_path) -> SubjectKeys:
    return SubjectKeys(keys_dir(tmp_path))


def run(commands, sealer, state=None):
    """The encoded events of ``commands`` decided in turn on one account, the final state, and the results."""
    state = state or AccountState(commands[0].aggregate_id)
    events, results = [], []
    for c in commands:
        state, encoded, result = execute_encoded(state, c, T, None, sealer)
        events += encoded
        results.append(result)
    return events, state, results


def test_the_handler_seals_every_personal_field_before_the_events_are_written(keys):
    events, state, results = run([open_account(customer_name=NAME, customer_email=EMAIL), located(), pay()],
                                 Sealer(keys))
    assert [r.status for r in results] == ["accepted"] * 3
    raw = b"".join(events)
    assert not [p for p in PLAIN if p.encode() in raw], "a plain personal value reached the events"
    parsed = [EventEnvelope.from_json(e) for e in events]  # tokens are valid in an event's personal fields
    opened = parsed[0].payload
    assert is_sealed(opened["customer_name"]) and is_sealed(opened["customer_email"])
    assert opened["customer_id"] == "cust-1"  # the subject id stays in clear: readers find the key by it
    assert is_sealed(parsed[1].payload["location"]) and is_sealed(parsed[2].payload["location"])
    assert parsed[2].payload["merchant_country"] == "NZ"  # decided on the plain location
    # What the handler keeps (the state, hence its store and snapshots) holds the token, not the value.
    assert state.last_device_location == parsed[1].payload["location"]
    unsealer = Unsealer(keys=keys)
    assert unsealer.event(parsed[0]).payload == {"customer_id": "cust-1", "credit_limit_minor": 10_000,
                                                 "currency": "USD", "customer_name": NAME, "customer_email": EMAIL}
    assert [unsealer.event(e).payload["location"] for e in parsed[1:]] == ["IS-RKV", "NZ-WLG"]


def test_a_re_decided_command_gets_the_same_event_ids_and_other_bytes(keys):
    # Event ids derive from aggregate, version and command (decider.event_id_for), not from the payload: the
    # random nonce changes the bytes of a batch redone after an abort, never its ids (readers dedup by id).
    sealer = Sealer(keys)
    first, _, _ = run([open_account(), located()], sealer)
    again, _, _ = run([open_account(), located()], sealer)
    plain, _, _ = run([open_account(), located()], None)
    ids = [[json.loads(e)["event_id"] for e in events] for events in (first, again, plain)]
    assert ids[0] == ids[1] == ids[2] == [event_id_for("account", "acc-1", v, c) for v, c in ((1, "c-open"),
                                                                                               (2, "c-loc"))]
    assert first[1] != again[1]
    assert json.loads(first[1])["payload"]["location"] != json.loads(again[1])["payload"]["location"]
    assert Unsealer(keys=keys).value(json.loads(again[1])["payload"]["location"], "location") == "IS-RKV"


def test_execute_and_execute_encoded_seal_alike(keys):
    sealer = Sealer(keys)
    state, envelopes, result = execute(AccountState("acc-1"), open_account(customer_name=NAME), T, None, sealer)
    assert result.status == "accepted" and is_sealed(envelopes[0].payload["customer_name"])
    state, envelopes, _ = execute(state, located(), T, None, sealer)
    assert state.last_device_location == envelopes[0].payload["location"] and is_sealed(state.last_device_location)


def test_without_a_sealer_events_carry_plain_values_and_older_commands_still_parse():
    events, state, _ = run([open_account(customer_name=NAME), located()], None)
    payloads = [json.loads(e)["payload"] for e in events]
    assert payloads[0]["customer_name"] == NAME and "customer_email" not in payloads[0]
    assert state.last_device_location == "IS-RKV"
    older, _, _ = run([open_account()], None)  # an OpenAccount without name and email, as before
    assert set(json.loads(older[0])["payload"]) == {"customer_id", "credit_limit_minor", "currency"}


def test_a_forgotten_subjects_commands_are_refused_and_other_subjects_are_not(keys):
    sealer = Sealer(keys)
    _, state_1, _ = run([open_account(customer_name=NAME), located()], sealer)
    _, state_2, _ = run([open_account("acc-2", customer="cust-2")], sealer)
    # Another process (``eventlake forget``, later) forgets the subject; the handler sees it at its next batch.
    SubjectKeys(keys.directory).forget("cust-1")
    sealer.refresh()
    for c in (located(command_id="c-2"), pay(), command("FreezeAccount", "acc-1", {"reason": "x"}, "c-f"),
              open_account(command_id="c-open-again")):
        _, encoded, result = execute_encoded(state_1, c, T, None, sealer)
        assert (result.status, result.error_type, encoded) == ("rejected", "SubjectForgotten", []), c.command_type
        assert "'cust-1'" in result.reason and "forgotten" in result.reason
    # A new account of the forgotten customer is refused too (its subject is the command's customer_id).
    _, encoded, result = execute_encoded(AccountState("acc-3"), open_account("acc-3", command_id="c-3"), T, None,
                                         sealer)
    assert result.error_type == "SubjectForgotten" and encoded == []
    _, encoded, result = execute_encoded(state_2, located("acc-2", command_id="c-4"), T, None, sealer)
    assert result.status == "accepted" and len(encoded) == 1


def test_with_sealing_off_events_stay_plain_and_a_forgotten_subjects_commands_are_refused_all_the_same(keys):
    """``eventlake forget`` on a home that never sealed: nothing to seal or delete, but the subject's tombstone
    refuses their new commands, which would otherwise bring their data back in plain text."""
    sealer = Sealer(keys, seal=False)
    events, state, _ = run([open_account(customer_name=NAME), located()], sealer)
    assert [json.loads(e)["payload"].get("customer_name", json.loads(e)["payload"].get("location")) for e in events] \
        == [NAME, "IS-RKV"]
    assert not keys.path.exists()  # sealing off makes no key
    SubjectKeys(keys.directory).forget("cust-1")
    sealer.refresh()
    _, encoded, result = execute_encoded(state, pay(), T, None, sealer)
    assert (result.error_type, encoded) == ("SubjectForgotten", [])
    _, encoded, result = execute_encoded(AccountState("acc-2"), open_account("acc-2", customer="cust-2"), T, None,
                                         sealer)
    assert result.status == "accepted" and not is_sealed(json.loads(encoded[0])["payload"]["customer_id"])


def test_the_batch_decision_answers_a_forgotten_subjects_command_with_its_rejection(keys):
    class Record:
        def __init__(self, value, offset):
            self._value, self._offset = value, offset

        def value(self):
            return self._value

        def key(self):
            return b"acc-1"

        def topic(self):
            return "commands"

        def partition(self):
            return 0

        def offset(self):
            return self._offset

    topics = ("events", "results", "dead-letters")
    limits = RecordLimits.of(*topics, dict.fromkeys(topics, 1_000_000))
    keys.forget("cust-1")
    writes = decide_records([Record(open_account().to_json(), 0)], PartitionState(0), StagedChanges(),
                            DecisionCounts(), T, None, limits, Sealer(keys))
    assert writes.events == []
    [(_, value)] = writes.results
    assert CommandResult.from_json(value).error_type == "SubjectForgotten"


def test_the_subject_of_an_account_is_its_customer():
    assert subject_of(AccountState("acc-1"), open_account()) == "cust-1"
    assert subject_of(AccountState("acc-1"), located()) is None  # not opened: refused as AccountNotFound
    opened = AccountState("acc-1", version=1, opened=True, customer_id="cust-9")
    assert subject_of(opened, located()) == "cust-9"
    assert subject_of(opened, open_account(customer="someone-else")) == "cust-9"


def test_an_event_takes_a_token_in_a_personal_field_and_a_command_does_not(keys):
    token = keys.seal("cust-1", "location", "IS-RKV")
    event = json.loads(run([open_account(), located()], None)[0][1])
    event["payload"]["location"] = token
    assert EventEnvelope.from_json(json.dumps(event).encode()).payload["location"] == token
    event["payload"]["location"] = "not a region"
    with pytest.raises(InvalidRecord, match="location"):
        EventEnvelope.from_json(json.dumps(event).encode())
    event["payload"]["location"] = "elk1:bad"  # only a whole token passes
    with pytest.raises(InvalidRecord, match="location"):
        EventEnvelope.from_json(json.dumps(event).encode())
    with pytest.raises(InvalidRecord, match="location"):
        CommandEnvelope.from_json(located(location=token).to_json())
    with pytest.raises(InvalidRecord, match="customer_email"):
        CommandEnvelope.from_json(open_account(customer_email="no at sign").to_json())


def test_event_rows_are_unsealed_column_by_column_and_a_forgotten_subject_reads_as_null(tmp_path, keys):
    import pyarrow as pa

    tokens = [keys.seal("cust-1", "location", "IS-RKV"), keys.seal("cust-2", "location", "NZ-WLG")]
    table = pa.table({"event_id": ["e1", "e2", "e3", "e4"], "location": [tokens[0], tokens[1], "US-NYC", None],
                      "customer_name": [None, None, keys.seal("cust-2", "customer_name", NAME), None]})
    unsealer = Unsealer(keys=keys)
    opened = unsealer.rows(table)
    assert opened.column("location").to_pylist() == ["IS-RKV", "NZ-WLG", "US-NYC", None]
    assert opened.column("customer_name").to_pylist() == [None, None, NAME, None]
    assert opened.schema == table.schema and opened.column("event_id") == table.column("event_id")
    SubjectKeys(keys.directory).forget("cust-1")
    unsealer.refresh()
    assert unsealer.rows(table).column("location").to_pylist() == [None, "NZ-WLG", "US-NYC", None]
    assert {"location", "evidence", "customer_name", "customer_email"} <= personal_columns()
    # Rows without a token never open a key store (a home without one is fine).
    plain = Unsealer(Settings.load({}).replace(home=tmp_path / "no-keys"))
    assert plain.rows(table.select(["event_id", "location"]).slice(2, 2)).num_rows == 2 and plain._keys is None


def test_sealing_is_a_setting(tmp_path):
    settings = Settings.load({"EVENTLAKE_PERSONAL_DATA_SEAL": "on"}).replace(home=tmp_path)
    assert sealing_on(settings) and not sealing_on(settings.replace(personal_data_seal="off"))
    with pytest.raises(SettingsError, match="personal_data_seal"):
        sealing_on(settings.replace(personal_data_seal="yes"))
    assert not Sealer.for_settings(settings.replace(personal_data_seal="off")).sealing
    assert Sealer.for_settings(settings).keys.directory == keys_dir(tmp_path)


class _GroupState:
    """Spark's GroupState as ``applyInPandasWithState`` hands it to the function: one account's stored row."""

    def __init__(self, row=None):
        self.row = row

    @property
    def exists(self) -> bool:
        return self.row is not None

    @property
    def get(self):
        return self.row

    def update(self, row) -> None:
        self.row = row


def _detected(events, state: _GroupState, settings=None) -> list[tuple[str, str, str]]:
    """The Spark fraud detector's function over one batch of ``events`` (the columns ``FraudDetector.findings``
    selects) -> its findings (payment, rule, evidence)."""
    import pandas as pd

    from event_store.envelope import parse_time
    from spark_apps.fraud_detector import detect_in_group

    frame = pd.DataFrame([{"aggregate_id": e.aggregate_id, "aggregate_version": e.aggregate_version,
                           "event_type": e.event_type, "payment_id": e.payload.get("payment_id"),
                           "amount_minor": e.payload.get("amount_minor"), "location": e.payload.get("location"),
                           "time_ms": int(parse_time(e.occurred_at, "occurred_at").timestamp() * 1000)}
                          for e in events])
    out = list(detect_in_group(("acc-1",), iter([frame]), state, settings=settings))
    return [(r.payment_id, r.rule, r.evidence) for f in out for r in f.itertuples(index=False)]


def test_the_spark_fraud_detector_opens_sealed_locations_and_keeps_them_sealed_in_its_state(keys, tmp_path):
    # Rule 3 compares the payment's location with the device's: with sealing on both are tokens, opened through the
    # home's key store in Spark's Python workers; the state (Spark's state store and its checkpoints) keeps tokens.
    settings = Settings.load({}).replace(home=tmp_path, subject_keys_topic="off")  # no broker here
    decided = [open_account(), located(), pay(),
               pay(location="FR-PAR", command_id="c-pay-2", payment_id="p-2"),
               pay(location="FR-PAR", command_id="c-pay-3", payment_id="p-3")]
    plain_events = [EventEnvelope.from_json(e) for e in run(decided[:3], Sealer(keys, seal=False))[0]]
    sealed_events = [EventEnvelope.from_json(e) for e in run(decided, Sealer(keys))[0]]
    assert is_sealed(sealed_events[2].payload["location"])

    def located_findings(events, state, settings=None):
        return [f for f in _detected(events, state, settings) if f[1] == "location_mismatch"]

    mismatch = ("p-1", "location_mismatch", "payment at NZ-WLG, device at IS-RKV")
    assert located_findings(plain_events, _GroupState()) == [mismatch]
    state = _GroupState()
    assert located_findings(sealed_events[:3], state, settings) == [mismatch]
    stored = state.row[0]
    assert "IS-RKV" not in stored and "elk1:" in stored, stored

    # The next batch opens the stored token: a payment elsewhere is flagged against the device's location.
    assert located_findings(sealed_events[3:4], state, settings) == [
        ("p-2", "location_mismatch", "payment at FR-PAR, device at IS-RKV")]

    # Forgotten: every location of the subject reads as null, rule 3 has nothing to compare, and nothing fails.
    keys.forget("cust-1")
    assert located_findings(sealed_events[4:], state, settings) == []
    assert "IS-RKV" not in state.row[0]


def test_a_duckdb_fold_reads_personal_columns_unsealed_through_the_registered_function(keys):
    import duckdb
    import pyarrow as pa

    from event_store.sealing import unsealed_select

    table = pa.table({"event_id": ["e1", "e2", "e3"], "location": [keys.seal("cust-1", "location", "IS-RKV"),
                                                                  "US-NYC", None]})
    con = duckdb.connect()
    try:
        unsealer = Unsealer(keys=keys)
        unsealer.register(con)
        unsealer.register(con)  # once per connection, however often asked
        con.register("batch", table)
        con.execute(f"CREATE VIEW events AS {unsealed_select('batch', table.column_names)}")
        assert con.sql("SELECT event_id, location FROM events ORDER BY event_id").fetchall() == [
            ("e1", "IS-RKV"), ("e2", "US-NYC"), ("e3", None)]
        assert con.sql("SELECT location FROM batch WHERE event_id = 'e1'").fetchall()[0][0].startswith("elk1:")
        # A batch's tokens are opened once, however many folds read them (a model each); the memo is the batch's.
        opened = []
        unseal = keys.unseal
        keys.unseal = lambda token, **kw: opened.append(token) or unseal(token, **kw)
        for _ in range(3):
            assert con.sql("SELECT location FROM events WHERE event_id = 'e1'").fetchall() == [("IS-RKV",)]
        assert opened == []  # opened by the first query above already
        unsealer.refresh()
        assert con.sql("SELECT location FROM events WHERE event_id = 'e1'").fetchall() == [("IS-RKV",)]
        assert len(opened) == 1
        del keys.unseal
        keys.forget("cust-1")
        unsealer.refresh()
        assert con.sql("SELECT location FROM events WHERE event_id = 'e1'").fetchall() == [(None,)]
    finally:
        con.close()
    assert unsealed_select("batch", ["event_id"]) == "SELECT * FROM batch"


def test_an_account_summary_table_made_before_the_customer_columns_gains_them(tmp_path):
    # Read models' columns are added, never renamed (docs/DESIGN.md): a table an older release made gets the new
    # nullable columns when the projection starts, so the MERGEs naming them find them (python_engine.tables).
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    import read_models
    from lakehouse.tables import add_missing_columns
    from spark_apps.arrow_rows import arrow_schema

    schema = arrow_schema(read_models.get("account_summary").schema())
    old = pa.schema([f for f in schema if f.name not in ("customer_name", "customer_email")])
    path = str(tmp_path / "account_summary")
    DeltaTable.create(path, old)
    write_deltalake(path, pa.Table.from_pylist([{"account_id": "acc-1", "version": 1}], schema=old), mode="append")
    assert add_missing_columns(DeltaTable(path), schema) == ["customer_name", "customer_email"]
    table = DeltaTable(path)
    assert [f.name for f in pa.schema(table.schema().to_arrow())] == schema.names
    [row] = table.to_pyarrow_table().to_pylist()
    assert (row["account_id"], row["customer_name"], row["customer_email"]) == ("acc-1", None, None)
    assert add_missing_columns(DeltaTable(path), schema) == []  # once


def test_unsealing_a_subjects_tokens_again_keeps_every_check(keys):
    # Readers unseal token after token of the same subjects and fields: what the first one worked out is kept
    # (subject, associated data), and none of the checks may be skipped for the next ones.
    from event_store.personal_data import SealedValueError

    first, second = keys.seal("cust-1", "location", "IS-RKV"), keys.seal("cust-1", "location", "\ud800 odd")
    assert keys.unseal(first, field_name="location") == "IS-RKV"
    assert keys.unseal(second, subject="cust-1", field_name="location") == "\ud800 odd"  # JSON's own reading
    head, sealed = second.rsplit(":", 1)
    with pytest.raises(SealedValueError, match="does not authenticate"):
        keys.unseal(f"{head}:{sealed[:-2]}{'AB' if sealed[-2:] != 'AB' else 'CD'}", field_name="location")
    with pytest.raises(SealedValueError, match="moved between fields"):
        keys.unseal(first, field_name="customer_name")
    with pytest.raises(SealedValueError, match="moved between subjects"):
        keys.unseal(first, subject="cust-2", field_name="location")
    other = SubjectKeys(keys.directory)
    assert other.unseal(first) == "IS-RKV"
    keys.forget("cust-1")
    assert keys.unseal(first, field_name="location") is None
    other.refresh()
    assert other.unseal(first) is None


def test_the_rebuilds_duckdb_fold_reads_the_sealed_archive_in_clear_and_keeps_what_it_holds_back_sealed(tmp_path):
    # The rebuild's fold of event_archive in DuckDB (spark_apps.archive_fold, no JVM) over events the handler
    # sealed: the tables in clear, the events held back after a gap still sealed; once a customer is forgotten, a
    # fold of the same archive has its values null and nobody else's.
    from deltalake import DeltaTable, write_deltalake

    import read_models
    from read_models.catalog import ARCHIVE_TABLE
    from spark_apps.arrow_rows import in_schema
    from spark_apps.event_rows import Records, event_row_schema, parse_records
    from spark_apps.rebuild_fold import FoldTargets, fold_archive

    settings = Settings.load({}).replace(home=tmp_path / "home")
    keys = SubjectKeys(keys_dir(settings.home))
    sealer = Sealer(keys)
    events, _, _ = run([open_account(customer_name=NAME, customer_email=EMAIL), located(), pay()], sealer)
    other, _, _ = run([open_account("acc-2", customer="cust-2", command_id="o2"),
                       located("acc-2", "NZ-WLG", "l2"), pay("acc-2", "IS-RKV", "p2", "p-2")], sealer)
    raw = events + other[:1] + other[2:]  # acc-2's version 2 never archived: its payment waits after a gap
    table, bad = parse_records(Records(rows=[(0, i, None, v) for i, v in enumerate(raw)]), "events")
    assert bad == []
    write_deltalake(str(settings.table_path(ARCHIVE_TABLE)), in_schema(table, event_row_schema()))
    models = read_models.select(["account_summary", "payments"])

    def fold(name):
        where = tmp_path / name
        targets = {m.name: FoldTargets(table=str(where / m.name), ledger=str(where / "ledger"),
                                       held=str(where / "held"), pending=str(where / f"pending-{m.name}"))
                   for m in models}
        fold_archive(None, settings, models, targets, log=lambda *_: None, engine="duckdb")
        rows = {m.name: DeltaTable(targets[m.name].table).to_pyarrow_table().to_pylist() for m in models}
        held = b"".join(p.read_bytes() for p in (where / "held").rglob("*.parquet"))
        return rows, held

    rows, held = fold("first")
    [summary] = [r for r in rows["account_summary"] if r["account_id"] == "acc-1"]
    assert (summary["customer_name"], summary["customer_email"], summary["last_device_location"]) == \
        (NAME, EMAIL, "IS-RKV")
    assert [r["location"] for r in rows["payments"]] == ["NZ-WLG"]
    assert held and b"IS-RKV" not in held and b"elk1:" in held  # acc-2's payment, held back sealed
    keys.forget("cust-1")
    rows, _ = fold("after")
    by_account = {r["account_id"]: r for r in rows["account_summary"]}
    assert (by_account["acc-1"]["customer_name"], by_account["acc-1"]["last_device_location"]) == (None, None)
    assert by_account["acc-2"]["customer_id"] == "cust-2" and by_account["acc-2"]["version"] == 1
    assert [r["location"] for r in rows["payments"]] == [None]
