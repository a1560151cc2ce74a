"""Spark work of the DAGs on a cluster (issue 46 part 4): where the Airflow connection ``eventlake_spark`` names a
Spark master, a DAG's Spark step is the Spark provider's ``SparkSubmitOperator`` running the project's packaged
app ``airflow-job`` (``spark_apps.airflow_jobs``, what ``eventlake spark-submit airflow-job`` runs); without it,
the step stays a task that starts Spark in the Airflow worker.

The choice is made when the DAG file is parsed (``cluster_master``: the connection from the environment or
Airflow's metadata database; a connection added later counts from the next parse). The operator packages the
code when it runs (``infra.spark_submit.package``: the zip for ``--py-files`` and the app's launcher), hands over
the jars ``eventlake setup`` resolved (``--jars``) and the project's Spark settings (``submit_conf``: the Python
the executors run, the JVM options). In client deploy mode the driver's output is the task's log. The local
Airflow (``infra.airflow.environment``) gets the connection from the settings' ``spark_master`` when that is no
``local[...]`` master (``spark_connection_env``; a connection the environment gives wins).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

from lakehouse.settings import Settings
from infra import airflow_lineage

__all__ = ["SPARK_CONNECTION_ID", "APP", "cluster_master", "master_of", "spark_connection", "spark_connection_env",
           "JOB_ARGUMENTS", "job_arguments", "mapped_value", "submit_arguments", "submit_job"]

SPARK_CONNECTION_ID = "eventlake_spark"
APP = "airflow-job"  # infra.spark_submit.APPS: spark_apps.airflow_jobs
_MODEL = "<model>"
# Each DAG's submitted job (``airflow-job``'s subcommand and its options, templated as Airflow renders them when
# the task runs); ``<model>`` stands for the read model of the task's map index.
JOB_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "rebuild_read_model": ("rebuild-build", _MODEL),
    "reprocess_windows": ("reprocess-range", _MODEL, "--from", "{{ data_interval_start.isoformat() }}",
                          "--to", "{{ data_interval_end.isoformat() }}"),
    "maintenance": ("maintain", _MODEL, "--retention-hours", "{{ params.retention_hours }}"),
    "backfill_reference": ("backfill", _MODEL),  # <model>: the reference table (dim_merchant)
}


def spark_connection(settings: Settings) -> dict | None:
    """The Airflow connection ``eventlake_spark`` for ``settings``' Spark master, or None for a local master."""
    master = settings.spark_master
    if master.startswith("local"):
        return None
    return {"conn_type": "spark", "host": master}


def spark_connection_env(settings: Settings) -> dict[str, str]:
    """``spark_connection`` as the environment variable Airflow reads (nothing for a local master)."""
    found = spark_connection(settings)
    return {f"AIRFLOW_CONN_{SPARK_CONNECTION_ID.upper()}": json.dumps(found)} if found else {}


def cluster_master(conn_id: str = SPARK_CONNECTION_ID) -> str | None:
    """The Spark master the connection ``conn_id`` names, or None when there is none (or it names a local
    master): the DAGs' Spark steps then run in the worker."""
    from airflow.sdk import Connection

    try:
        conn = Connection.get(conn_id)
    except Exception:  # noqa: BLE001 -- not defined (AirflowNotFoundException), or no metadata store to ask
        return None
    return master_of(conn.conn_type, conn.host, conn.port)


def master_of(conn_type: str, host: str | None, port: int | None) -> str | None:
    """The master URL of a Spark connection, read as the provider's hook reads it (a UI connection holds the
    whole URL in its host; one from a URI has the scheme as its type); None for none or a local master."""
    host = host or ""
    if not host:
        return None
    master = host if conn_type == "spark" and ("://" in host or not port) else f"{conn_type}://{host}"
    master = f"{master}:{port}" if port else master
    return None if master.startswith("local") else master


@functools.cache  # one class, whatever the number of tasks
def _operator_class():
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    class EventlakeSparkSubmitOperator(SparkSubmitOperator):
        """The provider's operator, with the project's packaging done when it runs: the zip and launcher
        rewritten from this checkout, the jars ``eventlake setup`` resolved, OpenLineage's Spark listener with
        this task's run as the application's parent (``spark_submit.lineage_conf``)."""

        def execute(self, context) -> Any:
            from infra import spark_submit

            settings = airflow_lineage.task_settings()  # this task's run: the Spark application's parent
            built = spark_submit.package(settings)
            self.application = str(built.launchers[APP])
            self.py_files = str(built.zip_path)
            lineage_jars, lineage = spark_submit.lineage_conf(settings, APP, list(self.application_args or []),
                                                              log=self.log.info)
            self.jars = ",".join(str(j) for j in (*spark_submit.resolved_jars(settings), *lineage_jars))
            self.conf = {**(self.conf or {}), **lineage}
            self.log.info("eventlake: %s: code %s (%d modules), launcher %s", APP, built.zip_path, built.modules,
                          self.application)
            return super().execute(context)

    EventlakeSparkSubmitOperator.__module__ = __name__
    EventlakeSparkSubmitOperator.__qualname__ = "EventlakeSparkSubmitOperator"
    globals()["EventlakeSparkSubmitOperator"] = EventlakeSparkSubmitOperator  # importable by its name
    return EventlakeSparkSubmitOperator


def submit_arguments(settings: Settings, master: str, job_args: list[str], name: str,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``SparkSubmitOperator`` arguments that run ``airflow-job JOB_ARGS`` on ``master`` through the
    connection: the app's launcher and the zip where the packaging writes them, the project's Spark settings."""
    from infra import spark_submit
    from spark_apps.session import JVM_OPTIONS

    paths = spark_submit.package_paths(settings)  # where the operator's packaging writes them when it runs
    conf = {"spark.driver.extraJavaOptions": JVM_OPTIONS, "spark.executor.extraJavaOptions": JVM_OPTIONS,
            **spark_submit.submit_conf(settings, master, "client", dict(os.environ if env is None else env))}
    return {"conn_id": SPARK_CONNECTION_ID, "application": str(paths.launchers[APP]),
            "py_files": str(paths.zip_path), "application_args": list(job_args), "conf": conf, "name": name,
            "driver_memory": settings.spark_driver_memory}


def job_arguments(dag_id: str, model: str) -> list[str]:
    """The ``airflow-job`` arguments of DAG ``dag_id``'s submitted task for read model ``model`` (a template, e.g.
    ``mapped_value``'s), with the DAG run that reads its result (``--dag``, ``--run-id``)."""
    if dag_id not in JOB_ARGUMENTS:
        raise KeyError(f"{dag_id} submits no job; the DAGs that do: {', '.join(JOB_ARGUMENTS)}")
    return [model if a == _MODEL else a for a in JOB_ARGUMENTS[dag_id]] + [
        "--dag", dag_id, "--run-id", "{{ run_id }}", "--lineage-parent", airflow_lineage.PARENT_ID_TEMPLATE]


def mapped_value(values) -> str:
    """A template that renders, in a task of a task group mapped over ``values`` (a list of strings fixed at parse
    time), the value of its map index: what a submitted job of the group is given (``submit_job``'s templated
    arguments), as the group's taskflow tasks are given the value itself."""
    values = [str(v) for v in values]
    return "{{ " + json.dumps(values) + "[ti.map_index] }}"


def submit_job(task_id: str, job_args: list[str], *, settings: Settings, master: str, name: str, **kwargs):
    """A ``SparkSubmitOperator`` that runs ``airflow-job JOB_ARGS`` (templated) on the connection's master."""
    return _operator_class()(task_id=task_id, **submit_arguments(settings, master, job_args, name), **kwargs)
