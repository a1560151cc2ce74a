"""Personal data sealed on the real path (issue 45, docs/forgetting.md): commands through the real command handler
with personal_data_seal on, the events topic holding tokens only, the Python engine's read models in clear, and
after a subject's key is deleted, a replay of the log showing that subject's values as null and nobody else's."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import read_models
from event_store import kafka_log
from event_store.account.fraud_consumer import FraudConsumer
from event_store.account.fraud_state import SNAPSHOT_FOLDER
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from event_store.personal_data import KeyRecord, keys_dir
from event_store.sealing import Unsealer, subject_keys
from expectations.reconciliation import reconcile
from python_engine.run import PythonProjection
from read_models.catalog import ARCHIVE_TABLE, Catalog
from read_models.sequence import sequence

pytestmark = pytest.mark.slow

T = "2026-03-01T10:00:00.000Z"
# Distinctive plain values, looked for in raw bytes. Ada (cust-ada) holds two accounts, Grace (cust-grace) one.
ADA = {"customer_name": "Ada Lovelace-Byron", "customer_email": "ada.lovelace@analytical.example"}
GRACE = {"customer_name": "Grace Brewster Hopper", "customer_email": "grace.hopper@cobol.example"}
ADA_PLACES, GRACE_PLACES = ("IS-RKV", "FO-TOR"), ("NZ-WLG", "CL-PUQ")
PLAIN = [*ADA.values(), *GRACE.values(), *ADA_PLACES, *GRACE_PLACES]


def cmd(kind, account, payload, command_id):
    return CommandEnvelope.create(kind, account, payload, command_id=command_id, issued_at=T)


def commands_of(account, customer, person, places, n):
    out = [cmd("OpenAccount", account, {"customer_id": customer, "credit_limit_minor": 1_000_000, "currency": "EUR",
                                        **person}, f"{account}-open"),
           cmd("ReportDeviceLocation", account, {"location": places[0], "occurred_at": T}, f"{account}-device")]
    for i in range(n):
        out.append(cmd("AuthorizePayment", account, {
            "payment_id": f"{account}-p{i}", "amount_minor": 100 + i, "currency": "EUR", "merchant_id": "m-1",
            "location": places[i % 2], "merchant_country": "DE", "occurred_at": T}, f"{account}-pay-{i}"))
    return out


def send(settings, commands):
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.commands_topic,
                              [(c.aggregate_id, c.to_json()) for c in commands])
    finally:
        producer.close()


def handle_all(settings, lines=None):
    with CommandHandler(settings, log=(lines.append if lines is not None else lambda *_: None)) as handler:
        return handler.run(until_caught_up=True, max_seconds=120)


def results(settings):
    return {r.command_id: r for r in (CommandResult.from_json(m.value)
                                      for m in kafka_log.read_all(settings, settings.results_topic))}


def project(settings, names=("account_summary", "payments")):
    lines = []
    engine = PythonProjection(settings, read_models.select(list(names)), log=lines.append, archive=True)
    engine.run_until_caught_up()
    assert engine.handed_over == 0, lines
    return {name: table(settings, name) for name in names}


def table(settings, name):
    from deltalake import DeltaTable

    model = read_models.get(name)
    rows = DeltaTable(str(Catalog(settings).current(name).table)).to_pyarrow_table().to_pylist()
    return {tuple(r[k] for k in model.key): r for r in rows}


def files_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def kafka_files_holding(broker, settings, plain: list[str], wait_s: float = 120.0) -> list[str]:
    """The files under the broker's data dir that still hold one of ``plain`` once ``wait_s`` passed without
    them all going: this test's topics and Kafka's own (the other tests' topics hold none of these values)."""
    data = Path(broker.kafka_dir) / "data"
    deadline = time.monotonic() + wait_s
    while True:
        holding = []
        for path in data.iterdir():
            if path.is_dir() and (path.name.startswith(settings.topic_prefix) or path.name.startswith("__")):
                for f in path.iterdir():
                    try:
                        raw = f.read_bytes()
                    except (FileNotFoundError, IsADirectoryError):  # deleted while read
                        continue
                    holding += [f"{path.name}/{f.name}: {p}" for p in plain if p.encode() in raw]
        if not holding or time.monotonic() >= deadline:
            return holding
        time.sleep(1.0)


def test_sealed_on_the_log_clear_in_the_read_models_and_null_once_forgotten(settings, tmp_path, local_broker):
    # Snapshots after a few events, so that the handler's snapshots topic is written too.
    settings = settings.replace(personal_data_seal="on", snapshot_every_events=4)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    commands = (commands_of("acc-ada-1", "cust-ada", ADA, ADA_PLACES, 4)
                + commands_of("acc-ada-2", "cust-ada", {}, ADA_PLACES[::-1], 2)
                + commands_of("acc-grace", "cust-grace", GRACE, GRACE_PLACES, 3))
    send(settings, commands)
    lines = []
    stats = handle_all(settings, lines)
    assert [line for line in lines if "personal data is sealed" in line] == [
        f"handler 0: personal data is sealed under its subjects' keys in {keys_dir(settings.home)} "
        f"(personal_data_seal=on; docs/forgetting.md)"]
    answered = results(settings)
    assert stats.commands == len(commands)
    assert {c.command_id: answered[c.command_id].status for c in commands} == \
        {c.command_id: "accepted" for c in commands}

    # 1. The events topic's raw bytes hold none of the plain values; the subject ids stay in clear.
    records = list(kafka_log.read_all(settings, settings.events_topic))
    raw = b"\n".join(r.value for r in records)
    assert len(records) == len(commands)
    assert [p for p in PLAIN if p.encode() in raw] == []
    assert b"cust-ada" in raw and b"elk1:" in raw
    events = [EventEnvelope.from_json(r.value) for r in records]
    # What the handler keeps holds tokens, never the values: its state store on disk and its snapshots.
    store = files_bytes(Path(settings.home) / "handler-state")
    snapshots = b"\n".join(r.value or b"" for r in kafka_log.read_all(settings, settings.snapshots_topic))
    assert store and snapshots and b"elk1:" in store + snapshots
    assert [p for p in PLAIN if p.encode() in store + snapshots] == []
    # The keys it made are on the keys topic (published before the transactions that used them committed).
    keys_on_topic = [KeyRecord.decode(r.key, r.value) for r in kafka_log.read_all(settings, settings.keys_topic)]
    assert sorted(r.subject for r in keys_on_topic) == ["cust-ada", "cust-grace"]
    assert not any(r.forgotten for r in keys_on_topic)
    from lakehouse.lineage import events_file, read_events  # ... and its lineage names the keys topic as written

    starts = [e for e in read_events(events_file(settings))
              if e["eventType"] == "START" and e["job"]["name"].startswith("handler.")]
    assert starts and all(settings.keys_topic in [d["name"] for d in e["outputs"]] for e in starts)

    # 2. The Python engine's read models show the plain values; its archive keeps the tokens.
    live = project(settings)
    summary, payments = live["account_summary"], live["payments"]
    assert {k[0]: r["last_device_location"] for k, r in summary.items()} == {
        "acc-ada-1": "IS-RKV", "acc-ada-2": "FO-TOR", "acc-grace": "NZ-WLG"}
    assert {k[0]: (r["customer_name"], r["customer_email"]) for k, r in summary.items()} == {
        "acc-ada-1": tuple(ADA.values()), "acc-ada-2": (None, None), "acc-grace": tuple(GRACE.values())}
    assert payments[("acc-grace", "acc-grace-p1")]["location"] == "CL-PUQ"
    assert payments[("acc-ada-1", "acc-ada-1-p0")]["location"] == "IS-RKV"
    archive = files_bytes(Path(settings.table_path(ARCHIVE_TABLE)))
    assert archive and [p for p in PLAIN if p.encode() in archive] == []
    # Only the read models hold plain values: the engine's own tables of events (the archive, the sequence
    # ledger, held and late events, dead letters) and its checkpoints hold tokens or nothing personal.
    models = {Path(Catalog(settings).current(name).table) for name in live}
    kept = b"".join(files_bytes(p) for p in Path(settings.warehouse).iterdir() if p.is_dir() and p not in models)
    kept += files_bytes(Path(settings.checkpoints))
    assert [p for p in PLAIN if p.encode() in kept] == []
    # ... equal to the oracle (the models' plain-Python folds of the log, unsealed through the same module).
    unsealer = Unsealer(settings)
    admitted = list(unsealer.events(sequence(events).admitted))
    for name, rows in live.items():
        expected = read_models.get(name).python_fold(admitted)
        personal = ("location", "last_device_location", "customer_name", "customer_email")
        assert {k: [r.get(c) for c in personal] for k, r in rows.items()} == \
            {k: [r.get(c) for c in personal] for k, r in expected.items()}, name
    for name in live:  # the reconciliation check (read model vs the fold of the archive) unseals alike
        result = reconcile(settings, name)
        assert result.success, result.lines()
    # The fraud detector (the Kafka consumer) compares locations unsealed: only the payments away from the
    # device's location are flagged by rule 3 (with tokens, whose nonces differ, every payment would be).
    FraudConsumer(settings, log=lambda *_: None).run(until_caught_up=True)
    flags = [CommandEnvelope.from_json(m.value) for m in kafka_log.read_all(settings, settings.commands_topic)
             if b'"FlagFraud"' in m.value]
    assert {(c.aggregate_id, c.payload["payment_id"]) for c in flags if c.payload["rule"] == "location_mismatch"} \
        == {("acc-ada-1", "acc-ada-1-p1"), ("acc-ada-1", "acc-ada-1-p3"), ("acc-ada-2", "acc-ada-2-p1"),
            ("acc-grace", "acc-grace-p1")}
    handle_all(settings)  # their FraudSuspected events carry the evidence (it quotes locations) sealed
    assert results(settings)[flags[0].command_id].status == "accepted"
    # Its state snapshots keep the device locations sealed; a restart from them unseals them again: a payment where
    # Grace's phone is is no mismatch (with a token left in the state it would be).
    snapshots = files_bytes(Path(settings.checkpoints) / SNAPSHOT_FOLDER)
    assert b"elk1:" in snapshots and [p for p in PLAIN if p.encode() in snapshots] == []
    send(settings, [cmd("AuthorizePayment", "acc-grace", {
        "payment_id": "acc-grace-p9", "amount_minor": 1, "currency": "EUR", "merchant_id": "m-1",
        "location": GRACE_PLACES[0], "occurred_at": T}, "acc-grace-pay-9")])
    handle_all(settings)
    FraudConsumer(settings, log=lambda *_: None).run(until_caught_up=True)
    flags = [CommandEnvelope.from_json(m.value) for m in kafka_log.read_all(settings, settings.commands_topic)
             if b'"FlagFraud"' in m.value and b"acc-grace-p9" in m.value]
    assert flags and [c.payload["rule"] for c in flags if c.payload["rule"] == "location_mismatch"] == []
    assert {e.payload.get("customer_name") for e in admitted if e.event_type == "AccountOpened"} == \
        {ADA["customer_name"], GRACE["customer_name"], None}

    # 3. Ada is forgotten: her key goes, its tombstone on the keys topic first (`eventlake forget`, in 5, does this
    # and more).
    assert subject_keys(settings).forget("cust-ada")
    late = [cmd("ReportDeviceLocation", "acc-ada-1", {"location": "IS-AKU", "occurred_at": T}, "ada-late"),
            cmd("OpenAccount", "acc-ada-3", {"customer_id": "cust-ada", "credit_limit_minor": 1, "currency": "EUR",
                                             **ADA}, "ada-new-account"),
            cmd("ReportDeviceLocation", "acc-grace", {"location": "CL-SCL", "occurred_at": T}, "grace-late")]
    send(settings, late)
    handle_all(settings)  # a new handler instance: the states come back (tokens) from its store or the log
    answered = results(settings)
    assert [answered[c].error_type for c in ("ada-late", "ada-new-account")] == ["SubjectForgotten"] * 2
    assert "forgotten" in answered["ada-late"].reason
    assert answered["grace-late"].status == "accepted"
    raw = b"\n".join(r.value for r in kafka_log.read_all(settings, settings.events_topic))
    assert [p for p in [*PLAIN, "IS-AKU", "CL-SCL"] if p.encode() in raw] == []

    # 4. The log replayed into new tables from another home (another machine: no key files, only the broker; the
    # keys come from the keys topic): Ada's values are null, Grace's and every column that is not personal are as
    # before.
    replay = settings.replace(home=tmp_path / "elsewhere", warehouse_uri=str(tmp_path / "replay" / "warehouse"),
                              checkpoints_uri=str(tmp_path / "replay" / "checkpoints"))
    assert not keys_dir(replay.home).exists()
    rebuilt = project(replay)
    summary_after, payments_after = rebuilt["account_summary"], rebuilt["payments"]
    assert {k[0]: r["last_device_location"] for k, r in summary_after.items()} == {
        "acc-ada-1": None, "acc-ada-2": None, "acc-grace": "CL-SCL"}
    assert {k: r["location"] for k, r in payments_after.items() if k[0].startswith("acc-ada")} == \
        {k: None for k in payments if k[0].startswith("acc-ada")}
    assert {k: r for k, r in payments_after.items() if k[0] == "acc-grace" and k in payments} == \
        {k: r for k, r in payments.items() if k[0] == "acc-grace"}
    assert payments_after[("acc-grace", "acc-grace-p9")]["location"] == GRACE_PLACES[0]  # paid after the live run
    clear = ("payment_id", "account_id", "merchant_id", "amount_minor", "currency", "status", "event_id")
    assert {k: tuple(r[c] for c in clear) for k, r in payments_after.items() if k in payments} == \
        {k: tuple(r[c] for c in clear) for k, r in payments.items()}
    assert {k[0]: (r["customer_name"], r["customer_email"]) for k, r in summary_after.items()} == {
        "acc-ada-1": (None, None), "acc-ada-2": (None, None), "acc-grace": tuple(GRACE.values())}
    assert all(reconcile(replay, name).success for name in rebuilt)
    # The live tables still hold Ada's values: nulling them in every generation is the forget command's (a later
    # slice); until then the reconciliation says where they differ from the log.
    stale = reconcile(settings, "account_summary")
    assert stale.compared and stale.differences == 2  # acc-ada-1 and acc-ada-2, nobody else's
    assert {k for k, *_ in stale.different} <= {("acc-ada-1",), ("acc-ada-2",)}
    assert summary_after[("acc-ada-1",)]["customer_id"] == "cust-ada"  # the pseudonym stays
    assert summary_after[("acc-ada-1",)]["authorized_total_minor"] == summary[("acc-ada-1",)]["authorized_total_minor"]

    # 5. `eventlake forget` (read_models.forgetting; the key is gone already): each of Ada's accounts gets a
    # ForgetSubject command, which the handler (run once they are sent) answers with SubjectForgotten though her key
    # is gone; her values are nulled in the live read models and purged from their history. No byte of them is left
    # in the warehouse or the checkpoints (data files, Delta logs, the engine's state); Grace's stay; the
    # reconciliation with the log holds again.
    import threading

    from projection_core.forget_subject import forget_subject

    assert ADA["customer_name"].encode() in files_bytes(Path(settings.warehouse))  # the scan sees them before
    if local_broker is not None:  # ... and in the commands topic's segments
        assert any(ADA["customer_email"] in hit for hit in kafka_files_holding(local_broker, settings, [
            ADA["customer_email"]], wait_s=0))
    sent, reports = threading.Event(), []

    def forget_it():
        def log(line):
            if "forget command(s) sent" in line:
                sent.set()
        reports.append(forget_subject(settings, "cust-ada", "GDPR art. 17 request (test)", grace_s=0, log=log,
                                      answer_s=120))
        sent.set()

    forgetting = threading.Thread(target=forget_it)
    forgetting.start()
    assert sent.wait(120)
    handle_all(settings)
    forgetting.join(180)
    [report] = reports
    assert report.complete and report.key_before == "forgotten", report.lines()
    assert [(r.aggregate, r.outcome) for r in report.log_records] == [("account acc-ada-1", "recorded"),
                                                                     ("account acc-ada-2", "recorded")]
    logged = (EventEnvelope.from_json(m.value) for m in kafka_log.read_all(settings, settings.events_topic))
    forgotten = [e for e in logged if e.event_type == "SubjectForgotten"]
    assert {(e.aggregate_id, tuple(e.payload.items())) for e in forgotten} == {
        ("acc-ada-1", (("customer_id", "cust-ada"),)), ("acc-ada-2", (("customer_id", "cust-ada"),))}
    after = {name: table(settings, name) for name in live}
    personal = ("customer_name", "customer_email", "last_device_location")
    assert {k[0]: tuple(r[c] for c in personal) for k, r in after["account_summary"].items()} == {
        "acc-ada-1": (None, None, None), "acc-ada-2": (None, None, None),
        "acc-grace": (*GRACE.values(), summary[("acc-grace",)]["last_device_location"])}
    assert {k: r["location"] for k, r in after["payments"].items() if k[0].startswith("acc-ada")} == \
        {k: None for k in payments if k[0].startswith("acc-ada")}
    kept = files_bytes(Path(settings.warehouse)) + files_bytes(Path(settings.checkpoints))
    assert [p for p in [*ADA.values(), *ADA_PLACES] if p.encode() in kept] == []
    assert GRACE["customer_name"].encode() in kept and GRACE_PLACES[1].encode() in kept
    assert all(reconcile(settings, name).success for name in live)
    # The commands topic held Ada's values in clear (commands are not sealed): every command the handler had handled
    # was deleted, and the broker removes their segments' files at its next retention check (10 s on eventlake's
    # broker): then no log segment under its data dir holds a byte of her values, Kafka's own topics included.
    assert report.commands.offsets_deleted >= len(commands) + len(late) and not report.commands.unhandled
    if local_broker is not None:
        assert kafka_files_holding(local_broker, settings, [*ADA.values(), *ADA_PLACES, "IS-AKU"]) == []
    again = forget_subject(settings, "cust-ada", "GDPR art. 17 request (test)", grace_s=0, log=lambda *_: None,
                           answer_s=0.5)  # no handler runs: its commands wait, sent again (same ids)
    assert all(e.rows_holding == e.files_holding == 0 for e in again.tables)
    # ... which it says: complete but for the forget commands it sent again, not yet handled (their records stay)
    assert not again.complete and again.commands.unhandled
    assert "the handler had not handled every command on the commands topic" in again.lines()[-1]
    # The live projection folds the SubjectForgotten events: the rows' versions move on, the values stay null.
    live_after = project(settings)
    assert {k[0]: (r["version"], r["customer_name"], r["last_device_location"])
            for k, r in live_after["account_summary"].items() if k[0].startswith("acc-ada")} == {
        e.aggregate_id: (e.aggregate_version, None, None) for e in forgotten}
    assert all(reconcile(settings, name).success for name in live)

