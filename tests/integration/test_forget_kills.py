"""``eventlake forget`` killed (-9) at each of its steps, then run again: it completes, and no byte of the subject's
values is left under the warehouse (data files, Delta logs, dead letters) while the other customer's stay. Real
delta-rs tables and the real CLI in a process of its own; no broker needed (lakehouse.erasure's fault hook)."""
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

from event_store.personal_data import SubjectKeys, keys_dir
from lakehouse.settings import Settings
from lakehouse.tables import read_table
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("after-key", "after-update", "after-checkpoint", "after-first-delete")
PLAIN = (b"Ada Lovelace", b"ada@example.org", b"IS-RKV")


def _home(tmp_path) -> Settings:
    settings = Settings.load({}).replace(home=tmp_path / "home")
    keys = SubjectKeys(keys_dir(settings.home))
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
    # No broker here: the home's key files alone (the keys topic's tombstone is tests/integration/test_keys_topic.py's).
    env.update(EVENTLAKE_HOME=str(settings.home), PYTHONPATH=str(ROOT), EVENTLAKE_SUBJECT_KEYS_TOPIC="off")
    if fault:
        env["EVENTLAKE_FAULT_KILL_IN_ERASURE"] = fault
    return subprocess.run([sys.executable, "-c", "from eventlake.cli import entry; entry()", "forget", "cust-ada",
                           "--reason", "request #21", "--grace-minutes", "0", "--no-log-event"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("step", STEPS)
def test_forget_killed_at_a_step_then_run_again_completes_and_leaves_no_byte(tmp_path, step):
    settings = _home(tmp_path)
    killed = _forget(settings, step)
    assert killed.returncode == -9, (killed.stdout, killed.stderr)  # the step was reached
    assert SubjectKeys(keys_dir(settings.home)).state("cust-ada") == "forgotten"

    again = _forget(settings)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert "complete: no read model table or its history holds the subject's values" in again.stdout

    stored = b"".join(p.read_bytes() for p in settings.warehouse.rglob("*") if p.is_file())
    assert [p for p in PLAIN if p in stored] == [] and b"Grace Hopper" in stored
    rows = {r["account_id"]: r for r in read_table(Catalog(settings).current("account_summary").table).to_pylist()}
    assert [rows["acc-ada"][c] for c in ("customer_name", "customer_email", "last_device_location", "balance")] == \
        [None, None, None, 1]
    assert [rows["acc-grace"][c] for c in ("customer_name", "customer_email", "balance")] == \
        ["Grace Hopper", "grace@example.org", 3]
    letter = read_table(settings.table_path(DEAD_LETTER_TABLE)).to_pylist()[0]
    assert (letter["reason"], letter["kafka_offset"], letter["raw_value"], letter["raw_bytes"]) == \
        ("not an event", 7, None, None)
