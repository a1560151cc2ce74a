"""Building the Spark session: Delta and the Kafka source through ``spark.jars.packages``.

The packages are resolved once into the project's Ivy cache (``<cache>/ivy``) and read from it
afterwards, so later runs need no network. Under ``spark-submit`` the launcher's own settings
(master, ``--packages``) are used as they are.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from lakehouse.lineage import LineageRun, parent_from_id, spark_events_file
from lakehouse.settings import Settings, SettingsError

__all__ = ["SPARK_PACKAGES", "OPENLINEAGE_SPARK", "build_session", "delta_table_exists", "extra_jars", "maven_jar",
           "spark_lineage_conf", "spark_metrics_conf", "SPARK_LINEAGE_CHOICES"]

SPARK_PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
)
# The Kafka source depends on spark-token-provider-kafka-0-10 of the same version, but Maven Central as
# reachable here has no 4.1+ build of it; 4.0.0 is there. It is excluded from the Ivy resolution and the
# 4.0.0 jar is fetched with Maven into the cache and added through spark.jars.
TOKEN_PROVIDER = ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.0.0")
SPARK_PACKAGE_EXCLUDES = (f"{TOKEN_PROVIDER[0]}:{TOKEN_PROVIDER[1]}",)


# OpenLineage's Spark listener (settings.spark_lineage), fetched like the token provider when first needed.
OPENLINEAGE_SPARK = ("io.openlineage", "openlineage-spark_2.13", "1.53.0")
OPENLINEAGE_LISTENER = "io.openlineage.spark.agent.OpenLineageSparkListener"


def extra_jars(settings: Settings, log=print) -> list[Path]:
    """Jars added with spark.jars (fetched once with Maven into <cache>/spark-jars)."""
    return [maven_jar(settings, TOKEN_PROVIDER, log)]


def maven_jar(settings: Settings, coordinates: tuple[str, str, str], log=print) -> Path:
    """The jar of ``coordinates`` (group, artifact, version) in <cache>/spark-jars, fetched once with Maven."""
    group, artifact, version = coordinates
    folder = settings.cache_dir / "spark-jars"
    jar = folder / f"{artifact}-{version}.jar"
    if not jar.exists():
        if shutil.which("mvn") is None:
            raise RuntimeError(f"Maven (mvn) is needed once to fetch {group}:{artifact}:{version}")
        log(f"spark: fetching {group}:{artifact}:{version} into {folder} (once) ...")
        cmd = ["mvn", "-q", "-B", "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
               f"-Dartifact={group}:{artifact}:{version}", f"-DoutputDirectory={folder}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not jar.exists():
            raise RuntimeError(f"fetching {artifact} failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return jar


SPARK_LINEAGE_CHOICES = ("jobs", "all", "off")


def spark_lineage_conf(settings: Settings, app_name: str, log=print, parent: LineageRun | None = None,
                       streaming: bool = False) -> dict[str, str]:
    """The settings that put OpenLineage's Spark listener in a batch job's session (``spark_lineage = "jobs"`` or
    ``"all"``, and ``lineage = "on"``) or, ``streaming``, a streaming app's (the projection, the detectors: only
    with ``"all"``): its jar, its transport (``lineage_url``, or the file <home>/lineage/spark-<app>.jsonl: one
    writer per file), the namespace, and its application run's parent: ``parent`` (our run of the job the
    application runs, ``Lineage.planned``), else ``lineage_parent``. {} when off, or when the jar cannot be had
    (said once: lineage never stops a job)."""
    if settings.spark_lineage not in SPARK_LINEAGE_CHOICES:
        raise SettingsError(f"setting spark_lineage={settings.spark_lineage!r} (EVENTLAKE_SPARK_LINEAGE): expected "
                            f"{', '.join(SPARK_LINEAGE_CHOICES[:-1])} or {SPARK_LINEAGE_CHOICES[-1]}")
    if settings.lineage != "on" or settings.spark_lineage == "off" or (streaming and settings.spark_lineage != "all"):
        return {}
    try:
        jar = maven_jar(settings, OPENLINEAGE_SPARK, log)
    except RuntimeError as e:
        log(f"spark: {app_name}: no OpenLineage events from Spark ({e})")
        return {}
    conf = {"spark.jars": str(jar), "spark.extraListeners": OPENLINEAGE_LISTENER,
            "spark.openlineage.namespace": settings.lineage_namespace}
    if settings.lineage_url:
        conf.update({"spark.openlineage.transport.type": "http",
                     "spark.openlineage.transport.url": settings.lineage_url})
    else:
        events = spark_events_file(settings, app_name)
        events.parent.mkdir(parents=True, exist_ok=True)
        conf.update({"spark.openlineage.transport.type": "file", "spark.openlineage.transport.location": str(events)})
    if parent is None and settings.lineage_parent:
        parent = parent_from_id(settings.lineage_parent)
    if parent is not None:
        conf.update({"spark.openlineage.parentJobNamespace": parent.namespace or settings.lineage_namespace,
                     "spark.openlineage.parentJobName": parent.job, "spark.openlineage.parentRunId": parent.run_id})
    return conf


_APPENDED = ("spark.jars", "spark.sql.extensions")  # lists: extra_conf adds to them

# Options of every Spark JVM (driver and executors). HotSpot never compiles a method of more than 8,000 bytes of
# bytecode by default; the event parser's whole-stage generated code holds one of ~15,000 (the checks of
# spark_apps.events.check_records), which then ran interpreted: parsing and checking a batch took ~1.7x as long
# (bench/parse_cost.py, side by side in one run: --compare-jit).
JVM_OPTIONS = "-XX:-DontCompileHugeMethods"


def build_session(settings: Settings, app_name: str = "eventlake", log=print, extra_conf: dict | None = None,
                  job: bool = False, lineage_parent: LineageRun | None = None, streaming: bool = False):
    """The Spark session for this process (created on first call, reused afterwards). ``extra_conf``: more
    settings for a new session (``spark.jars`` and ``spark.sql.extensions`` are added to, not replaced). ``job``:
    the session runs a batch job (a rebuild, a reprocess, maintenance, a backfill), whose Spark runs OpenLineage's
    listener reports (``spark_lineage_conf``, with ``lineage_parent`` as the application's parent: our run of the
    job; under spark-submit its jar and settings are on the submission's command line:
    ``infra.spark_submit.lineage_conf``). ``streaming``: a streaming app's session, which has the listener only
    with ``spark_lineage = "all"``."""
    # Workers must run this interpreter: it has the project's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    lineage = (spark_lineage_conf(settings, app_name, log, lineage_parent, streaming=streaming)
               if (job or streaming) and not under_spark_submit else {})
    extra_conf = {**lineage, **(extra_conf or {}), "spark.jars": ",".join(
        filter(None, [lineage.get("spark.jars"), (extra_conf or {}).get("spark.jars")]))}
    ivy = settings.cache_dir / "ivy"
    resolved = None
    if not under_spark_submit:
        # On a local master, the packages Ivy resolved before (listed by ``_record_resolved``) are put on the
        # class path as they are: Ivy's resolution, offline from its cache, costs every JVM a second or more.
        resolved = resolved_packages(ivy) if settings.spark_master.startswith("local") else None
        if resolved is None:
            if not (ivy / "jars").exists():
                log(f"spark: resolving {', '.join(SPARK_PACKAGES)} from Maven Central into {ivy} (once) ...")
            builder = (builder.config("spark.jars.packages", ",".join(SPARK_PACKAGES))
                       .config("spark.jars.excludes", ",".join(SPARK_PACKAGE_EXCLUDES)))
        builder = (builder.master(settings.spark_master)
                   .config("spark.jars", ",".join([*(str(j) for j in resolved or ()),
                                                    *(str(j) for j in extra_jars(settings, log)),
                                                    *filter(None, [(extra_conf or {}).get("spark.jars")])]))
                   .config("spark.jars.ivy", str(ivy))
                   .config("spark.driver.memory", settings.spark_driver_memory)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   # No UI is served, yet Spark keeps the plans and metrics of the last 1,000 queries, jobs
                   # and stages for it in the driver's heap: a long-running service needs only a few.
                   .config("spark.sql.ui.retainedExecutions", "50")
                   .config("spark.ui.retainedJobs", "100")
                   .config("spark.ui.retainedStages", "100")
                   .config("spark.sql.streaming.ui.retainedQueries", "20"))
    builder = (builder
               .config("spark.sql.extensions", ",".join(["io.delta.sql.DeltaSparkSessionExtension", *filter(
                   None, [(extra_conf or {}).get("spark.sql.extensions")])]))
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
               # Delta's VACUUM lists a table's folders in a job of this many tasks (Spark's default: 10,000):
               # 3 minutes to vacuum a small table on 2 cores, 10 s with the shuffle's parallelism.
               .config("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                       str(settings.spark_shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               # Parquet timestamps as INT64 microseconds, not Spark's default INT96 (nanoseconds as pyarrow
               # and delta-rs read them): every reader then handles the whole range the event schemas allow
               # (1900-01-01 up to 9999-01-01), where INT96 read as nanoseconds overflows past 2262.
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.databricks.delta.snapshotPartitions", "2")
               # Auto compaction (Delta's post-commit hook): a table that collects small files from streaming
               # commits is compacted by its writer once it has this many, not only by the maintenance DAG.
               .config("spark.databricks.delta.autoCompact.enabled", str(settings.auto_compact_min_files > 0).lower())
               .config("spark.databricks.delta.autoCompact.minNumFiles", str(max(settings.auto_compact_min_files, 1)))
               # A projection batch is cached once and read by every read model; compressing the cache cost
               # as much as parsing the batch's JSON (bench/projection.py).
               .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
               # A read model's fold groups a batch by key with aggregates whose buffers are strings or sets;
               # Spark's object hash aggregation would switch to sorting the whole batch after 128 keys.
               .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "200000")
               # Joins whose shuffled side fits in memory per partition hash it instead of sorting both sides.
               .config("spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold", "64MB")
               .config("spark.sql.warehouse.dir", str(settings.home / "spark-warehouse"))
               .config("spark.driver.extraJavaOptions", f"{JVM_OPTIONS} -Dderby.system.home={settings.home / 'derby'}")
               .config("spark.executor.extraJavaOptions", JVM_OPTIONS))
    for key, value in spark_metrics_conf(settings).items():
        builder = builder.config(key, value)
    for key, value in (extra_conf or {}).items():
        if key not in _APPENDED:
            builder = builder.config(key, value)
    # The JVM's own output (Ivy resolution, log4j warnings) goes to a log file, not the user's terminal:
    # the launched JVM inherits whatever file descriptor 2 is while it starts.
    log_file = settings.home / "logs" / f"{app_name}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as jvm_log:
        saved = os.dup(2)
        os.dup2(jvm_log.fileno(), 2)
        try:
            spark = builder.getOrCreate()
        except Exception as e:
            tail = log_file.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Spark did not start ({e.__class__.__name__}); the end of {log_file}:\n{tail}") from e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    spark.sparkContext.setLogLevel("WARN")
    if not under_spark_submit and resolved is None and settings.spark_master.startswith("local"):
        _record_resolved(spark, ivy)
    if not under_spark_submit and not settings.spark_master.startswith("local"):
        _ship_packages_to_executors(spark, settings.cache_dir / "ivy" / "jars")
    log(f"spark: {spark.version} session {app_name} ({spark.sparkContext.master}); JVM log {log_file}")
    if settings.spark_metrics == "on":
        _register_spark_metrics(settings, spark, app_name, log)
    return spark


def spark_metrics_conf(settings: Settings) -> dict[str, str]:
    """With ``spark_metrics = "on"``: Spark's UI on ``spark_ui_port``, serving every metric of Spark's metrics
    system (driver, executors, streaming queries) in Prometheus' format at ``/metrics/prometheus``
    (PrometheusServlet), named under the ``eventlake`` namespace rather than each run's application id."""
    from lakehouse.metrics import SPARK_METRICS_PATH

    if settings.spark_metrics not in ("on", "off"):
        raise SettingsError(f"setting spark_metrics={settings.spark_metrics!r} (EVENTLAKE_SPARK_METRICS): expected "
                            f"on or off")
    if settings.spark_metrics == "off":
        return {}
    return {"spark.ui.enabled": "true", "spark.ui.port": str(settings.spark_ui_port),
            "spark.ui.prometheus.enabled": "true", "spark.sql.streaming.metricsEnabled": "true",
            "spark.metrics.namespace": "eventlake",
            "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
            "spark.metrics.conf.*.sink.prometheusServlet.path": SPARK_METRICS_PATH}


def _register_spark_metrics(settings: Settings, spark, app_name: str, log) -> None:
    """Register the session's PrometheusServlet under the home (``lakehouse.metrics.register``) as service
    ``spark-<app name>``; the registration goes when the process exits."""
    import atexit
    import urllib.parse

    from lakehouse.metrics import SPARK_METRICS_PATH, register

    url = spark.sparkContext.uiWebUrl
    if not url:
        log(f"spark: {app_name}: spark_metrics is on but Spark serves no UI here; its metrics are not served")
        return
    port = urllib.parse.urlparse(url).port
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "127.0.0.1", "localhost") else settings.metrics_host
    registration = register(settings, f"spark-{app_name}", f"{host}:{port}", SPARK_METRICS_PATH)
    atexit.register(registration.unlink, missing_ok=True)
    log(f"spark: {app_name}: Spark's own metrics at http://{host}:{port}{SPARK_METRICS_PATH}")


def delta_table_exists(spark, path) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, str(path))


# What Ivy resolved SPARK_PACKAGES to, under the Ivy folder: {"packages", "excludes", "jars": [file names]}.
RESOLVED_FILE = "eventlake-resolved.json"


def resolved_packages(ivy: Path) -> list[Path] | None:
    """The jars Ivy resolved ``SPARK_PACKAGES`` to in an earlier session (``_record_resolved``), or None: none
    recorded, recorded for other packages (an upgrade), or a jar gone from the cache."""
    import json

    try:
        recorded = json.loads((ivy / RESOLVED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or (recorded.get("packages"), recorded.get("excludes")) != (
            list(SPARK_PACKAGES), list(SPARK_PACKAGE_EXCLUDES)):
        return None
    jars = [ivy / "jars" / str(name) for name in recorded.get("jars") or ()]
    return jars if jars and all(j.is_file() for j in jars) else None


def _record_resolved(spark, ivy: Path) -> None:
    """Record the jars of ``ivy``/jars that this session's Ivy resolution put on its class path (PySpark's
    launcher lists them in ``spark.repl.local.jars``), for ``resolved_packages`` (one atomic replace: sessions may
    start at once)."""
    import json
    from urllib.parse import urlsplit

    folder = (ivy / "jars").resolve()
    names = []
    conf = spark.sparkContext.getConf()
    for entry in (conf.get("spark.repl.local.jars", "") or conf.get("spark.jars", "") or "").split(","):
        path = Path(urlsplit(entry).path if "://" in entry or entry.startswith("file:") else entry)
        if path.suffix == ".jar" and path.parent.resolve() == folder:
            names.append(path.name)
    if not names:
        return
    target = ivy / RESOLVED_FILE
    partial = target.with_name(f"{RESOLVED_FILE}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps({"packages": list(SPARK_PACKAGES), "excludes": list(SPARK_PACKAGE_EXCLUDES),
                                       "jars": sorted(names)}))
        os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)  # a later session records it


def _ship_packages_to_executors(spark, resolved: Path) -> None:
    """Executors on a cluster need the resolved packages (Delta, the Kafka source) on their class path. With
    ``spark.jars`` set too (the token provider), Spark's launcher hands them to executors as plain files, not jars
    (a ClassNotFoundException of the Kafka source's partitions on a standalone cluster): add each as a jar."""
    for jar in sorted(resolved.glob("*.jar")):
        spark.sparkContext._jsc.addJar(str(jar))
