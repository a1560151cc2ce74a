"""A local Apache Airflow for eventlake's DAGs: metadata in SQLite under ``<home>/airflow``, DAGs from ``dags/``.

``environment`` is what every ``airflow`` command needs here (its home, the DAGs folder, no example DAGs, and
``EVENTLAKE_HOME`` so the tasks find the same tables); ``ensure_db`` migrates the metadata database once;
``run`` runs an ``airflow`` command with both (``eventlake airflow ...``), in a process session of its own whose
every process it stops when it is asked to stop (``supervise``). On a real deployment, point Airflow's
``dags_folder`` at ``dags/`` and install this package on the workers instead.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from lakehouse.settings import Settings
from lakehouse.errors import Unavailable
from lakehouse.processes import signal_group, terminate
from infra import airflow_lineage
from infra.airflow_assets import kafka_connection_env
from infra.airflow_spark import spark_connection_env

__all__ = ["DAGS_FOLDER", "STOP_WITHIN_S", "AirflowError", "airflow_home", "environment", "machine_sized",
           "ensure_db", "run", "supervise"]

DAGS_FOLDER = Path(__file__).resolve().parents[1] / "dags"
_AIRFLOW = str(Path(sys.executable).parent / "airflow")
# How long Airflow's processes have to end after they were asked to, before they are killed.
STOP_WITHIN_S = 30.0


class AirflowError(Unavailable, RuntimeError):
    """The local Airflow could not be set up."""


def airflow_home(settings: Settings) -> Path:
    return settings.home / "airflow"


def environment(settings: Settings, base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(AIRFLOW_HOME=str(airflow_home(settings)), AIRFLOW__CORE__DAGS_FOLDER=str(DAGS_FOLDER),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", EVENTLAKE_HOME=str(settings.home),
               # Spark workers must run this environment's Python (with its packages), not the system one.
               PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
               # `airflow standalone` starts its components as `airflow ...` found on the PATH.
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    for key, value in machine_sized().items():
        env.setdefault(key, value)  # a value the environment gives wins
    # The Kafka connection the dead-letters watcher reads through (infra.airflow_assets), unless one is given.
    for key, value in kafka_connection_env(settings).items():
        env.setdefault(key, value)
    # The Spark master the DAGs submit their Spark work to (infra.airflow_spark), when the settings name a cluster.
    for key, value in spark_connection_env(settings).items():
        env.setdefault(key, value)
    # Airflow's OpenLineage provider, sending its task runs where eventlake's own runs go (infra.airflow_lineage).
    for key, value in airflow_lineage.environment(settings).items():
        env.setdefault(key, value)
    return env


def machine_sized(cpus: int | None = None) -> dict[str, str]:
    """Airflow's sizes for this machine, where Airflow's defaults suit a large one: its LocalExecutor starts
    ``parallelism`` worker processes at once (32 by default), each task of ours may start a Spark session. One
    task at a time per core (at least 2), as many per DAG run. Set ``AIRFLOW__CORE__PARALLELISM`` (and
    ``AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG``) in the environment to choose otherwise."""
    tasks = str(max(2, cpus or os.cpu_count() or 2))
    return {"AIRFLOW__CORE__PARALLELISM": tasks, "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": tasks}


def ensure_db(settings: Settings, log=print) -> None:
    """Create or upgrade Airflow's metadata database (SQLite under the Airflow home); quiet when current."""
    home = airflow_home(settings)
    marker = home / ".migrated"
    if marker.exists():
        return
    home.mkdir(parents=True, exist_ok=True)
    log(f"airflow: migrating the metadata database in {home} (once) ...")
    proc = subprocess.run([_AIRFLOW, "db", "migrate"], env=environment(settings), capture_output=True, text=True)
    if proc.returncode != 0:
        raise AirflowError(f"airflow db migrate failed (AIRFLOW_HOME={home}):\n{proc.stdout[-2000:]}"
                           f"{proc.stderr[-2000:]}")
    marker.write_text("ok\n")


def run(settings: Settings, args: list[str], log=print) -> int:
    """``airflow ARGS`` against eventlake's DAGs and its local metadata database (``supervise``d); its exit code."""
    ensure_db(settings, log=log)
    return supervise([_AIRFLOW, *args], environment(settings), log=log)


def supervise(argv: list[str], env: dict[str, str], stop_within_s: float = STOP_WITHIN_S, log=print) -> int:
    """Run ``argv`` in a process session of its own and return its exit code; when it ends, or when this process
    gets SIGTERM or SIGINT (passed on to every process of that session: ``airflow standalone``'s scheduler, API
    server, DAG processor, triggerer and executor workers, not only the command), wait until the whole session
    has ended, killing what is left after ``stop_within_s``. So stopping the wrapper stops Airflow (a killed
    wrapper, SIGKILL, cannot pass anything on)."""
    process = subprocess.Popen(argv, env=env, start_new_session=True)
    asked: list[int] = []

    def pass_on(signum, _frame):
        asked.append(signum)
        signal_group(process.pid, signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:  # a SIGINT between handlers: passed on above
                continue
        if asked:
            log(f"airflow: stopped ({signal.Signals(asked[0]).name}); waiting for its processes to end")
        # What the command left in its session (its children): SIGTERM, SIGKILL after ``stop_within_s``.
        if terminate(process.pid, stop_within_s, whole_group=True):
            log(f"airflow: processes still running {stop_within_s:g} s after they were asked to stop: killed")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code

