"""A service's /metrics (lakehouse/metrics.py): served from the figures it keeps, registered under its home for
`eventlake metrics` and Prometheus' file discovery, gone with it; the handler's and the engine's figures."""
import json
import socket

import pytest

from event_store.handler_stats import HandlerStats, figures
from event_store.partition_state import PartitionState
from lakehouse import metrics
from lakehouse.metrics import MetricsError, Sample
from lakehouse.settings import Settings, SettingsError


@pytest.fixture
def settings(tmp_path):
    return Settings.load({}).replace(home=tmp_path / "home")


def test_a_service_serves_its_figures_and_registers_where_prometheus_and_the_cli_find_it(settings):
    stats = HandlerStats(accepted=7, rejected=2, events=9, transactions=3, aborted=1,
                         by_type={("OpenAccount", "accepted"): 3, ("AuthorizePayment", "accepted"): 4,
                                  ("OpenAccount", "rejected"): 1})
    owned = {0: PartitionState(0), 1: PartitionState(1)}
    server = metrics.serve(settings, "handler-0", lambda: figures(stats, owned), log=lambda *_: None)
    try:
        samples = metrics.scrape(server.url)
        served = {(n, tuple(sorted(ls.items()))): v for n, ls, v in samples}
        def commands(outcome, kind):
            return served[("eventlake_handler_commands_total", (("outcome", outcome), ("service", "handler-0"),
                                                                ("type", kind)))]
        # By command type and outcome: a rejection not of a registered type (an invalid record) is "unknown".
        assert (commands("accepted", "OpenAccount"), commands("accepted", "AuthorizePayment")) == (3, 4)
        assert (commands("rejected", "OpenAccount"), commands("rejected", "unknown")) == (1, 1)
        assert (commands("duplicate", "unknown"), commands("dead_lettered", "unknown")) == (0, 0)
        assert ("eventlake_handler_commands_total", (("outcome", "accepted"), ("service", "handler-0"),
                                                     ("type", "unknown"))) not in served
        assert served[("eventlake_handler_events_total", (("service", "handler-0"),))] == 9
        assert served[("eventlake_handler_transactions_total", (("result", "aborted"), ("service", "handler-0")))] == 1
        assert served[("eventlake_handler_partitions", (("service", "handler-0"),))] == 2
        assert any(n == "process_resident_memory_bytes" for n, _, _ in samples)
        stats.events += 1  # read at each scrape: nothing to update on the command path
        assert ("eventlake_handler_events_total", {"service": "handler-0"}, 10.0) in metrics.scrape(server.url)
        # Prometheus' file_sd format, and `eventlake metrics`.
        [entry] = json.loads(server.registration.read_text())
        assert entry["targets"] == [f"127.0.0.1:{server.port}"] and entry["labels"]["service"] == "handler-0"
        assert [t.url for t in metrics.local_targets(settings)] == [server.url]
        table = "\n".join(metrics.table(settings))
        assert "handler-0 (pid" in table and "eventlake_handler_events_total" in table and "10" in table
    finally:
        server.close()
    assert not server.registration.exists() and metrics.local_targets(settings) == []
    assert metrics.table(settings)[0].startswith("no service of this home serves metrics now")


def test_a_registration_left_by_a_killed_service_is_skipped(settings):
    folder = settings.home / "metrics"
    folder.mkdir(parents=True)
    gone = 2 ** 22 + 12345  # above Linux's largest pid
    (folder / f"projection-{gone}.json").write_text(json.dumps(
        [{"targets": ["127.0.0.1:1"], "labels": {"service": "projection", "pid": str(gone)}}]))
    (folder / "junk.json").write_text("not json")
    assert metrics.local_targets(settings) == []


def test_off_serves_nothing_and_a_wrong_value_or_a_taken_port_is_named(settings):
    assert metrics.serve(settings.replace(metrics="off"), "handler-0", list) is None
    with pytest.raises(SettingsError, match="metrics='yes'.*EVENTLAKE_METRICS"):
        metrics.serve(settings.replace(metrics="yes"), "handler-0", list)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError, match=f"handler-0: cannot serve metrics on 127.0.0.1:{port}.*"
                                               f"EVENTLAKE_METRICS_PORT"):
            metrics.serve(settings.replace(metrics_port=port), "handler-0", list, log=lambda *_: None)
    assert Settings.load({"EVENTLAKE_METRICS_PORT": "9464", "EVENTLAKE_METRICS": "off"}).metrics_port == 9464


def test_an_unreadable_endpoint_is_an_error_naming_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetricsError, match=f"metrics at http://127.0.0.1:{port}/metrics not readable"):
        metrics.scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=2)


def test_a_figure_of_an_unknown_kind_is_refused(settings):
    server = metrics.serve(settings, "x", lambda: [Sample("y", "histogram", "h", 1.0)], log=lambda *_: None)
    try:
        with pytest.raises(MetricsError):  # the scrape fails (500): the figure is refused, not served wrong
            metrics.scrape(server.url)
    finally:
        server.close()


def test_the_handlers_batches_rebalances_quarantines_and_state_sizes(tmp_path):
    """Batches and their time, partitions moved by rebalances, aggregates quarantined, and per owned partition the
    size of its state: aggregates in memory, or its state store's entries, cache and bytes on disk; a store closed
    by the loop while a scrape reads is skipped, not an error."""
    from event_store.state_store import StateStore

    stats = HandlerStats(batches=4, batch_seconds=0.5, quarantined_aggregates=2)
    stats.rebalances["assigned"] += 3
    stats.rebalances["lost"] += 1
    in_memory = PartitionState(0, states={("account", "a-1"): object(), ("account", "a-2"): object()})
    store = StateStore(tmp_path / "store")
    store.write(10, 5, {("account", "a-3"): b"{}"})
    closed = StateStore(tmp_path / "closed")
    closed.close()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in figures(stats, {
        0: in_memory, 1: PartitionState(1, store=store), 2: PartitionState(2, store=closed)})}
    assert got[("handler_batches", ())] == 4 and got[("handler_batch_seconds", ())] == 0.5
    assert got[("handler_quarantined_aggregates", ())] == 2
    assert {k[1]: v for k, v in got.items() if k[0] == "handler_rebalances"} == {
        (("kind", "assigned"),): 3, (("kind", "revoked"),): 0, (("kind", "lost"),): 1}
    assert got[("handler_partitions", ())] == 3
    assert got[("handler_state_aggregates", (("partition", "0"),))] == 2
    assert got[("handler_state_store_entries", (("partition", "1"),))] == store.entries() >= 2
    assert got[("handler_state_store_bytes", (("partition", "1"),))] == store.size_on_disk() > 0
    assert ("handler_state_store_cached_bytes", (("partition", "1"),)) in got
    assert not [k for k in got if ("partition", "2") in k[1]]
    store.close()


def test_the_handlers_figures_follow_prometheus_names():
    names = {s.name for s in figures(HandlerStats(), {})}
    assert all(n.startswith("handler_") and not n.endswith("_total") for n in names)
    kinds = {s.kind for s in figures(HandlerStats(), {})}
    assert kinds <= {"counter", "gauge"}


def test_the_python_engines_figures_per_query():
    from types import SimpleNamespace

    from python_engine.figures import figures as engine_figures

    def query(name, lag):
        return SimpleNamespace(name=name, batches=3, rows=120, batch_seconds=1.5,
                               step_seconds={"payments: merge": 0.5}, last_commit_at=1_800_000_000.0, lag=lag,
                               events={"applied": 118, "late": 2}, held=0, newest_event_at=1_700_000_000.0)

    engine = SimpleNamespace(handed_over=1, plan=SimpleNamespace(name="projection-payments"),
                             queries=[query("projection-payments", {0: 4, 1: 0}), query("projection-event_archive", {})])
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in engine_figures(engine)}
    assert got[("projection_lag_records", (("partition", "0"), ("query", "read_models")))] == 4
    assert got[("projection_records", (("query", "event_archive"),))] == 120
    assert got[("projection_step_seconds", (("query", "read_models"), ("step", "payments: merge")))] == 0.5
    assert got[("projection_handed_over_batches", ())] == 1
    rm = ("query", "read_models")
    assert got[("projection_events", (("outcome", "applied"), rm))] == 118
    assert got[("projection_events", (("outcome", "dead_lettered"), rm))] == 0  # every outcome, 0 included
    assert got[("projection_held_events", (rm,))] == 0
    assert got[("projection_lag_seconds", (rm,))] > 0  # records wait: now less the newest event applied
    assert ("projection_events", (("outcome", "applied"), ("query", "event_archive"))) not in got


def test_how_far_behind_a_projection_is_in_seconds():
    from projection_core.figures import QueryFigures, seconds_behind

    query = QueryFigures()
    assert seconds_behind(query, now=100.0) is None  # no lag known yet
    query.lag = {0: 0, 1: 0}
    assert seconds_behind(query, now=100.0) == 0.0  # read to the end: not behind, however old its last event
    query.lag = {0: 3, 1: 0}
    assert seconds_behind(query, now=100.0) is None  # records wait, none applied since the start
    query.add_outcomes({"applied": 5}, held=0, newest_event_at=90.0)
    query.add_outcomes({"applied": 1, "late": 1}, held=2, newest_event_at=80.0)  # an older newest does not win
    assert seconds_behind(query, now=100.0) == 10.0
    assert query.events == {"applied": 6, "late": 1} and query.held == 2
    with pytest.raises(ValueError, match="'skipped'"):
        query.add_outcomes({"skipped": 1})


def _progress(batch_id, rows, ends, latest, executed=True, timestamp=None, name="projection_payments"):
    """A progress report as Structured Streaming's Kafka source gives it (offsets as JSON text)."""
    durations = {"triggerExecution": 2500, "latestOffset": 5, **({"addBatch": 2000} if executed else {})}
    return {"name": name, "batchId": batch_id, "numInputRows": rows if executed else 0, "durationMs": durations,
            "timestamp": timestamp or f"2026-11-29T12:00:{batch_id:02d}.000Z",
            "sources": [{"startOffset": "null", "endOffset": json.dumps({"events": ends}),
                         "latestOffset": json.dumps({"events": latest})}]}


def test_the_spark_engines_progress_reports_give_the_python_engines_figures():
    from projection_core.figures import QueryFigures
    from spark_apps.progress_figures import ProgressFigures, observe

    steps = {"payments: merge": 0.75}
    progress = ProgressFigures("events", steps, log=lambda *_: None)
    progress.track("projection_payments", "read_models")
    progress.track("projection_event_archive", "event_archive")
    progress.batch_outcomes("read_models", 0, {"applied": 149, "dead_lettered": 1}, held=0, newest_event_at=5.0)
    progress.batch_outcomes("read_models", 1, {"applied": 7}, held=0, newest_event_at=6.0)  # not committed yet
    progress.on_progress(_progress(0, 150, {"0": 100, "1": 50}, {"0": 400, "1": 50}))
    progress.on_progress(_progress(0, 150, {"0": 100, "1": 50}, {"0": 400, "1": 50}))  # delivered twice: once
    progress.on_progress(_progress(1, 0, {"0": 100, "1": 50}, {"0": 420, "1": 60}, executed=False))  # idle report
    progress.on_progress(_progress(0, 9, {"0": 9}, {"0": 9}, name="someone_elses_query"))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in progress.samples()}
    rm = ("query", "read_models")
    assert got[("projection_batches", (rm,))] == 1 and got[("projection_records", (rm,))] == 150
    assert got[("projection_batch_seconds", (rm,))] == 2.5
    assert got[("projection_lag_records", (("partition", "0"), rm))] == 320  # from the latest report, idle or not
    assert got[("projection_lag_records", (("partition", "1"), rm))] == 10
    assert got[("projection_step_seconds", (rm, ("step", "payments: merge")))] == 0.75
    assert ("projection_last_commit_timestamp_seconds", (rm,)) in got
    assert got[("projection_batches", (("query", "event_archive"),))] == 0  # tracked, nothing reported yet
    # A batch's outcomes count with its commit's report, once; a batch not reported committed is not counted.
    assert got[("projection_events", (("outcome", "applied"), rm))] == 149
    assert got[("projection_events", (("outcome", "dead_lettered"), rm))] == 1
    assert got[("projection_newest_event_timestamp_seconds", (rm,))] == 5.0
    # The names and labels are the Python engine's: one dashboard for both engines.
    from types import SimpleNamespace

    from python_engine.figures import figures as engine_figures
    python = QueryFigures()
    python.last_commit_at, python.lag, python.step_seconds = 1.0, {0: 0}, {"payments: merge": 0.1}
    python.add_outcomes({"applied": 3}, held=0, newest_event_at=1.0)
    engine = SimpleNamespace(handed_over=0, plan=SimpleNamespace(name="p"), queries=[SimpleNamespace(
        name="p", **vars(python))])
    assert {(s.name, s.kind, tuple(s.labels)) for s in engine_figures(engine)} - {
        ("projection_handed_over_batches", "counter", ())} == {
        (s.name, s.kind, tuple(s.labels)) for s in progress.samples() if s.labels.get("query") == "read_models"}
    # A query read to the log's end (a transaction marker included in both offsets) has no lag; no offsets yet: none.
    caught_up = QueryFigures()
    observe(caught_up, _progress(3, 5, {"0": 401}, {"0": 401}), "events")
    assert caught_up.lag == {0: 0} and caught_up.batches == 1
    fresh = QueryFigures()
    observe(fresh, {"name": "q", "batchId": 0, "durationMs": {}, "sources": [{"endOffset": "null",
                                                                              "latestOffset": "null"}]}, "events")
    assert fresh.lag == {} and fresh.batches == 0


def test_the_fraud_detectors_and_the_policys_figures():
    from event_store.account.fraud_consumer import FraudStats, figures as detector_figures
    from event_store.account.policy import PolicyStats, figures as policy_figures

    detector = FraudStats(events=40, observed=30, findings=3, by_rule={"velocity": 2, "amount_above_max": 1},
                          accounts=7, lag={0: 5, 1: 0})
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in detector_figures(detector)}
    assert got[("fraud_detector_findings", (("rule", "velocity"),))] == 2
    assert got[("fraud_detector_state_accounts", ())] == 7
    assert got[("consumer_lag_records", (("partition", "0"),))] == 5
    policy = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in policy_figures(PolicyStats(commands=2))}
    assert policy[("policy_commands", ())] == 2
    assert not [k for k in policy if k[0] == "consumer_lag_records"]  # no position yet: no lag served


def test_the_lag_exporters_figures_from_committed_positions(settings):
    """``eventlake lag-exporter``: records past each consumer's committed position by partition (a position past the
    last record, after a transaction marker, is no lag; a partition it has not committed reads from the start), its
    committed offsets, the log's ends, when a projection last committed; refreshes by result."""
    from eventlake.lag_exporter import LagExporter, LagExporterError, Position, Snapshot, figures, lines

    snapshot = Snapshot([Position("projection-p", "projection", "events", {0: 10, 1: 8}, committed_at=1_000.0,
                                  waiting_since={1: 1_990.0}),
                         Position("handler", "group", "commands", {0: 3})],
                        {"events": {0: 7, 1: 9, 2: 4}, "commands": {0: 5}}, refreshed_at=2_000.0, refreshes=3,
                        failures=1, tables={"payments": 1_500.0})
    got = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("kind", "topic")))): s.value
           for s in figures(snapshot)}
    lag = {k[1]: v for k, v in got.items() if k[0] == "committed_lag_records"}
    assert lag == {(("consumer", "projection-p"), ("partition", "0")): 0,   # past the last record: a marker
                   (("consumer", "projection-p"), ("partition", "1")): 1,
                   (("consumer", "projection-p"), ("partition", "2")): 4,   # nothing committed: from the start
                   (("consumer", "handler"), ("partition", "0")): 2}
    assert got[("committed_offset", (("consumer", "projection-p"), ("partition", "1")))] == 8
    # Seconds: where records wait, since the oldest of them was written; 0 where none waits; left out where that
    # record's time is not known (partition 2, the handler's).
    assert {k[1]: v for k, v in got.items() if k[0] == "committed_lag_seconds"} == {
        (("consumer", "projection-p"), ("partition", "0")): 0.0,
        (("consumer", "projection-p"), ("partition", "1")): 10.0}
    assert got[("table_last_commit_timestamp_seconds", (("table", "payments"),))] == 1_500.0
    assert got[("log_end_offset", (("partition", "2"),))] == 4
    assert got[("committed_timestamp_seconds", (("consumer", "projection-p"),))] == 1_000.0
    assert not [k for k in got if k[0] == "committed_timestamp_seconds" and ("consumer", "handler") in k[1]]
    assert got[("lag_exporter_refreshes", (("result", "ok"),))] == 3
    assert got[("lag_exporter_refreshes", (("result", "failed"),))] == 1
    assert lines(snapshot)[0].startswith("projection-p (projection, events): 5 record(s) behind, the oldest waiting "
                                         "10 s, last commit")
    assert lines(snapshot)[-1].startswith("table payments: last commit ")
    # Nothing read yet: no position is shown as if it were known.
    assert [s.name for s in figures(Snapshot())] == ["lag_exporter_refreshes"] * 2
    # The projections it watches are named as `eventlake project` names them.
    exporter = LagExporter(settings, [["account_summary", "payments"], ["event_archive"]])
    assert set(exporter.checkpoints) == {"projection-account_summary+payments", "projection-event_archive"}
    assert exporter.checkpoints["projection-event_archive"] == settings.checkpoints / "projection-event_archive"
    assert exporter.tables.names == ["account_summary", "payments", "event_archive"]
    with pytest.raises(LagExporterError, match="--projection nosuch: unknown read model 'nosuch'"):
        LagExporter(settings, [["nosuch"]])
    with pytest.raises(LagExporterError, match="--every 0: expected a number of seconds above 0"):
        LagExporter(settings, every_s=0)


def test_a_spark_detectors_figures_from_its_progress_reports():
    """`eventlake detect-anomalies` / `detect-fraud --engine spark` (spark_apps.detector_app.DetectorFigures): each
    report folded once however often the query's recent reports are read again; a committed batch counts its events
    and the findings its sink wrote; an idle report gives the lag only."""
    from spark_apps.detector_app import DetectorFigures

    def report(batch, timestamp, rows, written, latest, committed=True):
        return {"batchId": batch, "timestamp": timestamp, "numInputRows": rows,
                "durationMs": {"addBatch": 100, "triggerExecution": 250} if committed else {"triggerExecution": 1},
                "sink": {"numOutputRows": written},
                "sources": [{"endOffset": '{"events": {"0": 5, "1": 3}}',
                             "latestOffset": json.dumps({"events": latest})}]}

    figures = DetectorFigures("events")
    first = [report(0, "t1", 8, 2, {"0": 9, "1": 3})]
    figures.observe(first)
    figures.observe(first + [report(1, "t2", 4, 1, {"0": 5, "1": 3}), report(1, "t3", 0, -1, {"0": 5, "1": 3},
                                                                            committed=False)])
    got = {(s.name, tuple(s.labels.items())): s.value for s in figures.samples()}
    assert got[("detector_batches", ())] == 2 and got[("detector_events", ())] == 12
    assert got[("detector_findings", ())] == 3 and got[("detector_batch_seconds", ())] == 0.5
    assert got[("consumer_lag_records", (("partition", "0"),))] == 0 == got[("consumer_lag_records",
                                                                             (("partition", "1"),))]
    assert ("detector_last_commit_timestamp_seconds", ()) in got


def test_a_push_without_a_pushgateway_does_nothing_and_a_failed_one_is_said_not_raised(settings):
    said = []
    samples = [Sample("check_success", "gauge", "h", 1.0, {"table": "payments"})]
    assert metrics.push(settings, "check_read_models", {"table": "payments"}, samples, said.append) is False
    assert said == []  # none configured: nothing to say
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once this block ends: nothing listens there
    unreachable = settings.replace(pushgateway_url=f"http://127.0.0.1:{port}")
    assert metrics.push(unreachable, "check_read_models", {"table": "payments"}, samples, said.append) is False
    assert len(said) == 1 and f"127.0.0.1:{port}" in said[0] and "EVENTLAKE_PUSHGATEWAY_URL" in said[0], said


def test_sparks_own_metrics_are_asked_of_spark_only_when_on(settings):
    from spark_apps.session import spark_metrics_conf as conf

    assert conf(settings) == {}  # off by default: no UI, nothing served
    on = conf(settings.replace(spark_metrics="on", spark_ui_port=4050))
    assert on["spark.ui.enabled"] == "true" and on["spark.ui.port"] == "4050"
    assert on["spark.metrics.conf.*.sink.prometheusServlet.path"] == metrics.SPARK_METRICS_PATH
    with pytest.raises(SettingsError, match="EVENTLAKE_SPARK_METRICS"):
        conf(settings.replace(spark_metrics="yes"))
