"""The benchmarks' workloads by domain (bench/workloads.py): about N commands of each domain, dated so that the
handler's clock-skew check accepts them, and the same events as the test oracle's pure-core run; the read models
each domain's benchmarks fold, and the rebuild benchmark's pure helpers (the topic's layout of the events, the
comparison with the oracles)."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

import pytest

from bench.workloads import DOMAINS, READ_MODELS, decided, interleaved, read_models_of, workload
from event_store.envelope import CommandEnvelope, EventEnvelope, parse_time
from tests.domain_helpers import events_of

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
AGGREGATE_TYPES = {"accounts": {"account"}, "iot": {"device"}, "site": {"site"}, "mixed": {"account", "device", "site"}}


@pytest.mark.parametrize("domain", DOMAINS)
def test_about_n_commands_of_the_domain_none_dated_ahead_of_now(domain):
    load = workload(domain, 3000, accounts=300, devices=30, sites=6, run_id="t", now=NOW)
    assert 2900 <= len(load.records) <= 3000 * 1.06  # the account generator adds a few bursts beyond N
    commands = [CommandEnvelope.from_json(raw) for _, raw in load.records]
    assert {c.aggregate_type for c in commands} == AGGREGATE_TYPES[domain]
    if domain in ("iot", "site", "mixed"):
        times = [parse_time(t, "t") for c in commands if c.aggregate_type != "account"
                 for t in (c.payload.get("measured_at"), c.payload.get("viewed_at")) if t]
        assert times and max(times) <= NOW


def test_mixed_interleaves_the_three_domains_each_in_its_order():
    a, b = [("a", b"1"), ("a", b"2"), ("a", b"3")], [("b", b"1")]
    assert interleaved(a, b, []) == [("a", b"1"), ("b", b"1"), ("a", b"2"), ("a", b"3")]
    load = workload("mixed", 3000, accounts=300, devices=33, sites=6, run_id="t", now=NOW)
    assert Counter(CommandEnvelope.from_json(raw).aggregate_type for _, raw in load.records[:3]) == \
        Counter({"account": 1, "device": 1, "site": 1})


def test_decided_events_are_the_oracles():
    load = workload("mixed", 1500, accounts=100, devices=33, sites=6, run_id="t", now=NOW)
    events, refused = decided(load.records, recorded_at="2026-02-01T00:00:00.000Z")
    expected = events_of(load.records, recorded_at="2026-02-01T00:00:00.000Z")
    assert events == [(e.aggregate_id.encode(), e.to_json()) for e in expected]
    assert 0 < refused < len(load.records) // 10  # the generators' deliberate rejections, a few


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_models_folded_per_domain_are_registered_and_read_the_domains_events(domain):
    import read_models

    models = read_models_of(domain)
    assert [m.name for m in models] == list(READ_MODELS[domain])
    assert all(read_models.REGISTRY[m.name] is m for m in models)
    load = workload(domain, 600, accounts=60, devices=30, sites=6, run_id="t", now=NOW)
    events, _ = decided(load.records, recorded_at="2026-02-01T00:00:00.000Z")
    types = {EventEnvelope.from_json(raw).event_type for _, raw in events}
    for model in models:  # every model folds some of the domain's events but the detector's (no detector runs)
        assert bool(set(model.event_types) & types) == (model.name != "telemetry_anomalies"), model.name


def test_the_models_per_domain():
    assert READ_MODELS["accounts"] == ("account_summary", "payments")  # the accounts' figures stay comparable
    assert READ_MODELS["iot"] == ("device_status", "device_minute_readings", "telemetry_anomalies")
    assert READ_MODELS["site"] == ("page_minute_clicks",)
    assert READ_MODELS["mixed"] == READ_MODELS["accounts"] + READ_MODELS["iot"] + READ_MODELS["site"]
    with pytest.raises(ValueError, match="unknown domain 'cars'"):
        read_models_of("cars")


def test_log_records_place_each_aggregate_in_one_partition_in_order_and_resend_a_share_later():
    from bench.rebuild import log_records

    events = [(f"agg-{a}".encode(), f'{{"a": {a}, "v": {v}}}'.encode()) for v in range(1, 41) for a in range(50)]
    records = log_records(events, 3)
    assert [(k, v) for _, _, k, v in records] == events
    for p in range(3):  # offsets 0, 1, 2 ... in each partition
        assert [o for q, o, _, _ in records if q == p] == list(range(sum(q == p for q, *_ in records)))
    partition_of = {}
    for p, _, key, _ in records:
        assert partition_of.setdefault(key, p) == p
    assert len(set(partition_of.values())) == 3

    again = log_records(events, 3, duplicates=0.05)
    assert again[:len(events)] == records and again == log_records(events, 3, duplicates=0.05)
    resent = again[len(events):]
    assert 0.02 * len(events) < len(resent) < 0.08 * len(events)
    first = {(k, v): (p, o) for p, o, k, v in records}
    for p, o, k, v in resent:  # the same record, later in the same partition
        assert first[(k, v)][0] == p and first[(k, v)][1] < o


def test_fold_differences_names_missing_extra_and_differing_rows_and_ignores_columns_the_oracle_lacks():
    from bench.rebuild import fold_differences

    expected = {("d1",): {"device_id": "d1", "readings": 2}, ("d2",): {"device_id": "d2", "readings": 1}}
    table = {("d1",): {"device_id": "d1", "readings": 2, "window_end": None},
             ("d2",): {"device_id": "d2", "readings": 1, "window_end": None}}
    assert fold_differences(expected, table) == ""
    assert fold_differences(expected, {("d1",): table[("d1",)]}) == \
        "1 rows, the oracle 2 (1 missing, 0 extra, e.g. ('d2',))"
    wrong = {**table, ("d2",): {"device_id": "d2", "readings": 3}}
    assert fold_differences(expected, wrong) == "1 of 2 rows differ, e.g. ('d2',): readings 3 != 1"


def test_the_freshness_bench_times_a_rapid_attempt_from_the_payment_that_made_it():
    """A payment received after another but earlier in event time flags the other (rule 1): the latency runs from
    the later arrival, found through the finding's evidence (the format fraud_rules writes)."""
    from types import SimpleNamespace

    from bench.freshness import FraudWatch
    from event_store.account.fraud_rules import FraudState, Observation, detect

    state, _ = detect(FraudState(), Observation("PaymentAuthorized", 1, 5_000, "p-late-in-time", 100, "Oslo"))
    _, findings = detect(state, Observation("PaymentAuthorized", 2, 1_000, "p-early-in-time", 100, "Oslo"))
    [finding] = findings
    assert finding.payment_id == "p-late-in-time"
    watch = SimpleNamespace(paid={"p-late-in-time": 100.0, "p-early-in-time": 160.0})
    as_event = {"payment_id": finding.payment_id, "rule": finding.rule, "evidence": finding.evidence}
    assert FraudWatch.caused_at(watch, as_event) == 160.0
    other_rule = {**as_event, "rule": "amount_above_max", "evidence": "amount 5 > previous max 4"}
    assert FraudWatch.caused_at(watch, other_rule) == 100.0


def test_a_partial_report_keeps_the_other_sections_each_saying_when_it_ran():
    from bench.report import TITLES, earlier_sections

    old = ("# eventlake benchmarks\n\n2026-11-26 09:39 UTC on vm: 2 cores.\n\nMade by `.venv/bin/python bench/report.py "
           "--quick`. Absolute figures move.\n\n## Command path\n\nAccepted commands/s.\n\n```\n1,000/s\n```\n\n"
           "## SQL reads\n\nRun 2026-11-27 10:00 UTC: `.venv/bin/python bench/report.py --only sql`.\n\n```\nfast\n```\n")
    sections = earlier_sections(old)
    assert set(sections) == {"commands", "sql"}
    assert sections["commands"].startswith(f"{TITLES['commands']}\n\nRun 2026-11-26 09:39 UTC: "
                                           "`.venv/bin/python bench/report.py --quick`.\n\nAccepted commands/s.")
    assert "1,000/s" in sections["commands"]
    assert sections["sql"].count("Run ") == 1 and "2026-11-27 10:00 UTC" in sections["sql"]
