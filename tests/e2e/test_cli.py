"""End to end through the `eventlake` console entry point, as a user runs it."""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def run(args, env, timeout=900):  # a bound on a hang, not a time aim
    return subprocess.run([EVENTLAKE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(settings):
    e = dict(os.environ)
    e.update(KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
             EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_HANDLER_GROUP_ID=settings.handler_group_id,
             EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2")
    return e


def test_demo_then_sql_query(env, settings):
    demo = run(["demo", "--accounts", "40", "--commands", "400", "--devices", "10", "--sites", "2"], env)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    run_id = re.search(r"== eventlake demo: run (\d+) ==", out).group(1)
    assert re.search(r"account_summary for this run: 40 accounts", out)
    # Every built-in domain in one run: devices (two of the generator's cases are decommissions) and page views.
    assert re.search(r"device_status for this run: 10 devices \(2 decommissioned\), \d+ readings", out), out
    assert re.search(r"sent \d+ commands to \S+ \(run \d+\): \d+ for 40 accounts, \d+ for 10 devices, \d+ for 2 "
                     r"sites", out), out
    pages = out.split("FROM page_minute_clicks")[1]
    assert re.search(r"^/\s*\|\s*\d+", pages, re.M), pages  # the home page draws the most views
    assert ("data quality: 9 tables against their Great Expectations suites (expectations/) and reconciled with "
            "a fold of the archived log: all passed") in out, out
    # The merchants file loaded before the projection: each payment joined with its merchant as of its time, so
    # the categories are the sample's MCCs (four digits), none unknown.
    categories = out.split("FROM category_minute_volume")[1].split("\n\n")[0]
    assert re.search(r"^\d{4}\s*\|\s*\d+", categories, re.M) and "unknown" not in categories, categories
    assert str(settings.warehouse) in out and settings.events_topic in out

    _assert_the_lineage_graph(settings)

    query = run(["query", f"SELECT count(*) AS n, sum(version) AS versions FROM account_summary "
                          f"WHERE account_id LIKE 'acc-{run_id}-%'"], env)
    assert query.returncode == 0, query.stderr
    lines = query.stdout.splitlines()
    assert lines[0].split("|")[0].strip() == "n"
    assert lines[2].split("|")[0].strip() == "40"
    archived = run(["query", f"SELECT count(*) AS events FROM event_archive WHERE aggregate_type = 'account' "
                             f"AND aggregate_id LIKE 'acc-{run_id}-%'"], env)
    assert archived.returncode == 0, archived.stderr
    events = int(archived.stdout.splitlines()[2])
    assert int(lines[2].split("|")[1]) == events  # every event applied exactly once: versions sum to events

    status = run(["status"], env)
    assert status.returncode == 0, status.stderr
    assert re.search(r"projection-account_summary\+payments\+merchant_minute_volume\+fraud_alerts\+"
                     r"category_minute_volume\+device_status\+"
                     r"device_minute_readings\+telemetry_anomalies\+page_minute_clicks: lag 0 events",
                     status.stdout), status.stdout
    assert re.search(r"account_summary\s+40 rows", status.stdout), status.stdout

    bad = run(["query", "SELECT nope FROM account_summary"], env)
    assert bad.returncode == 2
    assert "nope" in bad.stderr and "account_summary" in bad.stderr

    # Maintenance by hand: the demo's tables got one commit per batch; compaction changes no answer.
    maintained = run(["maintenance", "account_summary", "payments"], env)
    assert maintained.returncode == 0, maintained.stdout[-3000:] + maintained.stderr[-3000:]
    for name in ("account_summary", "payments"):
        assert f"maintenance: {name}: generation 1 is current; kept 1; dropped none" in maintained.stdout
        assert re.search(rf"vacuum \S+/{name}: 0 unreferenced file\(s\) older than 168h deleted", maintained.stdout)
    # The writers' auto compaction (EVENTLAKE_AUTO_COMPACT_MIN_FILES) may have left nothing to compact.
    assert re.search(r"optimize \S+/payments: (\d+ file\(s\) compacted into 1|0 file\(s\) compacted into 0)",
                     maintained.stdout), maintained.stdout
    again = run(["query", f"SELECT count(*) AS n, sum(version) AS versions FROM account_summary "
                          f"WHERE account_id LIKE 'acc-{run_id}-%'"], env)
    assert again.stdout == query.stdout


def _assert_the_lineage_graph(settings) -> None:
    """The demo's OpenLineage runs (the file under the home) make one graph: commands topic -> handler -> events
    topic -> projection -> every read model's table; events -> each detector and the policy -> commands (the loop);
    the merchants file -> load_merchants -> dim_merchant -> the projection. Every run started ended, and
    completed."""
    import read_models
    from lakehouse.lineage import events_file, read_events, table
    from read_models.catalog import DIM_MERCHANT_TABLE, Catalog

    events = read_events(events_file(settings))
    ends = {e["run"]["runId"]: e["eventType"] for e in events if e["eventType"] != "START"}
    starts = [e for e in events if e["eventType"] == "START"]
    assert starts and all(ends.get(e["run"]["runId"]) == "COMPLETE" for e in starts), (starts, ends)
    edges = {(i["name"], e["job"]["name"], o["name"]) for e in starts for i in e["inputs"] for o in e["outputs"]}
    commands, events_topic = settings.commands_topic, settings.events_topic
    assert (commands, f"handler.{settings.handler_group_id}", events_topic) in edges
    for job in ("detect-fraud", "policy", "detect-anomalies"):
        assert (events_topic, job, commands) in edges, job
    names = list(read_models.REGISTRY)
    [projection] = {job for _, job, _ in edges if job.startswith("projection.")}
    catalog = Catalog(settings)
    for name in names:
        assert (events_topic, projection, table(catalog.current(name).table).name) in edges, name
    assert any(job == "load_merchants" and out == table(settings.table_path(DIM_MERCHANT_TABLE)).name
               for _, job, out in edges)
    # ... and dim_merchant -> the projection: payments joined with their merchant as of their time.
    dim = table(settings.table_path(DIM_MERCHANT_TABLE)).name
    assert (dim, projection, table(catalog.current("payments").table).name) in edges


def test_maintenance_refuses_bad_input_before_starting_spark(env):
    unknown = run(["maintenance", "account_sumary"], env)
    assert unknown.returncode == 2
    assert "unknown read model(s) account_sumary; known: account_summary" in unknown.stderr
    short = run(["maintenance", "--retention-hours", "24"], env)
    assert short.returncode == 2
    assert "--retention-hours 24: below Delta's default retention of 168 hours" in short.stderr


def test_query_before_any_table_exists_says_what_to_do(env):
    result = run(["query", "SELECT 1"], env)
    assert result.returncode == 2
    assert "eventlake demo" in result.stderr


def test_local_kafka_up_is_idempotent_and_down_stops_it(tmp_path):
    e = dict(os.environ)
    e.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    e.update(EVENTLAKE_HOME=str(tmp_path), EVENTLAKE_KAFKA_PORT=str(_free_port()),
             EVENTLAKE_KAFKA_CONTROLLER_PORT=str(_free_port()))
    try:
        first = run(["kafka", "up"], e, timeout=120)
        assert first.returncode == 0, first.stderr
        assert "running (pid" in first.stdout
        again = run(["kafka", "up"], e, timeout=60)
        pid = re.search(r"running \(pid (\d+)\)", first.stdout).group(1)
        assert again.returncode == 0 and f"running (pid {pid})" in again.stdout  # the same broker, not a second
        topics = run(["topics"], e, timeout=60)
        assert topics.returncode == 0 and "retention.ms=-1" in topics.stdout
    finally:
        down = run(["kafka", "down"], e, timeout=60)
    assert "stopped" in down.stdout
    status = run(["kafka", "status"], e, timeout=60)
    assert "stopped" in status.stdout
    refused = run(["topics"], e, timeout=60)
    assert refused.returncode != 0 and "eventlake kafka up" in refused.stderr
