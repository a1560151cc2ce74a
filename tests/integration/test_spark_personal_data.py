"""Issue 45 on Spark: personal data unsealed with its own functions (spark_apps.unsealing), the same values as the
Python readers' ``Unsealer``, null once forgotten, an error for a tampered or moved token; and a read model table made
before its personal columns gains them."""
from __future__ import annotations

import pytest

from event_store.personal_data import SubjectKeys, keys_dir
from event_store.sealing import Unsealer
from spark_apps.unsealing import unsealed

pytestmark = pytest.mark.slow


def _rows(keys):
    return [
        {"event_id": "e1", "location": keys.seal("cust-1", "location", "IS-RKV"),
         "customer_name": keys.seal("cust-1", "customer_name", "Ada Lovelace"), "evidence": None},
        {"event_id": "e2", "location": keys.seal("cust-2", "location", "NZ-WLG"), "customer_name": None,
         "evidence": keys.seal("cust-2", "evidence", "payment at NZ-WLG, device at \"CL-PUQ\" \u00e9")},
        {"event_id": "e3", "location": "US-NYC", "customer_name": "Plain Name", "evidence": None},
        {"event_id": "e4", "location": None, "customer_name": None, "evidence": None},
    ]


def _frame(spark, rows):
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField(c, StringType()) for c in ("event_id", "location", "customer_name", "evidence")])
    return spark.createDataFrame([tuple(r[c] for c in schema.names) for r in rows], schema)


def _collected(df):
    return sorted(tuple(r) for r in df.select("event_id", "location", "customer_name", "evidence").collect())


def test_spark_unseals_as_the_python_readers_do_and_a_forgotten_subject_reads_as_null(spark, tmp_path):
    import pyarrow as pa

    keys = SubjectKeys(keys_dir(tmp_path))
    rows = _rows(keys)
    unsealer = Unsealer(keys=keys)
    expected = sorted(tuple(r.values()) for r in unsealer.rows(pa.Table.from_pylist(rows)).to_pylist())
    assert expected[0] == ("e1", "IS-RKV", "Ada Lovelace", None)
    assert _collected(unsealed(_frame(spark, rows), unsealer)) == expected

    SubjectKeys(keys.directory).forget("cust-1")  # another process; the next frame's keys see it
    after = _collected(unsealed(_frame(spark, rows), unsealer))
    assert after[0] == ("e1", None, None, None)
    assert after[1:] == expected[1:]

    plain = [r for r in rows if r["event_id"] in ("e3", "e4")]
    frame = _frame(spark, plain)
    assert unsealed(frame, unsealer) is frame  # no token: no join, no key looked up


def test_a_home_that_never_sealed_costs_the_projection_no_job_and_still_refuses_a_token(spark, tmp_path):
    # Sealing off (the default): the key store is empty, so no job looks for subjects in each batch's events (one
    # more Spark job per fold of every batch, before); a token met anyway (another home's, forged) fails the fold.
    sealer = SubjectKeys(keys_dir(tmp_path / "elsewhere"))
    unsealer = Unsealer(keys=SubjectKeys(keys_dir(tmp_path / "here")))
    rows = [{"event_id": "e3", "location": "US-NYC", "customer_name": "Plain Name", "evidence": None},
            {"event_id": "e4", "location": None, "customer_name": None, "evidence": None}]
    tracker = spark.sparkContext.statusTracker()
    frame = _frame(spark, rows)
    spark.sparkContext.setJobGroup("unsealing-plain", "unsealed() of plain rows, empty key store")
    try:
        clear = unsealed(frame, unsealer)
        assert tracker.getJobIdsForGroup("unsealing-plain") == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert _collected(clear) == sorted(tuple(r.values()) for r in rows)

    rows[0]["location"] = sealer.seal("cust-9", "location", "IS-RKV")
    with pytest.raises(Exception, match="knows no subject"):
        _collected(unsealed(_frame(spark, rows), unsealer))


@pytest.mark.parametrize("damage", ["tampered", "moved"])
def test_spark_refuses_a_token_that_does_not_authenticate_or_sits_in_another_column(spark, tmp_path, damage):
    keys = SubjectKeys(keys_dir(tmp_path))
    rows = _rows(keys)[1:2]
    token = rows[0]["location"]
    if damage == "tampered":
        head, sealed = token.rsplit(":", 1)
        rows[0]["location"] = f"{head}:{sealed[:-3]}{'A' if sealed[-3] != 'A' else 'B'}{sealed[-2:]}"
    else:
        rows[0]["location"], rows[0]["customer_name"] = None, token
    with pytest.raises(Exception, match="does not authenticate or was sealed for another field"):
        _collected(unsealed(_frame(spark, rows), Unsealer(keys=keys)))


def test_a_read_model_table_made_before_its_new_columns_gains_them_on_spark(spark, tmp_path):
    # account_summary gained customer_name and customer_email (issue 45): a table an older release made gets them
    # (nullable, at the end) when the Spark projection ensures its tables, and keeps its rows.
    from pyspark.sql.types import StructType

    import read_models
    from spark_apps.merge import ensure_table

    schema = read_models.get("account_summary").schema()
    old = StructType([f for f in schema.fields if f.name not in ("customer_name", "customer_email")])
    path = tmp_path / "account_summary"
    ensure_table(spark, path, old)
    spark.createDataFrame([("acc-1",) + (None,) * (len(old.fields) - 1)], old).write.format("delta") \
        .mode("append").save(str(path))
    ensure_table(spark, path, schema, ("account_id",))
    table = spark.read.format("delta").load(str(path))
    assert table.columns == schema.names
    assert [tuple(r) for r in table.select("account_id", "customer_name", "customer_email").collect()] == \
        [("acc-1", None, None)]
    ensure_table(spark, path, schema, ("account_id",))  # nothing more to add


def test_the_spark_projection_unseals_the_log_the_handler_sealed_and_nulls_a_forgotten_subject(spark, settings,
                                                                                              tmp_path):
    # The same log as tests/integration/test_personal_data_sealing.py (real handler, sealing on), projected by the
    # Structured Streaming engine: read models in clear, its own tables of events sealed; after Ada is forgotten, a
    # replay into new tables has her values null and Grace's as before.
    from pathlib import Path

    import read_models
    from event_store import kafka_log
    from read_models.catalog import Catalog
    from spark_apps.projection import Projection
    from tests.integration.test_personal_data_sealing import (ADA, ADA_PLACES, GRACE, GRACE_PLACES, PLAIN,
                                                              commands_of, files_bytes, handle_all, send)

    settings = settings.replace(personal_data_seal="on")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    send(settings, commands_of("acc-ada-1", "cust-ada", ADA, ADA_PLACES, 3)
         + commands_of("acc-grace", "cust-grace", GRACE, GRACE_PLACES, 2))
    handle_all(settings)
    models = read_models.select(["account_summary", "payments"])

    def project(where):
        Projection(spark, where, models, log=lambda *_: None).run_until_caught_up()
        out = {}
        for model in models:
            rows = spark.read.format("delta").load(str(Catalog(where).current(model.name).table)).collect()
            out[model.name] = {tuple(r[k] for k in model.key): r.asDict() for r in rows}
        return out

    live = project(settings)
    summary = live["account_summary"]
    assert {k[0]: (r["customer_name"], r["customer_email"], r["last_device_location"]) for k, r in summary.items()} \
        == {"acc-ada-1": (*ADA.values(), "IS-RKV"), "acc-grace": (*GRACE.values(), "NZ-WLG")}
    assert live["payments"][("acc-grace", "acc-grace-p1")]["location"] == "CL-PUQ"
    tables = {Path(Catalog(settings).current(m.name).table) for m in models}
    kept = b"".join(files_bytes(p) for p in Path(settings.warehouse).iterdir() if p.is_dir() and p not in tables)
    assert kept and [p for p in PLAIN if p.encode() in kept] == []

    SubjectKeys(keys_dir(settings.home)).forget("cust-ada")
    replay = settings.replace(warehouse_uri=str(tmp_path / "replay" / "warehouse"),
                              checkpoints_uri=str(tmp_path / "replay" / "checkpoints"))
    after = project(replay)
    summary_after = after["account_summary"]
    assert {k[0]: (r["customer_name"], r["customer_email"], r["last_device_location"])
            for k, r in summary_after.items()} == {"acc-ada-1": (None, None, None),
                                                   "acc-grace": (*GRACE.values(), "NZ-WLG")}
    assert {k: r["location"] for k, r in after["payments"].items() if k[0] == "acc-ada-1"} == \
        {k: None for k in live["payments"] if k[0] == "acc-ada-1"}
    assert {k: r for k, r in after["payments"].items() if k[0] == "acc-grace"} == \
        {k: r for k, r in live["payments"].items() if k[0] == "acc-grace"}


def test_a_rebuild_after_forgetting_equals_the_live_read_models_and_holds_none_of_the_subjects_values(spark,
                                                                                                     settings):
    """Issue 45: after `forget` (key gone, SubjectForgotten on the log, the live tables nulled and purged), a rebuild
    (the archive's fold on Spark, then the catch-up from Kafka, its checks with the reconciliation, the switch)
    gives the same read models as the live path: Ada's values null, Grace's as they were; and the new generation's
    files hold no byte of Ada's values."""
    import threading
    from pathlib import Path

    from event_store import kafka_log
    from expectations.reconciliation import reconcile
    from projection_core.forget_subject import forget_subject
    from read_models.catalog import Catalog
    from spark_apps.rebuild import rebuild
    from tests.integration.test_personal_data_sealing import (ADA, ADA_PLACES, GRACE, GRACE_PLACES, commands_of,
                                                              files_bytes, handle_all, project, send, table)

    settings = settings.replace(personal_data_seal="on")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    send(settings, commands_of("acc-ada-1", "cust-ada", ADA, ADA_PLACES, 3)
         + commands_of("acc-grace", "cust-grace", GRACE, GRACE_PLACES, 2))
    handle_all(settings)
    names = ("account_summary", "payments")
    project(settings, names)
    sent, reports = threading.Event(), []

    def forget_it():
        reports.append(forget_subject(settings, "cust-ada", "request #19", grace_s=0, answer_s=120,
                                      log=lambda line: sent.set() if "forget command(s) sent" in line else None))
        sent.set()

    forgetting = threading.Thread(target=forget_it)
    forgetting.start()
    assert sent.wait(120)
    handle_all(settings)  # answers the forget commands: SubjectForgotten on the log
    forgetting.join(180)
    assert reports and reports[0].complete, reports and reports[0].lines()
    live = project(settings, names)  # the live projection folds SubjectForgotten
    personal = {"account_summary": ("customer_name", "customer_email", "last_device_location", "version"),
                "payments": ("location", "amount_minor", "status")}

    def seen(tables):
        return {name: {k: tuple(r[c] for c in personal[name]) for k, r in rows.items()}
                for name, rows in tables.items()}

    assert seen(live)["account_summary"][("acc-ada-1",)][:3] == (None, None, None)
    assert seen(live)["account_summary"][("acc-grace",)][:2] == tuple(GRACE.values())
    before = {name: Catalog(settings).current(name).number for name in names}
    for name in names:
        assert rebuild(spark, settings, name, by="test", reason="after forgetting cust-ada",
                       log=lambda *_: None).switched
    rebuilt = {name: table(settings, name) for name in names}
    assert {name: Catalog(settings).current(name).number for name in names} == \
        {name: number + 1 for name, number in before.items()}
    assert seen(rebuilt) == seen(live)
    assert all(reconcile(settings, name).success for name in names)
    generations = b"".join(files_bytes(Path(Catalog(settings).current(name).table)) for name in names)
    assert generations and [p for p in [*ADA.values(), *ADA_PLACES] if p.encode() in generations] == []
    assert GRACE["customer_name"].encode() in generations and GRACE_PLACES[1].encode() in generations
