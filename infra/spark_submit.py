"""The Spark apps packaged for a cluster, and the ``spark-submit`` line that runs one (``eventlake spark-submit``).

``package`` zips the layers the apps import (``lakehouse``, ``event_store``, ``read_models``, ``expectations``,
``spark_apps``: never the CLI, which they do not import) into ``<cache>/dist/eventlake-<version>.zip`` for
``--py-files``, and writes a two-line launcher per app (the primary resource spark-submit needs), so the code the
driver and the executors run is the zip's, whatever is installed where they run. The JVM packages are the jars
resolved once by ``eventlake setup`` (Delta, the Kafka source, the token provider), handed over with ``--jars``:
no Ivy resolution at submit time, and YARN or Kubernetes ship them to the containers.

``submit_command`` builds the line: the master and deploy mode, the zip, the jars, the driver's memory and JVM
options, and in cluster deploy mode (the driver runs in the cluster, not in this environment) every
``EVENTLAKE_*`` / ``KAFKA_BOOTSTRAP_SERVERS`` variable of this environment forwarded to the driver (YARN:
``spark.yarn.appMasterEnv.*``, Kubernetes: ``spark.kubernetes.driverEnv.*``) and to the executors
(``spark.executorEnv.*``). Printed lines show secrets (a name holding PASSWORD, SECRET or TOKEN) as ``***``.

The third-party Python packages the apps import (pyspark's own, orjson, msgspec, deltalake, great_expectations,
...) must be in the Python the cluster runs (``PYSPARK_PYTHON``): an image built from ``pyproject.toml`` and
``constraints.txt``, or a packed virtualenv shipped with ``--archives`` (docs/deployment.md, "Deployment").
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lakehouse.settings import PROJECT_ROOT, Settings
from lakehouse.errors import BadInput

__all__ = ["APPS", "PACKAGED", "SubmitError", "Package", "package", "package_paths", "resolved_jars", "submit_conf",
           "submit_command", "lineage_conf", "lineage_job", "JOB_APPS", "shown", "run"]

# App name (what `eventlake spark-submit` takes) -> the module whose main(argv) the launcher calls.
APPS = {
    "projection": "spark_apps.projection",
    "fraud-detector": "spark_apps.fraud_detector",
    "telemetry-detector": "spark_apps.telemetry_detector",
    "rebuild": "spark_apps.rebuild",
    "airflow-job": "spark_apps.airflow_jobs",  # a DAG task's Spark work (infra.airflow_spark)
}
# The apps that run batch jobs: OpenLineage's Spark listener reports their runs (``lineage_conf``), as it does the
# same jobs' sessions outside spark-submit (spark_apps.session.build_session(job=True)).
JOB_APPS = ("rebuild", "airflow-job")
# The repository's packages the apps import (the layers below the CLI; tests/unit/test_layering.py keeps them so).
PACKAGED = ("lakehouse", "event_store", "read_models", "projection_core", "expectations", "spark_apps",
            "python_engine")
DEPLOY_MODES = ("client", "cluster")
_FORWARDED = ("KAFKA_BOOTSTRAP_SERVERS",)
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN")


class SubmitError(BadInput, RuntimeError):
    """The app cannot be packaged or submitted as asked (an unknown app, jars not resolved yet, ...)."""


@dataclass(frozen=True)
class Package:
    zip_path: Path
    launchers: dict[str, Path]  # app -> its launcher script
    modules: int  # .py files in the zip


def _version() -> str:
    import tomllib

    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["version"]


def resolved_jars(settings: Settings) -> tuple[Path, ...]:
    """The JVM packages the apps need, as resolved by ``eventlake setup`` into the cache."""
    from spark_apps.session import TOKEN_PROVIDER

    ivy_jars = sorted((settings.cache_dir / "ivy" / "jars").glob("*.jar"))
    token = settings.cache_dir / "spark-jars" / f"{TOKEN_PROVIDER[1]}-{TOKEN_PROVIDER[2]}.jar"
    if not ivy_jars or not token.exists():
        raise SubmitError(f"the Spark packages are not resolved yet under {settings.cache_dir} (no Delta/Kafka jars "
                          f"in {settings.cache_dir / 'ivy' / 'jars'}); run `eventlake setup` once")
    return (*ivy_jars, token)


def package_paths(settings: Settings) -> Package:
    """Where ``package`` writes the zip and the launchers (nothing is written; ``modules`` is 0)."""
    dist = settings.cache_dir / "dist"
    return Package(dist / f"eventlake-{_version()}.zip",
                   {app: dist / f"run_{app.replace('-', '_')}.py" for app in APPS}, 0)


def package(settings: Settings) -> Package:
    """Zip the packaged layers and write one launcher per app under ``<cache>/dist`` (rewritten each time: it
    takes well under a second, and a stale zip would run old code)."""
    paths = package_paths(settings)
    zip_path = paths.zip_path
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    # Per process: two DAG tasks submitting at once each write their own, then one atomic replace each.
    partial = zip_path.with_suffix(f".zip.{os.getpid()}.partial")
    modules = 0
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in PACKAGED:
            for path in sorted((PROJECT_ROOT / name).rglob("*")):
                if "__pycache__" in path.parts or not path.is_file() or path.suffix in (".pyc", ".pyo"):
                    continue
                archive.write(path, path.relative_to(PROJECT_ROOT).as_posix())
                modules += path.suffix == ".py"
    partial.replace(zip_path)
    launchers = {}
    for app, module in APPS.items():
        launcher = paths.launchers[app]
        written = launcher.with_suffix(f".{os.getpid()}.partial")
        written.write_text(
            f'"""spark-submit launcher of eventlake\'s {app} (written by `eventlake spark-submit`)."""\n'
            f"import {module.rsplit('.', 1)[0]} as _code\n"
            f"from {module} import main\n\n"
            f'print(f"eventlake: {app}: code from {{_code.__file__}}", flush=True)\n'
            f"raise SystemExit(main())\n")
        written.replace(launcher)
        launchers[app] = launcher
    return Package(zip_path, launchers, modules)


def submit_command(settings: Settings, app: str, app_args: list[str] = (), *, master: str | None = None,
                   deploy_mode: str = "client", conf: dict[str, str] | None = None,
                   env: dict[str, str] | None = None, built: Package | None = None) -> list[str]:
    """The spark-submit argument list that runs ``app`` with ``app_args`` on ``master`` (default: the settings')."""
    if app not in APPS:
        raise SubmitError(f"unknown app {app!r}; the apps: {', '.join(APPS)}")
    if deploy_mode not in DEPLOY_MODES:
        raise SubmitError(f"--deploy-mode {deploy_mode!r}: expected one of {', '.join(DEPLOY_MODES)}")
    master = master or settings.spark_master
    if deploy_mode == "cluster" and master.startswith(("local", "spark://")):
        raise SubmitError(f"--deploy-mode cluster on {master}: Spark runs Python apps in cluster deploy mode only "
                          "on YARN and Kubernetes; use client mode here")
    env = dict(os.environ if env is None else env)
    built = built or package(settings)
    lineage_jars, lineage = lineage_conf(settings, app, app_args)
    jars = (*resolved_jars(settings), *lineage_jars)
    from spark_apps.session import JVM_OPTIONS
    import pyspark

    spark_submit = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
    settings_conf = submit_conf(settings, master, deploy_mode, env)
    settings_conf.update(lineage)
    settings_conf.update(conf or {})
    line = [str(spark_submit), "--master", master, "--deploy-mode", deploy_mode, "--name", f"eventlake-{app}",
            "--driver-memory", settings.spark_driver_memory, "--driver-java-options", JVM_OPTIONS,
            "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
            "--jars", ",".join(str(j) for j in jars), "--py-files", str(built.zip_path)]
    for key, value in settings_conf.items():
        line += ["--conf", f"{key}={value}"]
    return [*line, str(built.launchers[app]), *app_args]


def lineage_conf(settings: Settings, app: str, app_args: list[str] = (), log=print) -> tuple[tuple[Path, ...],
                                                                                           dict[str, str]]:
    """OpenLineage's Spark listener for a submitted batch job (``JOB_APPS``): its jar (for ``--jars``: a driver
    started by spark-submit has its classpath before the app's code runs) and its settings (``--conf``), as
    ``spark_apps.session.spark_lineage_conf`` gives them to a job's session outside spark-submit: the events to
    ``lineage_url`` or to a file of the application's own (named for the app and its leading arguments, e.g.
    ``spark-eventlake-airflow-job-rebuild-build-account_summary.jsonl``, on the driver's machine), the settings'
    ``lineage_parent`` as its run's parent. A streaming app (the projection, the detectors) only with
    ``spark_lineage=all``; nothing with ``spark_lineage=off`` or ``lineage=off``, or when the jar cannot be had
    (said: lineage never stops a job)."""
    from spark_apps.session import spark_lineage_conf

    leading = []
    for arg in app_args:
        if arg.startswith("-"):
            break
        leading.append(re.sub(r"[^A-Za-z0-9_.-]", "_", arg)[:80])
    parent = None
    streaming = app not in JOB_APPS
    wanted = settings.lineage_parent and (not streaming or settings.spark_lineage == "all")
    job = lineage_job(app, list(app_args)) if wanted else None
    if job:  # our run in the driver, under the same parent: the application's parent
        from lakehouse.lineage import LineageRun, planned_run_id

        parent = LineageRun(planned_run_id(settings.lineage_parent, job), job, (), (),
                            namespace=settings.lineage_namespace)
    conf = spark_lineage_conf(settings, "-".join(["eventlake", app, *leading]), log, parent, streaming=streaming)
    jars = tuple(Path(j) for j in conf.pop("spark.jars", "").split(",") if j)
    return jars, conf


def lineage_job(app: str, app_args: list[str]) -> str | None:
    """The OpenLineage job of the run a submitted app starts in its driver, when it starts one run
    (``Lineage.planned``): ``rebuild`` of one model, ``airflow-job`` rebuild-build, reprocess-range and backfill,
    the projection (the read models named before any option; none: all and the archive); None otherwise (several
    models, maintenance, the detectors: the application's parent is then ``lineage_parent``)."""
    args = []
    for arg in app_args:  # the leading positional arguments (options follow them)
        if arg.startswith("-"):
            break
        args.append(arg)
    if app == "projection":
        from spark_apps.projection import projection_job_for

        return projection_job_for(args)
    if app == "rebuild" and len(args) == 1:
        return f"rebuild.{args[0]}"
    if app == "airflow-job" and args:
        if args[0] == "rebuild-build" and len(args) > 1:
            return f"rebuild.{args[1]}"
        if args[0] == "reprocess-range" and len(args) > 1:
            return f"reprocess.{args[1]}"
        if args[0] == "backfill":
            return "backfill"
    return None


def submit_conf(settings: Settings, master: str, deploy_mode: str = "client",
                env: dict[str, str] | None = None) -> dict[str, str]:
    """The ``--conf`` settings of a submission to ``master`` from ``env`` (default: this process's environment):
    a YARN cluster's own Spark settings, the Python the executors run, and in cluster deploy mode the
    ``EVENTLAKE_*`` variables forwarded to the driver and the executors."""
    env = dict(os.environ if env is None else env)
    settings_conf: dict[str, str] = {}
    cluster_conf = Path(env.get("HADOOP_CONF_DIR") or "-") / "eventlake-spark.conf"
    if master == "yarn" and cluster_conf.is_file():  # the Spark settings `eventlake yarn up` wrote for its cluster
        for entry in cluster_conf.read_text().splitlines():
            key, sep, value = entry.partition("=")
            if sep and not key.lstrip().startswith("#"):
                settings_conf[key.strip()] = value.strip()
    python = env.get("PYSPARK_PYTHON")
    if python:
        settings_conf["spark.pyspark.python"] = python
    elif master.startswith(("local", "spark://")):
        # On this machine's own cluster the executors can run this interpreter (it has the third-party packages).
        settings_conf["spark.pyspark.python"] = sys.executable
    if deploy_mode == "cluster":
        driver_env = "spark.yarn.appMasterEnv" if master == "yarn" else "spark.kubernetes.driverEnv"
        for name in sorted(env):
            if name.startswith("EVENTLAKE_") or name in _FORWARDED:
                settings_conf[f"{driver_env}.{name}"] = env[name]
                settings_conf[f"spark.executorEnv.{name}"] = env[name]
    return settings_conf


def shown(line: list[str]) -> str:
    """The line as a shell command, secrets masked."""
    def mask(arg: str) -> str:
        key, sep, _ = arg.partition("=")
        return f"{key}=***" if sep and any(w in key.upper() for w in _SECRET_WORDS) else arg
    return " ".join(shlex.quote(mask(a)) for a in line)


def run(line: list[str], env: dict[str, str] | None = None) -> int:
    """Run the line in the foreground (its output is the app's) and return its exit code."""
    env = dict(os.environ if env is None else env)
    # spark-submit must not find this process's gateway (a CLI started from inside a Spark driver).
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    if line[line.index("--master") + 1] == "yarn":
        # Spark's YARN client puts this environment's PYTHONPATH ahead of --py-files in the containers' (the
        # application master's and the executors'): a checkout on it would win over the zip on a NodeManager
        # that has the same folder (eventlake's mini cluster runs here).
        env.pop("PYTHONPATH", None)
    return subprocess.call(line, env=env)
