"""The benchmarks' workloads by domain (bench/workloads.py): about N commands of each domain, dated so that the
handler's clock-skew check accepts them, and the same events as the test oracle's pure-core run."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

import pytest

from bench.workloads import DOMAINS, decided, interleaved, workload
from event_store.envelope import CommandEnvelope, parse_time
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
