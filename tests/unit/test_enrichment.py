"""The as-of join of reference data (``read_models.enrichment``): the rule in plain Python (the oracle's) on
hand-made histories, and its DuckDB SQL (the Python engine's and the rebuild's) agreeing with it on every payment
of the contract log, whose dimension has every case (``tests/merchant_history.py``). The Spark form is checked
against the same oracle by ``tests/integration/test_engine_contracts.py``."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from event_store.envelope import parse_time
from read_models.enrichment import MERCHANT_COLUMNS, MERCHANT_TABLE, MerchantHistory, enriched_sql
from tests.iot_events import duckdb_rows
from tests.merchant_history import dimension_rows, dimension_table
from tests.unit.test_read_model_contracts import ADMITTED, _archive

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
NULLS = dict.fromkeys(MERCHANT_COLUMNS.values())


def _version(merchant, name, start, end=None):
    return {"merchant_id": merchant, "name": name, "mcc": "5411", "risk_level": "low", "valid_from": start,
            "valid_to": end}


def _named(name):
    return {"merchant_name": name, "merchant_category": "5411", "merchant_risk": "low"}


def test_an_event_takes_the_version_valid_at_its_time_and_the_first_one_before_it_and_none_after_a_close():
    hour = timedelta(hours=1)
    history = MerchantHistory([
        _version("m1", "old", T0, T0 + hour), _version("m1", "new", T0 + hour),   # changed at T0 + 1h
        _version("m2", "gone", T0, T0 + hour),                                   # closed at T0 + 1h
        _version("m3", "late", T0 + 5 * hour),                                   # loaded after the payments
        _version("m4", "back", T0 + 3 * hour), _version("m4", "first", T0, T0 + hour),  # closed, then back
    ])
    assert history.attributes("m1", T0 - hour) == _named("old")      # before the first version: the first
    assert history.attributes("m1", T0) == _named("old")
    assert history.attributes("m1", T0 + hour - timedelta(microseconds=1)) == _named("old")
    assert history.attributes("m1", T0 + hour) == _named("new")      # valid_from <= t < valid_to
    assert history.attributes("m2", T0 + 2 * hour) == NULLS          # after the close: nothing
    assert history.attributes("m3", T0) == _named("late")            # a late-arriving merchant
    assert history.attributes("m4", T0 + 2 * hour) == NULLS          # between the close and the return
    assert history.attributes("m4", T0 + 4 * hour) == _named("back")
    assert history.attributes("unknown", T0) == NULLS
    assert history.attributes(None, T0) == NULLS
    assert history.attributes("m1", "2026-03-01T13:30:00Z") == _named("new")  # an event's text time reads too


def test_the_sql_join_gives_every_payment_what_the_oracle_gives_it_and_the_contract_log_has_every_case():
    payments = [e for e in ADMITTED if e.event_type in ("PaymentAuthorized", "PaymentDeclined")]
    joined = duckdb_rows(enriched_sql("events_plain", [MERCHANT_TABLE]),
                         {"events_plain": _archive(payments), MERCHANT_TABLE: dimension_table(ADMITTED)},
                         ("event_id",))
    history = MerchantHistory(dimension_rows(ADMITTED))
    assert len(joined) == len(payments)  # a left join: no payment lost, none repeated
    names = []
    for e in payments:
        expected = history.attributes(e.payload["merchant_id"], parse_time(e.occurred_at, "occurred_at"))
        assert {c: joined[(e.event_id,)][c] for c in MERCHANT_COLUMNS.values()} == expected, e.event_id
        names.append(expected["merchant_name"])
    # Unknown or closed (null), and the first and second versions: each case is met.
    assert None in names
    assert any(n and n.endswith("'v1'") for n in names) and any(n and n.endswith("'v2'") for n in names)
