"""The DAGs of issue 9 run with `airflow dags test` against the real broker, Spark and Delta: every DAG file
imports cleanly; `rebuild_read_model` rebuilds, checks and switches (or, on a dry run, leaves readers where they
are) and owns the rebuild lock across its tasks; `check_read_models` publishes Great Expectations Data Docs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from infra import airflow_assets as assets
from infra.airflow import environment
from lakehouse.settings import PROJECT_ROOT, Settings
from read_models.catalog import DIM_MERCHANT_TABLE, Catalog
from projection_core.rebuild_errors import RebuildRefused
from projection_core.rebuild_lock import RebuildLock, airflow_owner, lock_path
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded
from tests.integration.prometheus_server import PUSHGATEWAY, PushgatewayServer
from tests.integration.test_rebuild import project, publish
from tests.oracle import assert_matches_oracle

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
DAG_IDS = {"check_read_models", "rebuild_read_model", "reprocess_windows", "maintenance", "load_merchants",
           "triage_dead_letters", "forget_subject", "backfill_reference"}


_MIGRATED: list[Path] = []  # Airflow's metadata database, migrated once per run


def _migrated_airflow_db(settings: Settings) -> None:
    """Give ``settings``' home Airflow's metadata database as ``infra.airflow.ensure_db`` leaves it, copied from one
    migrated once per test run: `airflow db migrate` takes ~15 s, and each test has a home of its own."""
    import shutil
    import tempfile

    from infra.airflow import airflow_home, ensure_db

    target = airflow_home(settings)
    if (target / ".migrated").exists():
        return
    if not _MIGRATED:
        template = Settings(home=Path(tempfile.mkdtemp(prefix="eventlake-airflow-db-")))
        ensure_db(template, log=lambda *_: None)
        _MIGRATED.append(airflow_home(template))
    target.mkdir(parents=True, exist_ok=True)
    for name in ("airflow.db", ".migrated"):
        shutil.copy2(_MIGRATED[0] / name, target / name)


def eventlake_env(settings: Settings) -> dict:
    """What a worker's environment says for ``settings``: the same home, broker and topics (and Airflow's database
    migrated)."""
    _migrated_airflow_db(settings)
    env = dict(os.environ)
    # This checkout's code (and DAGs folder) first, whatever checkout the console script was installed from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env.update(EVENTLAKE_HOME=str(settings.home), EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix,
               EVENTLAKE_TOPIC_PARTITIONS=str(settings.topic_partitions), EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2",
               EVENTLAKE_SUBJECT_KEYS_TOPIC=settings.subject_keys_topic)
    if settings.kafka_bootstrap_servers:
        env["KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers
    if settings.pushgateway_url:
        env["EVENTLAKE_PUSHGATEWAY_URL"] = settings.pushgateway_url
    return env


def dags_test(settings: Settings, dag_id: str, conf: dict | None = None) -> subprocess.CompletedProcess:
    args = [EVENTLAKE, "airflow", "dags", "test", dag_id] + (["-c", json.dumps(conf)] if conf is not None else [])
    return subprocess.run(args, env=eventlake_env(settings), capture_output=True, text=True, timeout=1200)


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def test_every_dag_file_imports_cleanly(tmp_path):
    code = ("import json; from airflow.dag_processing.dagbag import DagBag; from infra.airflow import DAGS_FOLDER\n"
            "from airflow.serialization.serialized_objects import DagSerialization\n"
            "bag = DagBag(dag_folder=str(DAGS_FOLDER))\n"
            "def scheduled(d):\n"
            "    c = getattr(d.timetable, 'asset_condition', None)\n"
            "    found = [] if c is None else [a for _, a in c.iter_assets()] if hasattr(c, 'iter_assets') else [c]\n"
            "    return [(a.name, [w.name for w in a.watchers]) for a in found]\n"
            "for d in bag.dags.values(): DagSerialization.to_dict(d)  # what the DAG processor stores: triggers too\n"
            "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()},"
            " 'dags': {d: sorted(t.task_id for t in bag.dags[d].tasks) for d in bag.dags},"
            " 'params': {d: sorted(bag.dags[d].params) for d in bag.dags},"
            " 'outlets': {d: {t.task_id: sorted(o.name for o in t.outlets) for t in bag.dags[d].tasks if t.outlets}"
            "             for d in bag.dags},"
            " 'scheduled': {d: scheduled(bag.dags[d]) for d in bag.dags}}))")
    proc = subprocess.run([sys.executable, "-c", code], env=environment(Settings(home=tmp_path)), cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, output(proc)[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["errors"] == {}
    assert set(found["dags"]) == DAG_IDS
    assert found["dags"]["rebuild_read_model"] == ["choose_read_models", "rebuild_model.build",
                                                   "rebuild_model.check", "rebuild_model.switch"]
    assert found["params"]["rebuild_read_model"] == ["dry_run", "read_models"]
    assert found["dags"]["maintenance"] == ["maintain_read_model"]
    assert found["params"]["maintenance"] == ["retention_hours"]
    # Issue 46 part 3: each DAG's outlets cover what it writes (infra/airflow_assets.py); the checks run on the
    # read models' Assets; the dead letters' watcher starts the triage.
    written = {d: sorted({name for names in found["outlets"][d].values() for name in names}) for d in DAG_IDS}
    assert written == {d: sorted([assets.ALIASES[d]] if d in assets.ALIASES else assets.WRITES[d]) for d in DAG_IDS}
    assert found["outlets"]["rebuild_read_model"] == {"rebuild_model.switch": [assets.REBUILT]}
    assert found["scheduled"]["check_read_models"] == [[name, []] for name in read_models.REGISTRY]
    assert found["scheduled"]["triage_dead_letters"] == [[assets.DEAD_LETTERS, ["dead_letters_topic"]]]
    assert found["scheduled"]["load_merchants"] == [[assets.LANDED_MERCHANTS, ["merchants_ready_flag"]]]
    assert found["params"]["triage_dead_letters"] == ["account", "by", "reason", "record"]
    assert found["params"]["forget_subject"] == ["dry_run", "grace_minutes", "log_event", "reason", "subject",
                                                 "wait_seconds"]
    assert found["outlets"]["forget_subject"] == {"forget": [assets.FORGOTTEN]}
    # Issue 46 part 2: the backfill runs when dim_merchant is updated (a load), and on its schedule.
    assert found["scheduled"]["backfill_reference"] == [[DIM_MERCHANT_TABLE, []]]
    assert found["outlets"]["backfill_reference"] == {"backfill_read_models": [assets.BACKFILLED]}


def test_a_run_owns_the_lock_across_its_tasks_and_refuses_everyone_else(tmp_path):
    settings = Settings(home=tmp_path)
    run = airflow_owner("rebuild_read_model", "manual__1")
    build = RebuildLock(settings, "payments", log=lambda *_: None, owner=run).acquire()
    build.hand_over()  # the build task ended; its process is gone, the run goes on
    holder = json.loads(lock_path(settings, "payments").read_text())
    assert holder["owner"] == run and holder["pid"] is None and holder["lease_until"]
    with pytest.raises(RebuildRefused, match=r"already running \(Airflow run rebuild_read_model/manual__1"):
        RebuildLock(settings, "payments", log=lambda *_: None).acquire()  # a shell's `eventlake rebuild`
    with pytest.raises(RebuildRefused, match="already running"):
        RebuildLock(settings, "payments", log=lambda *_: None,
                    owner=airflow_owner("rebuild_read_model", "manual__2")).acquire()  # another run
    check = RebuildLock(settings, "payments", log=lambda *_: None, owner=run, resume=True).acquire()  # same run
    check.release()  # e.g. the check failed: the run is over for this model
    with pytest.raises(RebuildRefused, match="no longer holds the rebuild lock"):
        RebuildLock(settings, "payments", log=lambda *_: None, owner=run, resume=True).acquire()
    # A run killed outright: its lease has run out and no process of it is alive: the next rebuild takes over.
    lock_path(settings, "payments").write_text(json.dumps({**holder, "lease_until": "2026-01-01T00:00:00+00:00"}))
    lines = []
    with RebuildLock(settings, "payments", log=lines.append):
        pass
    assert any("taking over" in line for line in lines) and not lock_path(settings, "payments").exists()


@pytest.mark.skipif(not PUSHGATEWAY, reason="prometheus-pushgateway is not installed (sudo apt-get install "
                                             "prometheus-pushgateway)")
def test_a_builds_progress_is_pushed_after_each_step_and_a_failed_build_says_it_stopped(tmp_path):
    """What the rebuild DAG's build task pushes while it runs (spark_apps.rebuild.ProgressPush): each step done of
    all, running; when the build fails, no longer running, where it stopped."""
    from spark_apps.rebuild import ProgressPush

    pushgateway = PushgatewayServer(tmp_path / "pushgateway")
    try:
        settings = Settings(home=tmp_path, pushgateway_url=pushgateway.url)
        progress = ProgressPush(settings, "payments", "rebuild_read_model", log=lambda *_: None)
        def figures():
            return {n: list(pushgateway.series(f"eventlake_rebuild_{n}").values()) for n in ("running", "steps_done",
                                                                                              "steps")}
        progress(1, 5, 0.5)
        assert figures() == {"running": [1.0], "steps_done": [1.0], "steps": [5.0]}
        progress(3, 5, 2.0)
        assert figures() == {"running": [1.0], "steps_done": [3.0], "steps": [5.0]}
        progress.ended()
        assert figures() == {"running": [0.0], "steps_done": [3.0], "steps": [5.0]} and progress.pushed == 2
    finally:
        pushgateway.close()


@pytest.mark.heavy
def test_the_rebuild_dag_switches_readers_to_a_checked_generation_and_a_dry_run_leaves_them(spark, settings,
                                                                                             tmp_path):
    events = events_for(GeneratorConfig(accounts=12, commands=200, seed=29, run_id="dag", late_rate=0.05),
                        flag_every=9)
    publish(settings, events[:-30])
    project(spark, settings)
    publish(settings, events[-30:])  # in Kafka, not yet archived: the build catches them up

    rebuilt = ["account_summary", "merchant_minute_volume"]
    pushgateway = PushgatewayServer(tmp_path / "pushgateway") if PUSHGATEWAY else None  # where installed
    try:
        proc = dags_test(settings.replace(pushgateway_url=pushgateway.url) if pushgateway else settings,
                         "rebuild_read_model", {"read_models": rebuilt, "dry_run": False})
        pushed = pushgateway.series("eventlake_rebuild_generation") if pushgateway else None
        progress = {figure: pushgateway.series(f"eventlake_rebuild_{figure}")
                    for figure in ("running", "steps_done", "steps")} if pushgateway else None
    finally:
        if pushgateway:
            pushgateway.close()
    text = output(proc)
    assert proc.returncode == 0, text[-6000:]
    if pushgateway:  # each build task pushed its progress after each step, then the generation it built
        assert {dict(k)["read_model"]: v for k, v in pushed.items()} == {name: 2.0 for name in rebuilt}, pushed
        assert {figure: sorted(v.values()) for figure, v in progress.items()} == {
            "running": [0.0, 0.0], "steps_done": [5.0, 5.0], "steps": [5.0, 5.0]}, progress
        assert text.count("its progress pushed after 5 of 5 steps") == len(rebuilt), text[-6000:]
    assert "ETA" in text and "steps over" in text and "catch-up [2/2]" in text  # progress in the task log
    catalog = Catalog(settings)
    assert {n: catalog.current(n).number for n in read_models.REGISTRY} == {
        n: 2 if n in rebuilt else 1 for n in read_models.REGISTRY}
    assert_matches_oracle(spark, settings, events, models=[read_models.get(n) for n in rebuilt])
    assert not any(lock_path(settings, n).exists() for n in rebuilt)

    proc = dags_test(settings, "rebuild_read_model", {"read_models": ["account_summary"], "dry_run": True})
    assert proc.returncode == 0, output(proc)[-6000:]
    state = Catalog(settings).state("account_summary")
    assert state.current == 2 and 3 in state.dropped and "dry run" in output(proc)
    assert not lock_path(settings, "account_summary").exists()

    # While another rebuild of the model runs (here: this process holds its lock), the DAG's build is refused.
    with RebuildLock(settings, "payments", log=lambda *_: None):
        proc = dags_test(settings, "rebuild_read_model", {"read_models": ["payments"], "dry_run": False})
    assert proc.returncode != 0 and f"already running (pid {os.getpid()}" in output(proc), output(proc)[-4000:]
    assert Catalog(settings).state("payments").current == 1


def test_check_read_models_publishes_data_docs_naming_each_suite(tmp_path):
    settings = Settings(home=tmp_path)
    write_folded(settings, events_for(GeneratorConfig(accounts=10, commands=200, seed=4, run_id="docs")))
    proc = dags_test(settings, "check_read_models")
    assert proc.returncode == 0, output(proc)[-4000:]
    _assert_each_check_run_is_a_child_of_its_airflow_task_run(settings)
    index = tmp_path / "data_docs" / "index.html"
    assert f"Data Docs of every suite: file://{index}" in output(proc)
    page = index.read_text()
    for name in read_models.REGISTRY:
        assert f"validations/{name}/" in page, name
        assert list((tmp_path / "data_docs" / "validations" / name).glob(f"*/*/{name}.html")), name
    # Nothing loaded from the internet (issue 46, part 6): each page's styles, scripts and logos are the site's
    # own (`eventlake setup` fetched them), and each is there.
    import re

    loads = re.compile(r"""(?:src|href)=["']([^"'#]+)["']|url\(['"]?([^'")]+)['"]?\)""")
    pages = list((tmp_path / "data_docs").rglob("*.html"))
    assert len(pages) > len(read_models.REGISTRY)
    for html in pages:
        for found in (a or b for a, b in loads.findall(html.read_text())):
            if found.startswith("http"):
                assert found.startswith("https://greatexpectations.io"), (html, found)  # links, nothing loaded
            elif not found.startswith(("mailto:", "data:", "javascript:")):
                assert (html.parent / found.split("?")[0]).resolve().exists(), (html, found)


def _assert_each_check_run_is_a_child_of_its_airflow_task_run(settings) -> None:
    # One OpenLineage graph (docs/lineage.md): Airflow's provider wrote a run per mapped check task beside ours (the
    # same file, the same namespace), and each table's check run names its own task's run as its parent.
    from lakehouse.lineage import events_file, read_events

    events = [e for e in read_events(events_file(settings)) if e["eventType"] == "START"]
    tasks = {e["run"]["runId"] for e in events if e["job"]["name"] == "check_read_models.check_read_model"}
    checks = {e["job"]["name"]: e for e in events if e["job"]["name"].startswith("check.")}
    assert set(checks) == {f"check.{name}" for name in read_models.REGISTRY}, sorted(checks)
    assert len(tasks) == len(checks)
    parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in checks.values()}
    assert parents == tasks
    assert {e["job"]["namespace"] for e in events} == {settings.lineage_namespace}


# The dead-letters watcher's trigger as Airflow's triggerer runs it: the Kafka provider's AwaitMessageTrigger with
# the connection eventlake_kafka (from the environment) and our apply_function; its first event's payload.
FIRST_TRIGGER_EVENT = """
import asyncio, json
from infra import airflow_assets as assets
from lakehouse.settings import Settings

trigger = assets.dead_letters(Settings.load()).watchers[0].trigger


async def first():
    events = trigger.run()
    try:
        return (await asyncio.wait_for(events.__anext__(), 90)).payload
    finally:
        await events.aclose()
        await trigger.cleanup()

print(json.dumps(asyncio.run(first())))
"""


def test_a_dead_letter_fires_the_watcher_and_each_is_reported_once(settings):
    from event_store import kafka_log
    from expectations.dead_letters import triage

    kafka_log.ensure_topics(settings, log=lambda *_: None)

    def send(*records: tuple[str, str]) -> None:
        producer = kafka_log.make_producer(settings)
        try:
            kafka_log.produce_all(producer, settings.dead_letters_topic, [
                (key, kafka_log.dead_letter_value(reason, b"\xff", settings.commands_topic, 0, n))
                for n, (key, reason) in enumerate(records)])
        finally:
            producer.close()

    send(("acc-1", "command: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
         ("acc-2", "command: not valid JSON (Expecting value: line 1 column 5 (char 4))"),
         ("acc-1", "command: missing required field 'command_id'"))
    report = triage(settings, log=lambda *_: None)
    assert report.count == 3 and report.by_aggregate == {"acc-1": 2, "acc-2": 1}
    assert report.by_reason == {"command: not valid JSON (...)": 2, "command: missing required field 'command_id'": 1}
    page = settings.home / "data_docs" / "dead_letters" / "index.html"
    assert report.html == str(page) and "acc-2" in page.read_text()
    assert triage(settings, log=lambda *_: None).count == 0  # each reported once
    assert "acc-2" in page.read_text()  # nothing new: the page keeps the last report
    send(("acc-3", "command: expected a JSON object, got list"))
    assert triage(settings, log=lambda *_: None).by_aggregate == {"acc-3": 1}

    env = environment(settings, base=eventlake_env(settings))
    connection = assets.kafka_connection(settings)
    connection["extra"]["auto.offset.reset"] = "earliest"  # its group is new: from the first record, no race
    env[f"AIRFLOW_CONN_{assets.KAFKA_CONNECTION_ID.upper()}"] = json.dumps(connection)
    proc = subprocess.run([sys.executable, "-c", FIRST_TRIGGER_EVENT], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, output(proc)[-3000:]
    signal = json.loads(proc.stdout.strip().splitlines()[-1])  # the first record of one of the partitions
    assert signal["topic"] == settings.dead_letters_topic and signal["offset"] == 0, signal
    assert signal["aggregate"] in {"acc-1", "acc-2", "acc-3"} and signal["reason"] in {
        "command: not valid JSON (...)", "command: missing required field 'command_id'",
        "command: expected a JSON object, got list"}, signal



def test_forget_subject_forgets_a_person_from_the_form_and_announces_each_table_it_changed(tmp_path):
    """The form (subject, reason, no grace period): the key goes, Ada's values are nulled in every read model
    holding them (Grace's stay), the task's log lists each table, and each changed read model's Asset gets an event
    with its Delta version."""
    import sqlite3

    from event_store.personal_data import SubjectKeys, keys_dir
    from infra.airflow import airflow_home
    from tests.unit.test_forgetting import personal_home

    settings = personal_home(tmp_path)
    proc = dags_test(settings, "forget_subject", {"subject": "cust-ada", "reason": "request #14",
                                                  "grace_minutes": 0, "log_event": False})  # no broker here
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "subject 'cust-ada': key deleted" in text and "complete: no read model table" in text, text[-4000:]
    assert SubjectKeys(keys_dir(settings.home)).state("cust-ada") == "forgotten"
    catalog = Catalog(settings)
    summary = {r["account_id"]: r for r in catalog_rows(catalog, "account_summary")}
    assert summary["acc-ada-1"]["customer_name"] is None and summary["acc-grace"]["customer_name"] == "Grace Hopper"
    assert {r["payment_id"]: r["location"] for r in catalog_rows(catalog, "payments")} == {
        "p1": None, "p2": None, "p3": "US-SFO"}
    with sqlite3.connect(airflow_home(settings) / "airflow.db") as db:
        events = db.execute("SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                            "ORDER BY a.name").fetchall()
    announced = {name: json.loads(extra) for name, extra in events}
    assert set(announced) == {"account_summary", "payments"}, events
    assert announced["payments"]["rows_nulled"] == 2 and announced["payments"]["delta_version"] >= 1


def catalog_rows(catalog: Catalog, name: str) -> list[dict]:
    from lakehouse.tables import read_table

    return read_table(catalog.current(name).table).to_pylist()


def test_backfill_reference_sets_the_merchants_of_payments_projected_before_their_load(tmp_path):
    """Payments written with null merchant columns (projected before the load), then dim_merchant: a run of the
    DAG sets them as of each payment's time, says so in its log and announces payments' Asset with the rows set.
    (No windowed table here: no Spark in the worker; the minutes' reprocessing is tests/integration/test_backfill.py's.)"""
    import sqlite3

    import pyarrow as pa
    from deltalake import write_deltalake

    from eventlake.generator import GeneratorConfig
    from infra.airflow import airflow_home
    from read_models.enrichment import MERCHANT_COLUMNS
    from read_models.sequence import sequence
    from spark_apps.arrow_rows import arrow_schema
    from tests.merchant_history import reference, write_dimension

    settings = Settings(home=tmp_path)
    events = events_for(GeneratorConfig(accounts=6, commands=80, merchants=10, seed=5, run_id="bfdag"))
    admitted = sequence(events).admitted
    payments = read_models.get("payments")
    before = [{**dict(zip(payments.key, k)), **r} for k, r in payments.expected_rows(admitted).items()]
    write_deltalake(str(Catalog(settings).current("payments").table),
                    pa.Table.from_pylist(before, schema=arrow_schema(payments.schema())))
    write_dimension(settings, events)
    expected = payments.expected_rows(admitted, reference(events))
    differing = sum(1 for r in before if any(r[c] != expected[(r["account_id"], r["payment_id"])][c]
                                             for c in MERCHANT_COLUMNS.values()))
    assert differing

    proc = dags_test(settings, "backfill_reference")
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert f"payments: {differing:,} row(s) differed from the reference data now, {differing:,} set" in text, text[-4000:]
    stored = {(r["account_id"], r["payment_id"]): r for r in catalog_rows(Catalog(settings), "payments")}
    assert {k: {c: r[c] for c in MERCHANT_COLUMNS.values()} for k, r in stored.items()} == {
        k: {c: r[c] for c in MERCHANT_COLUMNS.values()} for k, r in expected.items()}
    with sqlite3.connect(airflow_home(settings) / "airflow.db") as db:
        events = db.execute("SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id").fetchall()
    announced = {name: json.loads(extra) for name, extra in events}
    assert set(announced) == {"payments"}, events
    assert announced["payments"]["rows_set"] == differing and announced["payments"]["delta_version"] == 1
