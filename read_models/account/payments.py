"""``payments``: one row per payment attempt, authorized or declined (an insert-once ledger).

A payment is identified within its account (the aggregate that decided it, which refuses a payment id it has
seen): the key is (account_id, payment_id), so two accounts that happen to use one payment id keep a row each
and the table always agrees with ``account_summary``'s counts.

The merchant's name, category code (MCC) and risk level are those of ``dim_merchant``'s version as of the
payment's time (``read_models.enrichment``: the same in every engine, the rebuild and the oracle); null where the
dimension did not know the merchant when the payment was projected (the backfill fills them in later)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from event_store.envelope import EventEnvelope, parse_time
from read_models.enrichment import MERCHANT_COLUMNS, MERCHANT_TABLE, MerchantHistory
from read_models.spec import INSERT_ONCE, ReadModel

__all__ = ["MODEL"]

EVENT_TYPES = ("PaymentAuthorized", "PaymentDeclined")


def _schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("payment_id", StringType(), False),
        StructField("account_id", StringType()),
        StructField("merchant_id", StringType()),
        StructField("amount_minor", LongType()),
        StructField("currency", StringType()),
        StructField("location", StringType()),
        StructField("merchant_country", StringType()),  # PaymentAuthorized v2; null for declined payments
        StructField("status", StringType()),
        StructField("decline_reason", StringType()),
        StructField("occurred_at", TimestampType()),
        StructField("event_id", StringType()),
        # dim_merchant as of occurred_at (issue 46): added at the end, nullable ("add columns freely")
        *(StructField(c, StringType()) for c in MERCHANT_COLUMNS.values()),
    ])


def _fold(events):
    from pyspark.sql import functions as F

    authorized = F.col("event_type") == "PaymentAuthorized"
    return events.select(
        "payment_id", F.col("aggregate_id").alias("account_id"), "merchant_id", "amount_minor", "currency",
        "location", F.when(authorized, F.col("merchant_country")).alias("merchant_country"),
        F.when(authorized, F.lit("authorized")).otherwise(F.lit("declined")).alias("status"),
        F.when(authorized, F.lit(None).cast("string")).otherwise(F.col("reason")).alias("decline_reason"),
        "occurred_at", "event_id", *MERCHANT_COLUMNS.values())


# The same fold in SQL, for the rebuild (``ReadModel.fold_sql``).
FOLD_SQL = """
SELECT payment_id, aggregate_id AS account_id, merchant_id, amount_minor, currency, location,
       CASE WHEN event_type = 'PaymentAuthorized' THEN merchant_country END AS merchant_country,
       CASE WHEN event_type = 'PaymentAuthorized' THEN 'authorized' ELSE 'declined' END AS status,
       CASE WHEN event_type = 'PaymentAuthorized' THEN NULL ELSE reason END AS decline_reason,
       occurred_at, event_id, merchant_name, merchant_category, merchant_risk
FROM events
"""


def python_fold(events: Iterable[EventEnvelope], reference: Mapping[str, list] | None = None
                ) -> dict[tuple, dict[str, Any]]:
    merchants = MerchantHistory((reference or {}).get(MERCHANT_TABLE, ()))
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e.event_type not in EVENT_TYPES or (e.aggregate_id, e.payload["payment_id"]) in rows:
            continue
        p = e.payload
        authorized = e.event_type == "PaymentAuthorized"
        at = parse_time(e.occurred_at, "occurred_at")
        rows[(e.aggregate_id, p["payment_id"])] = {
            "payment_id": p["payment_id"], "account_id": e.aggregate_id, "merchant_id": p["merchant_id"],
            "amount_minor": p["amount_minor"], "currency": p["currency"], "location": p["location"],
            "merchant_country": p.get("merchant_country") if authorized else None,
            "status": "authorized" if authorized else "declined",
            "decline_reason": None if authorized else p["reason"],
            "occurred_at": at.replace(tzinfo=None), "event_id": e.event_id,
            **merchants.attributes(p["merchant_id"], at),
        }
    return rows


MODEL = ReadModel(
    name="payments",
    key=("account_id", "payment_id"),
    event_types=EVENT_TYPES,
    personal_columns=("location",),
    subject_column="account_id",
    reference_tables=(MERCHANT_TABLE,),
    schema=_schema,
    fold=_fold,
    fold_sql=FOLD_SQL,
    merge_strategy=INSERT_ONCE,
    python_fold=python_fold,
    stats_columns=("payment_id", "account_id", "merchant_id", "occurred_at"),
    description="one row per payment attempt: amount, merchant (with its name, category and risk as of the "
                "payment), location, authorized or declined and why",
)
