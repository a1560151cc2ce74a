"""The Airflow Assets of eventlake (issue 46 part 3): one place for every Asset's name and URI, which DAG writes
which, and the watchers that start DAGs from outside (a landed merchants file, a dead letter in Kafka).

A table's Asset is named after the table and its URI is ``eventlake://warehouse/<table>``: the read models by
their logical name (a rebuild's new generation, once switched to, is an update of its read model's Asset), and
``dim_merchant``. The asset graph: ``merchants_landed`` -> ``load_merchants`` -> ``dim_merchant``;
``dim_merchant`` -> ``backfill_reference``; ``rebuild_read_model``, ``reprocess_windows``, ``maintenance``,
``forget_subject``, ``backfill_reference`` -> the read models -> ``check_read_models`` ->
``read_model_checks``; ``dead_letters`` (the Kafka topic, watched) -> ``triage_dead_letters`` ->
``dead_letter_report``.

Which read models a rebuild, a reprocess, maintenance or a forgetting writes is known only at run time (the form's
models; the models that had late events; the models not skipped; the models that held the subject's values), one per mapped task: those DAGs declare an
``AssetAlias`` as their outlet and each task adds the event of the one table it wrote, with the Delta version in
its extra (``record_written``), so no table is announced as updated that was not written. ``load_merchants``,
``check_read_models`` and ``triage_dead_letters`` write fixed Assets.

Importing this module loads no Airflow (the unit tests and the CLI read the names); the DAG files build the
Asset objects with the functions below at parse time.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Mapping

import read_models
from lakehouse.settings import Settings
from read_models.catalog import DIM_MERCHANT_TABLE
from read_models.spec import WINDOWED_SUM

__all__ = ["SCHEME", "LANDED_MERCHANTS", "READ_MODEL_CHECKS", "DEAD_LETTERS", "DEAD_LETTER_REPORT", "REBUILT",
           "REPROCESSED", "MAINTAINED", "FORGOTTEN", "BACKFILLED", "ENRICHED", "KAFKA_CONNECTION_ID", "READ_MODELS",
           "WINDOWED", "PERSONAL", "URIS", "GROUPS", "WRITES", "ALIASES", "warehouse_uri", "table_asset", "read_model_assets",
           "asset", "alias", "landed_merchants", "dead_letters", "record_written", "kafka_connection",
           "kafka_connection_env", "table_version"]

SCHEME = "eventlake"
# The Assets that are no warehouse table.
LANDED_MERCHANTS = "merchants_landed"  # the landing folder of merchants files (watched for the `_READY` flag)
READ_MODEL_CHECKS = "read_model_checks"  # the read models' validations (Great Expectations, Data Docs)
DEAD_LETTERS = "dead_letters"  # the dead-letters topic (watched: each new record is an asset event)
DEAD_LETTER_REPORT = "dead_letter_report"  # the triage report, beside the Data Docs
# The aliases of the DAGs whose tables are chosen at run time, one read model per mapped task.
REBUILT = "read_models_rebuilt"
REPROCESSED = "read_models_reprocessed"
MAINTAINED = "read_models_maintained"
FORGOTTEN = "read_models_forgotten"
BACKFILLED = "read_models_backfilled"
# The Airflow connection the dead-letters watcher reads Kafka through (its extra: librdkafka's configuration);
# ``kafka_connection_env`` gives it as the environment variable Airflow reads.
KAFKA_CONNECTION_ID = "eventlake_kafka"

READ_MODELS: tuple[str, ...] = tuple(read_models.REGISTRY)
WINDOWED: tuple[str, ...] = tuple(m.name for m in read_models.REGISTRY.values() if m.merge_strategy == WINDOWED_SUM)
# The read models that hold personal values of a data subject (what ``eventlake forget`` may change).
PERSONAL: tuple[str, ...] = tuple(m.name for m in read_models.REGISTRY.values()
                                  if m.personal_columns and m.subject_column)
# The read models that join reference data as of each event's time (what ``eventlake backfill`` may change).
ENRICHED: tuple[str, ...] = tuple(m.name for m in read_models.REGISTRY.values() if m.reference_tables)


def warehouse_uri(table: str) -> str:
    """The URI of a warehouse table's Asset: ``eventlake://warehouse/<table>``, whatever storage it is on."""
    return f"{SCHEME}://warehouse/{table}"


URIS: dict[str, str] = {
    **{name: warehouse_uri(name) for name in READ_MODELS},
    DIM_MERCHANT_TABLE: warehouse_uri(DIM_MERCHANT_TABLE),
    LANDED_MERCHANTS: f"{SCHEME}://landing/merchants",
    READ_MODEL_CHECKS: f"{SCHEME}://data_docs/read_model_checks",
    DEAD_LETTERS: f"{SCHEME}://kafka/dead-letters",
    DEAD_LETTER_REPORT: f"{SCHEME}://data_docs/dead_letters",
}
GROUPS: dict[str, str] = {**{name: "read_models" for name in READ_MODELS}, DIM_MERCHANT_TABLE: "reference_data",
                          LANDED_MERCHANTS: "reference_data", READ_MODEL_CHECKS: "data_quality",
                          DEAD_LETTERS: "dead_letters", DEAD_LETTER_REPORT: "dead_letters"}
# What each DAG writes (the Assets its runs may update), and the alias it announces them through, if any.
WRITES: dict[str, tuple[str, ...]] = {
    "load_merchants": (DIM_MERCHANT_TABLE,),
    "rebuild_read_model": READ_MODELS,
    "reprocess_windows": WINDOWED,
    "maintenance": READ_MODELS,
    "check_read_models": (READ_MODEL_CHECKS,),
    "triage_dead_letters": (DEAD_LETTER_REPORT,),
    "forget_subject": PERSONAL,
    "backfill_reference": ENRICHED,
}
ALIASES: dict[str, str] = {"rebuild_read_model": REBUILT, "reprocess_windows": REPROCESSED, "maintenance": MAINTAINED,
                           "forget_subject": FORGOTTEN, "backfill_reference": BACKFILLED}


@functools.cache
def asset(name: str):
    """The Asset ``name`` (a key of ``URIS``), without watchers; the same object for every DAG of a parse."""
    from airflow.sdk import Asset

    if name not in URIS:
        raise KeyError(f"no Asset named {name!r}; known: {', '.join(URIS)}")
    return Asset(name=name, uri=URIS[name], group=GROUPS[name])


def table_asset(table: str):
    """The Asset of a warehouse table (a read model or ``dim_merchant``)."""
    if not URIS.get(table, "").startswith(warehouse_uri("")):
        raise KeyError(f"{table!r} is no warehouse table with an Asset; known: "
                       f"{', '.join(n for n, u in URIS.items() if u.startswith(warehouse_uri('')))}")
    return asset(table)


def read_model_assets(names=None) -> list:
    """The Assets of the read models ``names`` (default: every registered one)."""
    return [table_asset(name) for name in (READ_MODELS if names is None else names)]


@functools.cache
def alias(name: str):
    """The AssetAlias ``name`` (one of ``ALIASES``' values)."""
    from airflow.sdk import AssetAlias

    if name not in ALIASES.values():
        raise KeyError(f"no AssetAlias named {name!r}; known: {', '.join(ALIASES.values())}")
    return AssetAlias(name=name, group="read_models")


def landed_merchants(settings: Settings):
    """``merchants_landed``, watched: the standard provider's DirectoryFileDeleteTrigger finds (and deletes) the
    flag file ``_READY`` a producer drops into the landing folder after its file, never the data."""
    from reference_data.loads import landing_folder

    return _watched_landing(str(landing_folder(settings)))


@functools.cache  # by folder: one object per parse (Settings cannot be a cache key)
def _watched_landing(folder: str):
    from airflow.providers.standard.triggers.file import DirectoryFileDeleteTrigger
    from airflow.sdk import Asset, AssetWatcher

    from reference_data.loads import LANDED_MARKER

    trigger = DirectoryFileDeleteTrigger(directory=folder, filename=LANDED_MARKER, poke_interval=10.0)
    return Asset(name=LANDED_MERCHANTS, uri=URIS[LANDED_MERCHANTS], group=GROUPS[LANDED_MERCHANTS],
                 watchers=[AssetWatcher(name="merchants_ready_flag", trigger=trigger)])


def dead_letters(settings: Settings):
    """``dead_letters``, watched: the Kafka provider's AwaitMessageTrigger reads the dead-letters topic in the
    Airflow triggerer (through the connection ``eventlake_kafka``) and each record it reads is an asset event,
    its extra a short summary (``expectations.dead_letters.dead_letter_signal``). The triage task reads the
    records themselves from where its last report stopped, so records the trigger folds into one run are
    all reported."""
    return _watched_dead_letters(settings.dead_letters_topic)


@functools.cache  # by topic: one object per parse
def _watched_dead_letters(topic: str):
    from airflow.providers.apache.kafka.triggers.await_message import AwaitMessageTrigger
    from airflow.sdk import Asset, AssetWatcher

    trigger = AwaitMessageTrigger(topics=[topic], kafka_config_id=KAFKA_CONNECTION_ID,
                                  apply_function="expectations.dead_letters.dead_letter_signal",
                                  poll_timeout=1, poll_interval=5)
    return Asset(name=DEAD_LETTERS, uri=URIS[DEAD_LETTERS], group=GROUPS[DEAD_LETTERS],
                 watchers=[AssetWatcher(name="dead_letters_topic", trigger=trigger)])


def record_written(context: Mapping[str, Any], dag_id: str, table: str, extra: Mapping[str, Any]) -> None:
    """Announce, from a running task of ``dag_id`` (whose outlet is its alias), that it wrote ``table``: one
    asset event on the table's Asset, ``extra`` (the Delta version(s) written, ...) as its extra."""
    if table not in WRITES[dag_id]:
        raise KeyError(f"{dag_id} does not write {table!r} (it writes {', '.join(WRITES[dag_id])})")
    context["outlet_events"][alias(ALIASES[dag_id])].add(table_asset(table), extra=dict(extra))


def kafka_connection(settings: Settings) -> dict:
    """The Airflow connection ``eventlake_kafka`` for ``settings``' cluster (as the reader role sees it): librdkafka's
    configuration in its extra, with the watcher's consumer group. It starts at the topic's end the first time:
    the triage's first report covers what came before."""
    from lakehouse.kafka_security import confluent_config

    config = {**confluent_config(settings.for_role("reader")),
              "group.id": settings.dead_letters_watch_group, "auto.offset.reset": "latest",
              "enable.auto.commit": False, "isolation.level": "read_committed"}
    return {"conn_type": "kafka", "extra": config}


def kafka_connection_env(settings: Settings) -> dict[str, str]:
    """``kafka_connection`` as the environment variable Airflow's processes read (``AIRFLOW_CONN_EVENTLAKE_KAFKA``)."""
    return {f"AIRFLOW_CONN_{KAFKA_CONNECTION_ID.upper()}": json.dumps(kafka_connection(settings))}


def table_version(settings: Settings, name: str, generation: int | None = None) -> dict:
    """The generation of read model ``name`` (default: the current one) and its table's Delta version, for an
    asset event's extra (None when the table cannot be read: the work it announces is done all the same)."""
    from lakehouse.storage import delta_table
    from read_models.catalog import Catalog

    catalog = Catalog(settings)
    found = catalog.current(name) if generation is None else catalog.generation(name, generation)
    try:
        version = delta_table(found.table).version()
    except Exception:  # noqa: BLE001 -- no table (yet), or storage away: the event says so instead of failing
        version = None
    return {"generation": found.number, "delta_version": version}
