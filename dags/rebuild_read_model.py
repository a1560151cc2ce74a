"""Rebuild read models from the event archive into new generations, check them, and switch readers (issue 9).

Trigger it with the form: **read_models** (one or more; each is rebuilt independently, in its own group of
tasks) and **dry_run** (build and check, then drop the new generation instead of switching). Per read model:

- `rebuild_model.build`: fold the archive into a new generation (its log shows each step with the events done
  and an ETA), catch it up from Kafka, mark it ready so the live projection writes it too, catch up again;
- `rebuild_model.check`: its Great Expectations suite and the reconciliation with the log, on the new
  generation; a failure names the reasons and drops the generation: readers stay on the current one;
- `rebuild_model.switch`: makes it current in one catalog commit (a compare-and-set); skipped on a dry run.

**On a Spark cluster.** Where the Airflow connection `eventlake_spark` names a Spark master, `build` is the Spark
provider's `SparkSubmitOperator` submitting the project's packaged `airflow-job` app (the same steps, the driver's
output in the task's log), and `rebuild_model.built` reads what it built for `check`; without it, `build` starts
Spark in the worker (infra/airflow_spark.py).

The run owns the model's rebuild lock from `build` to `switch`: a second rebuild of the same model (another
run, or `eventlake rebuild` in a shell) is refused with who holds it. What a failed or killed run left is
abandoned by the next rebuild. Roll back with `eventlake rollback NAME`. The same steps run from a shell:
`eventlake rebuild NAME... [--dry-run]`. Tables are found through the workers' environment (`EVENTLAKE_HOME`,
`EVENTLAKE_CONFIG`), as for every eventlake command.

**Assets.** A switch is an update of the read model's Asset (`eventlake://warehouse/<read model>`): `switch`
announces it through the alias `read_models_rebuilt` (which models a run rebuilds is the form's choice), its extra
the new generation, the one before and its table's Delta version; `check_read_models` runs on it. A dry run or a
failed model announces nothing.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task, task_group

import read_models  # names only: Spark, Kafka and the tables are touched by the tasks
from infra import airflow_assets as assets
from infra import airflow_spark
from lakehouse.settings import Settings

_NAMES = list(read_models.REGISTRY)
_DAG_ID = "rebuild_read_model"
# A Spark master named by the connection `eventlake_spark`: `build` is submitted to it; None: it runs in the worker.
_MASTER = airflow_spark.cluster_master()


def _owner() -> str:
    from projection_core.rebuild_lock import airflow_owner

    context = get_current_context()
    return airflow_owner(context["dag"].dag_id, context["run_id"])


def _by() -> str:
    context = get_current_context()
    return f"airflow {context['dag'].dag_id}/{context['run_id']}"


@dag(dag_id="rebuild_read_model", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     doc_md=__doc__, tags=["eventlake", "rebuild"],
     params={"read_models": Param(_NAMES[:1], type="array", title="Read models to rebuild",
                                  items={"type": "string", "enum": _NAMES}, examples=_NAMES, minItems=1,
                                  uniqueItems=True, description="each gets a new generation, checked and switched to"),
             "dry_run": Param(False, type="boolean", title="Dry run",
                              description="build and check the new generation, then drop it (readers stay)")})
def rebuild_read_model():
    @task
    def choose_read_models() -> list[str]:
        """The read models of the form (validated by the Param's schema), in order, each once."""
        names = list(dict.fromkeys(get_current_context()["params"]["read_models"]))
        print(f"rebuild_read_model: rebuilding {', '.join(names)}"
              + (" (dry run: nothing is switched)" if get_current_context()["params"]["dry_run"] else ""))
        return names

    @task_group(group_id="rebuild_model")
    def rebuild_model(name: str):
        @task(map_index_template="{{ read_model }}", retries=0)
        def build(name: str) -> dict:
            """Fold + catch-ups + mark ready, under the model's lock (kept for this run's next task)."""
            from airflow.sdk.exceptions import AirflowFailException

            from infra.airflow_lineage import task_settings
            from projection_core.rebuild_errors import RebuildError
            from spark_apps.airflow_jobs import rebuild_build

            context = get_current_context()
            context["read_model"] = name
            try:  # the rebuild's lineage run a child of this task's
                return rebuild_build(task_settings(), name, context["dag"].dag_id, context["run_id"], log=_log)
            except RebuildError as e:
                raise AirflowFailException(str(e)) from None

        @task(map_index_template="{{ read_model }}", retries=0)
        def check(built: dict) -> dict:
            """The suite and the reconciliation on the new generation; a failure drops it (readers stay)."""
            from airflow.sdk.exceptions import AirflowFailException

            from lakehouse.settings import Settings
            from projection_core.rebuild_errors import RebuildError, RebuildFailed
            from projection_core.rebuild_lock import RebuildLock
            from spark_apps.rebuild import check_generation

            name = built["name"]
            get_current_context()["read_model"] = name
            settings = Settings.load(role="reader")
            lock = RebuildLock(settings, name, log=_log, owner=_owner(), resume=True)
            try:
                lock.acquire()
            except RebuildError as e:
                raise AirflowFailException(str(e)) from None
            try:
                check_generation(settings, name, built["generation"], built["previous"], _by(), _log)
            except RebuildFailed as e:
                lock.release()
                raise AirflowFailException("\n".join([str(e), *e.lines])) from None
            except RebuildError as e:
                lock.release()
                raise AirflowFailException(str(e)) from None
            except BaseException:
                lock.release()
                raise
            lock.hand_over()
            return built

        @task(map_index_template="{{ read_model }}", retries=0, outlets=[assets.alias(assets.REBUILT)])
        def switch(checked: dict) -> dict:
            """Make the checked generation current (compare-and-set); on a dry run drop it and skip."""
            from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

            from lakehouse.settings import Settings
            from projection_core.rebuild_errors import RebuildError
            from projection_core.rebuild_lock import RebuildLock
            from spark_apps.rebuild import switch_generation

            context = get_current_context()
            name = checked["name"]
            context["read_model"] = name
            settings = Settings.load(role="reader")
            dry_run = bool(context["params"]["dry_run"])
            try:
                with RebuildLock(settings, name, log=_log, owner=_owner(), resume=True):
                    switched = switch_generation(settings, name, checked["generation"], checked["previous"], _by(),
                                                 "rebuild_read_model DAG: passed its checks", dry_run, _log)
            except RebuildError as e:
                raise AirflowFailException(str(e)) from None
            if not switched:
                raise AirflowSkipException(f"dry run: generation {checked['generation']} of {name} passed its "
                                           f"checks and was dropped; readers stay on {checked['previous']}")
            written = assets.table_version(settings, name, checked["generation"])
            assets.record_written(context, "rebuild_read_model", name, {**written, "previous": checked["previous"]})
            return {**checked, **written, "switched": True}

        @task(map_index_template="{{ read_model }}", retries=0)
        def built(name: str) -> dict:
            """What the submitted build wrote for the run's next task (a submitted job returns no XCom)."""
            from airflow.sdk.exceptions import AirflowFailException

            from spark_apps.airflow_jobs import read_result

            context = get_current_context()
            context["read_model"] = name
            try:
                return read_result(Settings.load(role="reader"), _DAG_ID, context["run_id"], name)
            except FileNotFoundError:
                raise AirflowFailException(f"{name}: the submitted build wrote no result; see the build task's "
                                           "log") from None

        if _MASTER is None:
            switch(check(build(name)))
        else:
            # This mapped group's read model, as the form's list names it (rendered when the task runs).
            model = "{{ ti.xcom_pull(task_ids='choose_read_models')[ti.map_index] }}"
            submitted = airflow_spark.submit_job(
                "build", airflow_spark.job_arguments(_DAG_ID, model), settings=Settings.load(role="reader"),
                master=_MASTER, name="eventlake-rebuild", retries=0)
            done = built(name)
            submitted >> done
            switch(check(done))

    rebuild_model.expand(name=choose_read_models())


def _log(line: str) -> None:
    print(line, flush=True)


rebuild_read_model()
