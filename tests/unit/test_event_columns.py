"""The event tables' columns as the Spark side derives them from the registered domains (no Spark needed).

event_archive, the sequence tables (``_pending``, ``_sequence_held``) and the dead letters were created with
the account domain's columns in this order; Delta keeps a table's column order, so the derived list must start
with exactly these, and a new domain's columns come after them (docs/DESIGN.md, "Adding a domain")."""
from __future__ import annotations

from dataclasses import replace

import pytest

from event_store import domains
from event_store.account import DOMAIN as ACCOUNT
from event_store.fields import ID, Field
from spark_apps.events import PayloadColumnError, event_columns, payload_columns

# The on-disk contract, written out literally: do not derive it.
ACCOUNT_PAYLOAD_COLUMNS = ("customer_id", "currency", "payment_id", "merchant_id", "location", "reason", "rule",
                           "evidence", "merchant_country", "record", "resolved_by", "credit_limit_minor",
                           "amount_minor")
EVENT_COLUMNS_TODAY = ("event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id",
                       "aggregate_version", "occurred_at", "recorded_at", "command_id", "correlation_id",
                       "causation_id", *ACCOUNT_PAYLOAD_COLUMNS, "kafka_topic", "kafka_partition", "kafka_offset")


def _domain(name: str, events: dict, **extra):
    """A test-only domain: only what the registry and the Spark side read of it is real."""
    return replace(ACCOUNT, aggregate_type=name, commands={}, events=events,
                   event_schema_versions=dict.fromkeys(events, 1), upcasters={}, spark_upcasters={},
                   payload_column_order=(), **extra)


def test_the_account_columns_come_first_in_todays_order():
    assert payload_columns()[:len(ACCOUNT_PAYLOAD_COLUMNS)] == ACCOUNT_PAYLOAD_COLUMNS
    if list(domains.DOMAINS) == ["account"]:
        assert event_columns() == EVENT_COLUMNS_TODAY


def test_a_registered_domain_adds_its_fields_after_the_account_columns_and_shares_equal_names():
    gauge = _domain("gauge", {"GaugeRead": {"gauge_id": ID, "level": Field(int, gt=0), "location": ID},
                              "GaugeMoved": {"site": ID, "gauge_id": ID}})
    before = payload_columns()
    with domains.registered(gauge):
        assert payload_columns() == (*before, "gauge_id", "level", "site")  # location: the account's column
        assert event_columns()[-3:] == ("kafka_topic", "kafka_partition", "kafka_offset")
    assert payload_columns() == before


@pytest.mark.parametrize("events, expected", [
    ({"GaugeRead": {"level": Field(float)}}, "domain 'gauge', event type 'GaugeRead', payload field 'level': kind "
                                             "float has no Spark column type"),
    ({"GaugeRead": {"level": Field(int, required=False)}}, "domain 'gauge', event type 'GaugeRead', payload field "
                                                           "'level': an optional integer field"),
    ({"GaugeRead": {"amount_minor": ID}}, "domain 'gauge', event type 'GaugeRead', payload field 'amount_minor': "
                                          "kind str, but domain 'account', event type 'PaymentAuthorized' has it as int"),
    ({"GaugeRead": {"kafka_offset": ID}}, "domain 'gauge', event type 'GaugeRead', payload field 'kafka_offset': "
                                          "named like a column of the event rows"),
])
def test_a_field_the_spark_side_cannot_carry_is_refused_naming_it(events, expected):
    with domains.registered(_domain("gauge", events)):
        with pytest.raises(PayloadColumnError, match="^" + expected.replace("(", r"\(")):
            payload_columns()
    assert payload_columns()[:len(ACCOUNT_PAYLOAD_COLUMNS)] == ACCOUNT_PAYLOAD_COLUMNS
