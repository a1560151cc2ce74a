"""The cross-model comparison of payments with account_summary, on in-memory tables (no Delta, no Spark)."""
import pyarrow as pa

import read_models
from eventlake.generator import GeneratorConfig
from expectations import checks_for
from expectations.account.payments_match_account_summary import compare_payments_with_summary
from expectations.cross_model import Agreement
from tests.domain_helpers import events_for

SUMMARY = ("account_id", "payments_authorized", "payments_declined", "authorized_total_minor")
PAYMENTS = ("account_id", "status", "amount_minor")


def folded(events):
    """(account_summary, payments) as the plain-Python folds of ``events``, as pyarrow tables."""
    out = []
    for name, columns in (("account_summary", SUMMARY), ("payments", PAYMENTS)):
        model = read_models.REGISTRY[name]
        rows = [{**dict(zip(model.key, key)), **row} for key, row in model.python_fold(events).items()]
        out.append(pa.Table.from_pylist([{c: r[c] for c in columns} for r in rows]))
    return out


def test_the_folds_of_one_log_agree():
    events = events_for(GeneratorConfig(accounts=12, commands=300, seed=5, run_id="xm"))
    summary, payments = folded(events)
    keys, differing, lines = compare_payments_with_summary(summary, payments)
    assert (keys, differing, lines) == (12, 0, [])


def test_each_kind_of_disagreement_names_the_account_and_both_numbers():
    summary = pa.Table.from_pylist([
        {"account_id": "a", "payments_authorized": 2, "payments_declined": 0, "authorized_total_minor": 300},
        {"account_id": "b", "payments_authorized": 1, "payments_declined": 1, "authorized_total_minor": 50},
        {"account_id": "c", "payments_authorized": 0, "payments_declined": 0, "authorized_total_minor": 0}])
    payments = pa.Table.from_pylist([
        {"account_id": "a", "status": "authorized", "amount_minor": 100},
        {"account_id": "a", "status": "authorized", "amount_minor": 201},  # a: the sum differs by 1
        {"account_id": "b", "status": "authorized", "amount_minor": 50},  # b: one declined row missing
        {"account_id": "d", "status": "declined", "amount_minor": 7}])  # d: no account_summary row
    keys, differing, lines = compare_payments_with_summary(summary, payments)
    assert (keys, differing) == (4, 3)
    assert lines == [
        "a: account_summary has payments_authorized=2, payments_declined=0, authorized_total_minor=300; "
        "payments has 2 authorized rows, 0 declined rows, authorized amount_minor sum 301",
        "b: account_summary has payments_authorized=1, payments_declined=1, authorized_total_minor=50; "
        "payments has 1 authorized rows, 0 declined rows, authorized amount_minor sum 50",
        "d: account_summary has payments_authorized=0, payments_declined=0, authorized_total_minor=0 (no "
        "account_summary row); payments has 0 authorized rows, 1 declined rows, authorized amount_minor sum 0"]
    assert compare_payments_with_summary(summary, payments, examples=1)[2][1] == "... and 2 more accounts"


def test_not_compared_is_no_failure_and_a_disagreement_is():
    assert not Agreement("x", False, reason="a batch in progress").failed
    assert Agreement("x", True, keys=3, disagreements=1, examples=("a: ...",)).failed
    assert Agreement("x", True, keys=3, keys_are="accounts").lines() == ["x: agree on all 3 accounts ()"]


def test_a_check_runs_when_all_its_tables_are_named():
    assert checks_for(None) == ["payments_match_account_summary"]
    assert checks_for(["payments", "account_summary", "fraud_alerts"]) == ["payments_match_account_summary"]
    assert checks_for(["payments"]) == []


def test_each_check_is_registered_by_the_domain_whose_read_models_it_compares():
    import expectations

    for domain in (expectations.account, expectations.iot, expectations.site):
        own = set(read_models.__dict__[domain.__name__.split(".")[-1]].MODELS)
        for check in domain.CROSS_MODEL_CHECKS.values():
            assert set(check.tables) <= own, (check.name, check.tables, domain.__name__)
            assert check.run.__module__.startswith(domain.__name__ + "."), check.run.__module__
            assert expectations.CROSS_MODEL_CHECKS[check.name] is check
    assert set(expectations.CROSS_MODEL_CHECKS) == {"payments_match_account_summary"}
