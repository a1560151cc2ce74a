"""``eventlake forget`` killed (-9) at each of its steps, then run again: it completes, and no byte of the subject's
values is left under the warehouse (data files, Delta logs, dead letters) while the other customer's stay. Real
delta-rs tables and the real CLI in a process of its own (lakehouse.faults' hook); no broker needed, but for the
step between the keys topic's tombstone and this home's key files."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from event_store import kafka_log
from event_store.key_files import b64url
from event_store.personal_data import KeyRecord, SubjectKeys, keys_dir
from event_store.sealing import subject_keys
from lakehouse.settings import Settings
from lakehouse.tables import read_table
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("after-key", "after-update", "after-checkpoint", "after-first-delete")
PLAIN = (b"Ada Lovelace", b"ada@example.org", b"IS-RKV")


def _home(tmp_path, broker: Settings | None = None) -> Settings:
    """A home whose warehouse holds Ada's and Grace's values; with ``broker``, their keys on its keys topic too."""
    if broker is None:
        settings = Settings.load({}).replace(home=tmp_path / "home", subject_keys_topic="off")
        keys = SubjectKeys(keys_dir(settings.home))
    else:
        settings = broker.replace(home=tmp_path / "home")
        kafka_log.ensure_topics(settings, log=lambda *_: None)
        keys = subject_keys(settings, defer_sync=True)
    write_deltalake(str(settings.table_path(ARCHIVE_TABLE)), pa.Table.from_pylist([
        {"aggregate_type": "account", "aggregate_id": "acc-ada", "customer_name": keys.seal("cust-ada",
                                                                                            "customer_name", "x")},
        {"aggregate_type": "account", "aggregate_id": "acc-grace", "customer_name": keys.seal("cust-grace",
                                                                                              "customer_name", "y")}]))
    summary = str(Catalog(settings).current("account_summary").table)
    write_deltalake(summary, pa.Table.from_pylist([
        {"account_id": "acc-ada", "customer_name": "Ada Lovelace", "customer_email": "ada@example.org",
         "last_device_location": "IS-RKV", "balance": 1},
        {"account_id": "acc-grace", "customer_name": "Grace Hopper", "customer_email": "grace@example.org",
         "last_device_location": "US-NYC", "balance": 2}]))
    if broker is not None:
        keys.sync()
    DeltaTable(summary).update(updates={"balance": "balance + 1"}, predicate="account_id = 'acc-grace'")
    write_deltalake(str(settings.table_path(DEAD_LETTER_TABLE)), pa.Table.from_pylist([
        {"reason": "not an event", "raw_value": '{"customer_name": "Ada Lovelace"', "raw_bytes": b"Ada Lovelace",
         "kafka_topic": "events", "kafka_partition": 0, "kafka_offset": 7,
         "dead_lettered_at": datetime(2026, 11, 30, tzinfo=timezone.utc), "kafka_key": "acc-ada"}]))
    old = time.time() - 3600
    for path in settings.warehouse.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))
    return settings


def _forget(settings: Settings, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EVENTLAKE_FAULT_KILL_IN_ERASURE"}
    env.update(EVENTLAKE_HOME=str(settings.home), PYTHONPATH=str(ROOT),
               EVENTLAKE_SUBJECT_KEYS_TOPIC=settings.subject_keys_topic, EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix,
               EVENTLAKE_TOPIC_PARTITIONS=str(settings.topic_partitions))
    if settings.subject_keys_topic == "on":
        env["KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers
    if fault:
        env["EVENTLAKE_FAULT_KILL_IN_ERASURE"] = fault
    return subprocess.run([sys.executable, "-c", "from eventlake.cli import entry; entry()", "forget", "cust-ada",
                           "--reason", "request #21", "--grace-minutes", "0", "--no-log-event"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300)


def _left(settings: Settings) -> list[bytes]:
    """The subject's plain values still stored under the warehouse (none once forgotten); Grace's must stay."""
    stored = b"".join(p.read_bytes() for p in settings.warehouse.rglob("*") if p.is_file())
    assert b"Grace Hopper" in stored
    return [p for p in PLAIN if p in stored]


@pytest.mark.parametrize("step", STEPS)
def test_forget_killed_at_a_step_then_run_again_completes_and_leaves_no_byte(tmp_path, step):
    settings = _home(tmp_path)
    killed = _forget(settings, step)
    assert killed.returncode == -9, (killed.stdout, killed.stderr)  # the step was reached
    assert SubjectKeys(keys_dir(settings.home)).state("cust-ada") == "forgotten"

    again = _forget(settings)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert "complete: no read model table or its history holds the subject's values" in again.stdout

    assert _left(settings) == []
    rows = {r["account_id"]: r for r in read_table(Catalog(settings).current("account_summary").table).to_pylist()}
    assert [rows["acc-ada"][c] for c in ("customer_name", "customer_email", "last_device_location", "balance")] == \
        [None, None, None, 1]
    assert [rows["acc-grace"][c] for c in ("customer_name", "customer_email", "balance")] == \
        ["Grace Hopper", "grace@example.org", 3]
    letter = read_table(settings.table_path(DEAD_LETTER_TABLE)).to_pylist()[0]
    assert (letter["reason"], letter["kafka_offset"], letter["raw_value"], letter["raw_bytes"]) == \
        ("not an event", 7, None, None)


def test_forget_killed_between_the_keys_topics_tombstone_and_the_homes_files_then_run_again_completes(
        settings, tmp_path):
    """Killed once the tombstone is on the keys topic but before this home's files take it: every other home
    already reads the subject as forgotten, this one still holds the key; the next run finds the tombstone on the
    topic, takes it into the files (the key's bytes gone) and completes the erasure."""
    home = _home(tmp_path, settings)
    key = next(r for r in SubjectKeys(keys_dir(home.home)).records() if r.subject == "cust-ada").key

    killed = _forget(home, "after-topic-tombstone")
    assert killed.returncode == -9, (killed.stdout, killed.stderr)  # the step was reached
    on_topic = [KeyRecord.decode(r.key, r.value) for r in kafka_log.read_all(home, home.keys_topic)]
    assert [r.forgotten for r in on_topic if r.subject == "cust-ada"] == [False, True]
    assert SubjectKeys(keys_dir(home.home)).state("cust-ada") == "key"  # this home's files: not yet
    elsewhere = subject_keys(home.replace(home=tmp_path / "elsewhere"))
    elsewhere.refresh()  # another machine's home follows the topic
    assert elsewhere.state("cust-ada") == "forgotten"
    assert _left(home) != []  # nothing erased yet

    again = _forget(home)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert "complete: no read model table or its history holds the subject's values" in again.stdout
    assert SubjectKeys(keys_dir(home.home)).state("cust-ada") == "forgotten"
    held = b"".join(p.read_bytes() for p in keys_dir(home.home).rglob("*") if p.is_file())
    assert key not in held and b64url(key).encode() not in held and _left(home) == []
