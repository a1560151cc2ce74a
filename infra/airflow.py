"""A local Apache Airflow for eventlake's DAGs: metadata in SQLite under ``<home>/airflow``, DAGs from ``dags/``.

``environment`` is what every ``airflow`` command needs here (its home, the DAGs folder, no example DAGs, and
``EVENTLAKE_HOME`` so the tasks find the same tables); ``ensure_db`` migrates the metadata database once;
``run`` runs an ``airflow`` command with both (``eventlake airflow ...``). On a real deployment, point
Airflow's ``dags_folder`` at ``dags/`` and install this package on the workers instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lakehouse.settings import Settings
from lakehouse.errors import Unavailable

__all__ = ["DAGS_FOLDER", "AirflowError", "airflow_home", "environment", "ensure_db", "run"]

DAGS_FOLDER = Path(__file__).resolve().parents[1] / "dags"
_AIRFLOW = str(Path(sys.executable).parent / "airflow")


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
    return env


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
    """``airflow ARGS`` against eventlake's DAGs and its local metadata database; its exit code."""
    ensure_db(settings, log=log)
    return subprocess.call([_AIRFLOW, *args], env=environment(settings))
