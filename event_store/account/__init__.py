"""The account domain (card accounts, payments and fraud): the reference domain (docs/DESIGN.md).

``DOMAIN`` is what the registry (``event_store.domains``) knows of it: the aggregate, its schemas and upcasters.
The fraud rules (``event_store.account.fraud_rules``, pure, run by the Spark detector) and the fraud policy
(``event_store.account.policy``, a process reading the events topic) are the domain's too, but are not
imported here: the registry needs neither, and the policy uses Kafka.
"""
from __future__ import annotations

from event_store.account import schemas
from event_store.account.aggregate import (AGGREGATE_TYPE, DECLINE_REASONS, AccountState, CommandRejected, NewEvent,
                                           decide, decode_state, encode_state, evolve, evolve_fields,
                                           payment_id_known, payment_id_probe, payment_ids_split, quarantined, subject_of)
from event_store.account.upcasters import SPARK_UPCASTERS, UPCASTERS
from event_store.domain import Domain

__all__ = ["DOMAIN", "AGGREGATE_TYPE", "AccountState", "CommandRejected", "NewEvent", "decide", "evolve",
           "evolve_fields", "quarantined", "DECLINE_REASONS"]

DOMAIN = Domain(
    aggregate_type=AGGREGATE_TYPE,
    initial=AccountState,
    decide=decide,
    evolve=evolve,
    evolve_fields=evolve_fields,
    commands=schemas.COMMANDS,
    events=schemas.EVENTS,
    event_schema_versions=schemas.EVENT_SCHEMA_VERSIONS,
    upcasters=UPCASTERS,
    spark_upcasters=SPARK_UPCASTERS,
    # The columns of the event tables as they were created (strings, then integers); append new fields.
    payload_column_order=("customer_id", "currency", "payment_id", "merchant_id", "location", "reason", "rule",
                          "evidence", "merchant_country", "record", "resolved_by", "credit_limit_minor",
                          "amount_minor", "customer_name", "customer_email"),
    encode_state=encode_state,
    decode_state=decode_state,
    quarantined=quarantined,
    quarantine_resolved_event="QuarantineResolved",
    index_split=payment_ids_split,
    index_probe=payment_id_probe,
    index_known=payment_id_known,
    subject=subject_of,
    subject_field="customer_id",
    forget_command="ForgetSubject",
)
