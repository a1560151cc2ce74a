"""A data subject forgotten in the read models (issue 45, slice 4; docs/forgetting.md).

Once a subject's key is deleted, every reader reads their sealed values as null; the read models' tables, though,
hold the values the projection unsealed before. ``forget_in_read_models`` finds the subject's aggregates (those
whose archived events carry a token of the subject: a token names its subject, so no domain's rule is needed) and,
in every generation of every read model that names its ``subject_column``, nulls the model's personal columns
(``ReadModel.personal_columns``) in those aggregates' rows and purges them from the table's history
(``lakehouse.erasure``). Each table's outcome is an ``Erasure``: rows before and after, old files deleted or left.

``forget_in_dead_letters`` does the same for the projections' dead letters (``DEAD_LETTER_TABLE``: records that
were no valid event, kept with their exact bytes for triage): a dead letter keyed by one of the subject's aggregates
(an event's Kafka key is its aggregate id) or whose bytes hold a token of the subject loses its bytes
(``raw_value``, ``raw_value_base64``, ``raw_bytes``); its reason, topic, partition and offset stay.

Events written while sealing was off hold the values in plain text and no token names their subject: their
aggregates are found by their domain's subject field (``Domain.subject_field``: the account's ``customer_id``), and
``forget_in_archive`` nulls the plain values the archive holds (the events topic keeps them until its retention).

Tables in local folders and under a storage URI alike (``lakehouse.erasure``). Not covered here: the dead-letters
topic (a Kafka topic: its segments go by retention).
"""
from __future__ import annotations

from typing import Callable

import read_models
from event_store.personal_data import token_head
from event_store.sealing import personal_event_fields
from lakehouse.erasure import DEFAULT_GRACE_S, Erasure, erase
from lakehouse.settings import Settings
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog
from read_models.spec import ReadModel

__all__ = ["personal_columns_of", "holds_personal_values", "subject_aggregates", "forget_in_model", "values_in_model",
           "forget_in_archive", "forget_in_read_models", "forget_in_dead_letters", "DEAD_LETTER_BYTES"]

# The columns of a dead letter that hold the record's bytes (spark_apps.spark_projection.dead_letter_schema).
DEAD_LETTER_BYTES = ("raw_value", "raw_value_base64", "raw_bytes")


def personal_columns_of(model: ReadModel) -> tuple[str, ...]:
    """The columns of ``model`` that hold personal values: those it declares, and any column named as a personal
    field of the event types it folds (a column a model forgot to declare is still erased)."""
    fields = personal_event_fields()
    named = {name for event_type in model.event_types for name in fields.get(event_type, ())}
    return tuple(dict.fromkeys([*model.personal_columns, *(c for c in model.columns if c in named)]))


def _subject_rules(names: set[str]) -> list[tuple[str, str]]:
    """(aggregate type, column) of each registered domain whose events name their subject in a column the event
    table has (``Domain.subject_field``)."""
    from event_store.domains import DOMAINS

    return [(d.aggregate_type, d.subject_field) for d in DOMAINS.values() if d.subject_field in names]


def subject_aggregates(settings: Settings, subject: str) -> list[tuple[str, str]]:
    """(aggregate type, aggregate id) of every aggregate of ``subject``: those whose archived events carry a token
    of theirs, and those whose events name them in their domain's subject field (``Domain.subject_field``: the
    account's ``customer_id``), for events written with sealing off."""
    import duckdb
    from deltalake.exceptions import TableNotFoundError

    from event_store.sealing import personal_columns
    from lakehouse.storage import delta_table
    from lakehouse.tables import dataset

    try:
        archive = delta_table(settings.table_path(ARCHIVE_TABLE))
    except TableNotFoundError:
        return []
    names = set(archive.schema().to_arrow().names)
    columns = sorted(personal_columns() & names)
    rules = _subject_rules(names) if "aggregate_type" in names else []
    if not (columns or rules) or not archive.file_uris():
        return []
    head = token_head(subject)
    where = " OR ".join([f'starts_with("{c}", $head)' for c in columns]
                        + [f'(aggregate_type = \'{t}\' AND "{c}" = $subject)' for t, c in rules])
    params = ({"head": head} if columns else {}) | ({"subject": subject} if rules else {})
    with duckdb.connect() as con:  # the table's current version, local or under a storage URI
        con.register("archived_events", dataset(archive))
        rows = con.execute(f"SELECT DISTINCT aggregate_type, aggregate_id FROM archived_events WHERE {where} "
                           f"ORDER BY 1, 2", params).fetchall()
    return [(t, i) for t, i in rows]


def forget_in_archive(settings: Settings, aggregate_ids: list[str], reason: str, dry_run: bool = False,
                      grace_s: float = DEFAULT_GRACE_S, log: Callable[[str], None] = print) -> list[Erasure]:
    """Null the personal values the archive holds in plain text (events written with sealing off) in the events of
    ``aggregate_ids``, and purge them from its history -> its ``Erasure`` ([] when there is no archive, no personal
    column or no id). Sealed values are left: with the key gone they are unreadable, and a rebuild reads them as
    null all the same."""
    from event_store.personal_data import TOKEN_PREFIX
    from event_store.sealing import personal_columns
    from lakehouse.storage import delta_table
    from lakehouse.tables import TableNotFound

    path = settings.table_path(ARCHIVE_TABLE)
    if not aggregate_ids or not (path / "_delta_log").is_dir():
        return []
    names = set(delta_table(path).schema().to_arrow().names)
    columns = sorted(personal_columns() & names)
    if not columns:
        return []
    plain = " OR ".join(f'("{c}" IS NOT NULL AND NOT starts_with("{c}", \'{TOKEN_PREFIX}\'))' for c in columns)
    try:
        erased = erase(path, f'"aggregate_id" IN ({_sql_list(aggregate_ids)}) AND ({plain})', columns, reason,
                       dry_run=dry_run, grace_s=grace_s)
    except TableNotFound:
        return []
    log(f"forget: archive: {erased.line()}")
    return [erased]


def _sql_list(values) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def forget_in_dead_letters(settings: Settings, subject: str, aggregate_ids: list[str], reason: str,
                           dry_run: bool = False, grace_s: float = DEFAULT_GRACE_S,
                           log: Callable[[str], None] = print) -> list[Erasure]:
    """Null the bytes of the dead letters of ``subject`` (keyed by one of ``aggregate_ids``, or holding a token of
    the subject) and purge them from the table's history (module docstring) -> its ``Erasure`` ([] when there
    is no dead-letter table)."""
    from lakehouse.tables import TableNotFound

    head = token_head(subject).replace("'", "''")
    predicate = f"strpos(\"raw_value\", '{head}') > 0"
    if aggregate_ids:
        predicate = f"\"kafka_key\" IN ({_sql_list(aggregate_ids)}) OR {predicate}"
    try:
        erased = erase(settings.table_path(DEAD_LETTER_TABLE), predicate, DEAD_LETTER_BYTES, reason,
                       dry_run=dry_run, grace_s=grace_s)
    except TableNotFound:
        return []
    log(f"forget: dead letters: {erased.line()}")
    return [erased]


def forget_in_model(settings: Settings, model: ReadModel, aggregate_ids: list[str], reason: str,
                    dry_run: bool = False, grace_s: float = DEFAULT_GRACE_S,
                    log: Callable[[str], None] = print) -> list[Erasure]:
    """Null the personal columns of ``model`` in the rows of ``aggregate_ids`` in each of its generations, and purge
    them from each table's history -> each generation's ``Erasure`` ([] for a model with no personal column or
    subject column, or no ids)."""
    from lakehouse.tables import TableNotFound

    columns = personal_columns_of(model)
    if not columns or not model.subject_column or not aggregate_ids:
        return []
    listed = _sql_list(aggregate_ids)
    done = []
    for generation in Catalog(settings).generations(model.name):
        try:
            erased = erase(generation.table, f'"{model.subject_column}" IN ({listed})', columns, reason,
                           dry_run=dry_run, grace_s=grace_s)
        except TableNotFound:
            continue
        log(f"forget: {model.name} {generation.label}: {erased.line()}")
        done.append(erased)
    return done


def values_in_model(settings: Settings, model: ReadModel, aggregate_ids: list[str]) -> set[str]:
    """The text values ``forget_in_model`` would null in ``model``'s generations (the reports that quoted them go
    too: ``projection_core.forget_subject``)."""
    from lakehouse.erasure import values_held

    columns = personal_columns_of(model)
    if not columns or not model.subject_column or not aggregate_ids:
        return set()
    predicate = f'"{model.subject_column}" IN ({_sql_list(aggregate_ids)})'
    return set().union(*(values_held(g.table, predicate, columns) for g in Catalog(settings).generations(model.name)))


def holds_personal_values(model: ReadModel) -> bool:
    """Whether ``forget_in_model`` has anything to do in ``model``'s tables."""
    return bool(personal_columns_of(model)) and bool(model.subject_column)


def forget_in_read_models(settings: Settings, subject: str, reason: str, dry_run: bool = False,
                          grace_s: float = DEFAULT_GRACE_S, log: Callable[[str], None] = print) -> list[Erasure]:
    """Null ``subject``'s personal values in every generation of every read model and in the dead letters, and
    purge them from the tables' history (module docstring) -> each table's ``Erasure``, in order. Run again after a
    kill: it completes. Beside live writers, ``projection_core.forget_subject`` orders these steps after the
    projections' batches in flight and under each model's rebuild lock."""
    aggregates = subject_aggregates(settings, subject)
    ids = sorted({aggregate_id for _, aggregate_id in aggregates})
    log(f"forget: subject {subject!r}: {len(ids)} aggregate(s) of theirs in the archive (by their tokens or their "
        f"subject field)")
    letters = forget_in_dead_letters(settings, subject, ids, reason, dry_run=dry_run, grace_s=grace_s, log=log)
    done = []
    for model in read_models.select(None):
        done += forget_in_model(settings, model, ids, reason, dry_run=dry_run, grace_s=grace_s, log=log)
    archive = forget_in_archive(settings, ids, reason, dry_run=dry_run, grace_s=grace_s, log=log)
    return done + archive + letters
