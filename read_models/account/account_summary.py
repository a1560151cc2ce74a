"""``account_summary``: one row per account, its current state (docs/DESIGN.md lists the public columns).

It consumes every account event (even those that change no column, such as FraudSuspected) so
that ``version`` is the last applied ``aggregate_version`` and versions are applied without gaps.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from event_store.account import AccountState, evolve
from event_store.envelope import EventEnvelope, parse_time
from read_models.spec import CURRENT_STATE_BY_VERSION, ReadModel, version_range

__all__ = ["MODEL"]

EVENT_TYPES = ("AccountOpened", "PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported",
               "AccountFrozen", "AccountUnfrozen", "FraudSuspected", "QuarantineResolved", "SubjectForgotten")


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("account_id", StringType(), False),
        StructField("customer_id", StringType()),
        StructField("status", StringType()),
        StructField("credit_limit_minor", LongType()),
        StructField("available_minor", LongType()),
        StructField("currency", StringType()),
        StructField("payments_authorized", LongType()),
        StructField("payments_declined", LongType()),
        StructField("authorized_total_minor", LongType()),
        StructField("last_device_location", StringType()),
        StructField("version", LongType()),
        StructField("updated_at", TimestampType()),
        # The customer's name and email from the account's AccountOpened (issue 45): personal, so null when the
        # command carried none, and null once the customer is forgotten (docs/forgetting.md). Appended: a table
        # made before them gains them when the projection starts (projection_core's tables, both engines).
        StructField("customer_name", StringType()),
        StructField("customer_email", StringType()),
    ])


# Events that change a string column; every other event (the payments, nearly all of the log) only moves
# counts and sums.
_DESCRIBING = ("AccountOpened", "AccountFrozen", "AccountUnfrozen", "DeviceLocationReported", "SubjectForgotten")
# The personal columns (``MODEL.personal_columns``) are null from the account's SubjectForgotten on. No event
# carrying one can follow it (the account refuses every command once its customer is forgotten), so a batch holding
# it folds them to null, and the fold's ``_forgotten`` tells the merge to null the stored ones too.


def _fold(events):
    """Events -> one row of changes per account (vectorised; no Python per row).

    Two aggregations, joined per account: counts and sums over all events, whose buffers are numbers (Spark's
    code-generated hash aggregation), and the latest string values over the few events that set them."""
    from pyspark.sql import functions as F

    kind = F.col("event_type")
    version = F.col("aggregate_version")

    def latest(cond, value):
        # The value carried by the highest-versioned event that matches cond (null when none does).
        return F.max_by(value, F.when(cond, version))

    def count(cond):
        return F.sum(F.when(cond, F.lit(1)).otherwise(F.lit(0))).cast("long")

    opened = kind == "AccountOpened"
    authorized = kind == "PaymentAuthorized"
    account = F.col("aggregate_id").alias("account_id")
    numbers = events.groupBy(account).agg(
        *version_range(),
        count(authorized).alias("payments_authorized"),
        count(kind == "PaymentDeclined").alias("payments_declined"),
        F.sum(F.when(authorized, F.col("amount_minor")).otherwise(F.lit(0))).cast("long")
        .alias("authorized_total_minor"),
        F.max_by("recorded_at", version).alias("updated_at"),
    )
    forgotten = F.max(kind == "SubjectForgotten")

    def personal(value):
        return F.when(forgotten, F.lit(None).cast("string")).otherwise(value)

    strings = events.filter(kind.isin(*_DESCRIBING)).groupBy(account).agg(
        latest(opened, F.col("customer_id")).alias("customer_id"),
        personal(latest(opened, F.col("customer_name"))).alias("customer_name"),
        personal(latest(opened, F.col("customer_email"))).alias("customer_email"),
        latest(opened, F.col("credit_limit_minor")).alias("credit_limit_minor"),
        latest(opened, F.col("currency")).alias("currency"),
        latest(kind.isin("AccountOpened", "AccountFrozen", "AccountUnfrozen"),
               F.when(kind == "AccountFrozen", F.lit("frozen")).otherwise(F.lit("open"))).alias("status"),
        personal(latest(kind == "DeviceLocationReported", F.col("location"))).alias("last_device_location"),
        forgotten.alias("_forgotten"),
    )
    return numbers.join(strings, "account_id", "left")


def _latest(column: str, types: tuple[str, ...]) -> str:
    kinds = ", ".join(f"'{t}'" for t in types)
    latest = f"arg_max_null({column}, aggregate_version) FILTER (WHERE event_type IN ({kinds}))"
    return f"CASE WHEN {_FORGOTTEN_SQL} THEN NULL ELSE {latest} END" if column in _PERSONAL_SOURCES else latest


_FORGOTTEN_SQL = "coalesce(bool_or(event_type = 'SubjectForgotten'), false)"
_PERSONAL_SOURCES = ("customer_name", "customer_email", "location")


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = f"""
SELECT aggregate_id AS account_id,
       min(aggregate_version) AS first_version, max(aggregate_version) AS version, count(*) AS _events,
       count(*) FILTER (WHERE event_type = 'PaymentAuthorized') AS payments_authorized,
       count(*) FILTER (WHERE event_type = 'PaymentDeclined') AS payments_declined,
       coalesce(sum(amount_minor) FILTER (WHERE event_type = 'PaymentAuthorized'), 0) AS authorized_total_minor,
       arg_max_null(recorded_at, aggregate_version) AS updated_at,
       {_latest("customer_id", ("AccountOpened",))} AS customer_id,
       {_latest("credit_limit_minor", ("AccountOpened",))} AS credit_limit_minor,
       {_latest("currency", ("AccountOpened",))} AS currency,
       {_latest("CASE WHEN event_type = 'AccountFrozen' THEN 'frozen' ELSE 'open' END",
                ("AccountOpened", "AccountFrozen", "AccountUnfrozen"))} AS status,
       {_latest("location", ("DeviceLocationReported",))} AS last_device_location,
       {_latest("customer_name", ("AccountOpened",))} AS customer_name,
       {_latest("customer_email", ("AccountOpened",))} AS customer_email,
       {_FORGOTTEN_SQL} AS _forgotten
FROM events GROUP BY aggregate_id
"""

_AUTHORIZED_TOTAL = "t.authorized_total_minor + s.authorized_total_minor"


def _personal(update: str) -> str:
    """A personal column's update: null once the batch holds the account's SubjectForgotten."""
    return f"CASE WHEN s._forgotten THEN NULL ELSE {update} END"


MERGE_UPDATE = {
    "customer_id": "coalesce(s.customer_id, t.customer_id)",
    "status": "coalesce(s.status, t.status)",
    "credit_limit_minor": "coalesce(s.credit_limit_minor, t.credit_limit_minor)",
    "available_minor": f"coalesce(s.credit_limit_minor, t.credit_limit_minor) - ({_AUTHORIZED_TOTAL})",
    "currency": "coalesce(s.currency, t.currency)",
    "payments_authorized": "t.payments_authorized + s.payments_authorized",
    "payments_declined": "t.payments_declined + s.payments_declined",
    "authorized_total_minor": _AUTHORIZED_TOTAL,
    "last_device_location": _personal("coalesce(s.last_device_location, t.last_device_location)"),
    "version": "s.version",
    "updated_at": "s.updated_at",
    "customer_name": _personal("coalesce(s.customer_name, t.customer_name)"),
    "customer_email": _personal("coalesce(s.customer_email, t.customer_email)"),
}
MERGE_INSERT = {
    "account_id": "s.account_id",
    "customer_id": "s.customer_id",
    "status": "coalesce(s.status, 'open')",
    "credit_limit_minor": "s.credit_limit_minor",
    "available_minor": "s.credit_limit_minor - s.authorized_total_minor",
    "currency": "s.currency",
    "payments_authorized": "s.payments_authorized",
    "payments_declined": "s.payments_declined",
    "authorized_total_minor": "s.authorized_total_minor",
    "last_device_location": "s.last_device_location",
    "version": "s.version",
    "updated_at": "s.updated_at",
    "customer_name": "s.customer_name",
    "customer_email": "s.customer_email",
}


def python_fold(events: Iterable[EventEnvelope]) -> dict[tuple, dict[str, Any]]:
    """The oracle: dedup by event_id, apply each account's versions 1, 2, ... in order, stop at a gap."""
    seen: set[str] = set()
    by_account: dict[str, dict[int, EventEnvelope]] = defaultdict(dict)
    for e in events:
        if e.event_id in seen or e.event_type not in EVENT_TYPES:
            continue
        seen.add(e.event_id)
        by_account[e.aggregate_id].setdefault(e.aggregate_version, e)
    rows = {}
    for account_id, versions in by_account.items():
        state, updated_at, customer = AccountState(account_id), None, {}
        while state.version + 1 in versions:
            event = versions[state.version + 1]
            state = evolve(state, event)
            if event.event_type == "AccountOpened":  # not in the aggregate's state: decide never needs them
                customer = event.payload
            elif event.event_type == "SubjectForgotten":  # the state forgets the device's location itself
                customer = {}
            updated_at = parse_time(event.recorded_at, "recorded_at").replace(tzinfo=None)
        if state.version == 0:
            continue
        rows[(account_id,)] = {
            "account_id": account_id, "customer_id": state.customer_id, "status": state.status,
            "credit_limit_minor": state.credit_limit_minor, "available_minor": state.available_minor,
            "currency": state.currency, "payments_authorized": state.payments_authorized,
            "payments_declined": state.payments_declined, "authorized_total_minor": state.authorized_total_minor,
            "last_device_location": state.last_device_location, "version": state.version,
            "updated_at": updated_at,
            "customer_name": customer.get("customer_name"), "customer_email": customer.get("customer_email"),
        }
    return rows


MODEL = ReadModel(
    name="account_summary",
    key=("account_id",),
    event_types=EVENT_TYPES,
    personal_columns=("customer_name", "customer_email", "last_device_location"),
    subject_column="account_id",
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_update=MERGE_UPDATE,
    merge_insert=MERGE_INSERT,
    merge_strategy=CURRENT_STATE_BY_VERSION,
    python_fold=python_fold,
    description="one row per account: status, credit, counts and totals, last device location",
)
