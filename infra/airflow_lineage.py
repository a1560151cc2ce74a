"""Airflow's task runs in the same OpenLineage graph as eventlake's own runs (issue 46 part 5, docs/lineage.md).

Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``) emits a run per DAG run and per task
run. ``environment`` points it where ``lakehouse.lineage`` sends eventlake's runs (the same file under the home,
or the same backend; the same namespace), or turns it off with ``lineage=off``; an ``AIRFLOW__OPENLINEAGE__*``
value the environment gives wins. ``task_settings`` is what a DAG task that starts eventlake's own runs (a load,
a rebuild) loads its settings with: they carry the task's run as ``lineage_parent``, so each of our runs names
the Airflow task that started it as its parent. A submitted task (``SparkSubmitOperator``) passes the same id as
the ``airflow-job`` app's ``--lineage-parent`` (``PARENT_ID_TEMPLATE``).

Importing this module loads no Airflow.
"""
from __future__ import annotations

import json

from lakehouse.lineage import events_file
from lakehouse.settings import Settings

__all__ = ["PARENT_ID_TEMPLATE", "environment", "parent_id", "task_settings"]

# The running task's OpenLineage parent id, rendered by Airflow (empty where the provider's plugin is off).
PARENT_ID_TEMPLATE = ("{% if macros is defined and macros.OpenLineageProviderPlugin is defined %}"
                      "{{ macros.OpenLineageProviderPlugin.lineage_parent_id(task_instance) }}{% endif %}")


def environment(settings: Settings) -> dict[str, str]:
    """The ``AIRFLOW__OPENLINEAGE__*`` settings that send Airflow's runs where ours go (module docstring)."""
    if settings.lineage == "off":
        return {"AIRFLOW__OPENLINEAGE__DISABLED": "True"}
    if settings.lineage_url:
        transport = {"type": "http", "url": settings.lineage_url}
    else:
        path = events_file(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        transport = {"type": "file", "log_file_path": str(path), "append": True}
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": settings.lineage_namespace}


def parent_id(task_instance) -> str:
    """The OpenLineage parent id (``<namespace>/<dag_id>.<task_id>/<run id>``) of ``task_instance``'s run as
    Airflow's provider emits it; empty when the provider is absent or off (then our runs have no parent)."""
    try:
        from airflow.providers.openlineage import conf
        from airflow.providers.openlineage.plugins.macros import lineage_parent_id
    except ImportError:
        return ""
    if conf.is_disabled():
        return ""
    return lineage_parent_id(task_instance)


def task_settings(role: str = "reader") -> Settings:
    """The running task's settings (``Settings.load(role=role)``) with its run as ``lineage_parent``."""
    from airflow.sdk import get_current_context

    settings = Settings.load(role=role)
    if settings.lineage == "off":
        return settings
    return settings.replace(lineage_parent=parent_id(get_current_context()["ti"]))
