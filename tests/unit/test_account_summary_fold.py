"""The plain-Python fold of account_summary (the oracle the Spark projection is checked against)."""
import random

from eventlake.generator import GeneratorConfig
from read_models.account.account_summary import MODEL
from tests.domain_helpers import events_for

CFG = GeneratorConfig(accounts=40, commands=600, seed=7, run_id="fold")


def test_fold_gives_one_row_per_opened_account_with_consistent_money():
    rows = MODEL.python_fold(events_for(CFG))
    assert len(rows) == 40
    for row in rows.values():
        assert row["available_minor"] == row["credit_limit_minor"] - row["authorized_total_minor"]
        assert row["status"] in ("open", "frozen")
        assert row["version"] >= 1


def test_applying_the_log_twice_equals_once():
    events = events_for(CFG)
    assert MODEL.python_fold(events + events) == MODEL.python_fold(events)


def test_order_within_the_log_does_not_matter():
    events = events_for(CFG)
    shuffled = events[:]
    random.Random(3).shuffle(shuffled)
    assert MODEL.python_fold(shuffled) == MODEL.python_fold(events)


def test_a_gap_stops_the_account_at_the_last_contiguous_version():
    events = [e for e in events_for(CFG) if e.aggregate_id == "acc-fold-00001"]
    assert len(events) >= 4
    without_v3 = [e for e in events if e.aggregate_version != 3]
    assert MODEL.python_fold(without_v3)[("acc-fold-00001",)]["version"] == 2
