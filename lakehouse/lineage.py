"""OpenLineage run events of eventlake's own jobs (issue 46, part 5): who read what and wrote what, and when.

A job (the command handler, a projection, a rebuild, ...) runs as OpenLineage *runs*: ``start`` emits a START
event naming the run's input and output datasets, ``complete`` or ``fail`` the run's end (a service killed -9 leaves
its START alone: the run never ended, which is what happened). Datasets are named as OpenLineage's naming spec
names them, so the events of Airflow's provider and of Spark's listener meet ours in one graph: a Kafka topic is
``kafka://<first bootstrap server>`` / ``<topic>``; a table at a local path is ``file`` / ``<absolute path>``; one
under a storage URI is ``<scheme>://<authority>`` / ``<path>`` (``s3a://`` is named ``s3://``, as Spark's listener
does).

Where events go (settings): ``lineage = "off"`` emits nothing; ``lineage_url`` empty (the default: no lineage
server is needed) appends one JSON event per line to ``<home>/lineage/events.jsonl`` (openlineage-python's file
transport); a URL sends them to that OpenLineage backend over HTTP (Marquez: ``http://host:5000``). Emitting never
stops a job: a failure is logged once and the job goes on.
"""
from __future__ import annotations

import dataclasses
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from lakehouse.settings import Settings, SettingsError

__all__ = ["Lineage", "LineageRun", "Dataset", "Assertion", "checked", "parent_from_id", "parent_id", "planned_run_id", "detector_run", "kafka_topic", "table",
           "database", "read_events", "events_file", "spark_events_file"]

PRODUCER = "https://github.com/eventlake/eventlake/lakehouse/lineage.py"
# How Spark's OpenLineage listener names an s3a:// location (the Hadoop scheme of S3): the same dataset.
_SCHEMES = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class Dataset:
    """An OpenLineage dataset: its namespace (where) and name (what); as a run's input that was checked (a read
    model's table under its suite), ``rows`` and the ``assertions`` checked on it: OpenLineage's data-quality
    facets (``checked``)."""
    namespace: str
    name: str
    rows: int | None = None
    assertions: tuple["Assertion", ...] = ()


@dataclass(frozen=True)
class Assertion:
    """One data-quality assertion on a dataset (an expectation of its suite): what was asserted (the expectation's
    type), on which column (None: the table), whether it held, and what was found when it did not."""
    assertion: str
    success: bool
    column: str | None = None
    actual: str | None = None


def checked(dataset: Dataset, rows: int, assertions: Iterable[Assertion]) -> Dataset:
    """``dataset`` as a check's input: with its row count and the assertions checked on it."""
    return Dataset(dataset.namespace, dataset.name, rows, tuple(assertions))


@dataclass(frozen=True)
class LineageRun:
    """A run started by ``Lineage.start``: its id, its job and its datasets (for its end event)."""
    run_id: str
    job: str
    inputs: tuple[Dataset, ...]
    outputs: tuple[Dataset, ...]
    parent: "LineageRun | None" = None
    namespace: str | None = None  # the job's namespace when not this process's (a parent from elsewhere)


def parent_from_id(parent_id: str) -> LineageRun:
    """The run an OpenLineage parent id names: ``<namespace>/<job>/<run id>`` (what Airflow's OpenLineage provider
    gives a task's children; the job's name may hold "/" too)."""
    namespace, _, rest = parent_id.partition("/")
    job, _, run_id = rest.rpartition("/")
    try:
        uuid.UUID(run_id)
    except ValueError:
        namespace = ""
    if not (namespace and job and run_id):
        raise SettingsError(f"setting lineage_parent={parent_id!r} (EVENTLAKE_LINEAGE_PARENT): expected "
                            f"<namespace>/<job>/<run id, a UUID>")
    return LineageRun(run_id, job, (), (), namespace=namespace)


def parent_id(settings: Settings, run: LineageRun) -> str:
    """``run`` as a parent id (``<namespace>/<job>/<run id>``, what ``parent_from_id`` reads): for the setting
    ``lineage_parent`` of what runs under it (a streaming app's Spark session, ``spark_lineage=all``)."""
    return f"{run.namespace or settings.lineage_namespace}/{run.job}/{run.run_id}"


def planned_run_id(parent_id: str, job: str) -> str:
    """The id of our run of ``job`` under the parent run ``parent_id`` (``<namespace>/<job>/<run id>``), known
    before the run starts and the same in every process that knows both: a job submitted to a cluster names it as
    its Spark application's parent on the submission's line, and the driver starts its run under it. One run of a
    job per parent run (an Airflow task's try)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"openlineage:{parent_id}/{job}"))


def kafka_topic(settings: Settings, topic: str) -> Dataset:
    """The dataset of a Kafka topic: namespace ``kafka://host:port`` of the first bootstrap server."""
    first = settings.bootstrap_servers.split(",")[0].strip()
    return Dataset(f"kafka://{first}", topic)


def table(where: str | Path) -> Dataset:
    """The dataset of a table (or any directory of data) at a local path or under a storage URI."""
    text = str(where)
    if "://" not in text:
        return Dataset("file", str(Path(text).expanduser().resolve()))
    parts = urlsplit(text)
    scheme = _SCHEMES.get(parts.scheme, parts.scheme)
    if scheme == "file":
        return Dataset("file", parts.path)
    return Dataset(f"{scheme}://{parts.netloc}", parts.path or "/")


def database(url: str, table_name: str) -> Dataset:
    """The dataset of a table in a SQL database at a SQLAlchemy URL (no password in it): PostgreSQL as
    OpenLineage names it (``postgres://host:port`` / ``database.schema.table``, schema ``public`` unless the table
    names one), SQLite by its file (``sqlite:///path`` / ``table``), others by host and database."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        return Dataset(f"sqlite:///{parts.path.lstrip('/')}", table_name)
    host = parts.hostname or "localhost"
    if scheme in ("postgresql", "postgres"):
        qualified = table_name if "." in table_name else f"public.{table_name}"
        return Dataset(f"postgres://{host}:{parts.port or 5432}", f"{parts.path.lstrip('/')}.{qualified}")
    return Dataset(f"{scheme}://{host}{f':{parts.port}' if parts.port else ''}",
                   f"{parts.path.lstrip('/')}.{table_name}".lstrip("."))


def events_file(settings: Settings) -> Path:
    """Where the file transport appends the events (``lineage_url`` empty)."""
    return settings.home / "lineage" / "events.jsonl"


def spark_events_file(settings: Settings, app_name: str) -> Path:
    """Where OpenLineage's Spark listener in the session ``app_name`` appends its events (``lineage_url`` empty):
    a file per application, as the listener and our emitter would otherwise append to one file at once."""
    return settings.home / "lineage" / f"spark-{app_name}.jsonl"


def read_events(path: Path) -> list[dict]:
    """The events appended to ``path`` by the file transport, oldest first (a line cut short by a kill is
    skipped)."""
    import json

    events = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


class Lineage:
    """The emitter of one process's runs (``for_settings``); does nothing when lineage is off."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        if settings.lineage not in ("on", "off"):
            raise SettingsError(f"setting lineage={settings.lineage!r} (EVENTLAKE_LINEAGE): expected on or off")
        self.settings = settings
        self.namespace = settings.lineage_namespace
        # The parent of every run started without one (an Airflow task's run).
        self.parent = parent_from_id(settings.lineage_parent) if settings.lineage_parent else None
        self.log = log
        self._client = None
        self._failed = False
        if settings.lineage == "on":
            self._client = self._make_client(settings)

    @staticmethod
    def _make_client(settings: Settings):
        from openlineage.client import OpenLineageClient

        if settings.lineage_url:
            from openlineage.client.transport.http import HttpConfig, HttpTransport

            return OpenLineageClient(transport=HttpTransport(HttpConfig(url=settings.lineage_url)))
        from openlineage.client.transport.file import FileConfig, FileTransport

        path = events_file(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        return OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=str(path), append=True)))

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def planned(self, job: str) -> LineageRun:
        """The run of ``job`` this process will start, its id known now (``start(..., run_id=)``): so that the
        Spark application it runs the job in is the run's child (``spark_apps.session.build_session``'s
        ``lineage_parent``). Under a parent run (``lineage_parent``): ``planned_run_id``, which a submitting
        process can name as well; otherwise a new id."""
        settings = self.settings
        run_id = planned_run_id(settings.lineage_parent, job) if settings.lineage_parent else str(uuid.uuid4())
        return LineageRun(run_id, job, (), (), self.parent, namespace=self.namespace)

    def start(self, job: str, inputs: Iterable[Dataset] = (), outputs: Iterable[Dataset] = (),
              parent: LineageRun | None = None, job_type: str = "SERVICE", run_id: str | None = None) -> LineageRun:
        """Emit the START of a new run of ``job`` (in this namespace) reading ``inputs`` and writing ``outputs``,
        a child of ``parent`` if given; ``job_type``: SERVICE (a long-running service), JOB, QUERY, ...;
        ``run_id``: its id when planned (``planned``) -> the run, for ``complete`` or ``fail``."""
        run = LineageRun(run_id or str(uuid.uuid4()), job, tuple(inputs), tuple(outputs), parent or self.parent)
        self._emit(run, "START", job_type=job_type)
        return run

    def complete(self, run: LineageRun, inputs: Iterable[Dataset] | None = None) -> None:
        """Emit the run's COMPLETE; ``inputs``: its inputs as they turned out (``checked``: what a check found)."""
        self._emit(run if inputs is None else dataclasses.replace(run, inputs=tuple(inputs)), "COMPLETE")

    def fail(self, run: LineageRun, error: BaseException | str) -> None:
        self._emit(run, "FAIL", error=error)

    @contextmanager
    def running(self, job: str, inputs: Iterable[Dataset] = (), outputs: Iterable[Dataset] = (),
                parent: LineageRun | None = None, job_type: str = "JOB",
                run_id: str | None = None) -> Iterator[LineageRun]:
        """A run of ``job`` around the block: START, then COMPLETE, or FAIL with the exception (re-raised)."""
        run = self.start(job, inputs, outputs, parent, job_type, run_id)
        try:
            yield run
        except BaseException as e:
            self.fail(run, e)
            raise
        self.complete(run)

    def _emit(self, run: LineageRun, state: str, job_type: str | None = None,
              error: BaseException | str | None = None) -> None:
        if self._client is None:
            return
        try:
            self._client.emit(self._event(run, state, job_type, error))
        except Exception as e:  # noqa: BLE001 -- lineage never stops a job
            if not self._failed:
                self._failed = True
                where = self.settings.lineage_url or events_file(self.settings)
                self.log(f"lineage: a {state} event of {run.job} could not be emitted to {where} "
                         f"({type(e).__name__}: {e}); the job goes on (later failures are not logged)")

    def _event(self, run: LineageRun, state: str, job_type: str | None, error: BaseException | str | None):
        from datetime import datetime, timezone

        from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
        from openlineage.client.facet_v2 import error_message_run, job_type_job, parent_run

        run_facets = {}
        if run.parent is not None:
            run_facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=run.parent.run_id),
                job=parent_run.Job(namespace=run.parent.namespace or self.namespace, name=run.parent.job))
        if error is not None:
            run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=str(error) or type(error).__name__, programmingLanguage="python")
        job_facets = {}
        if job_type is not None:
            job_facets["jobType"] = job_type_job.JobTypeJobFacet(
                processingType="STREAMING" if job_type == "SERVICE" else "BATCH", integration="EVENTLAKE",
                jobType=job_type)
        return RunEvent(
            eventType=getattr(RunState, state), eventTime=datetime.now(timezone.utc).isoformat(),
            run=Run(runId=run.run_id, facets=run_facets), job=Job(namespace=self.namespace, name=run.job,
                                                                  facets=job_facets),
            producer=PRODUCER,
            inputs=[InputDataset(namespace=d.namespace, name=d.name, inputFacets=_quality_facets(d))
                    for d in run.inputs],
            outputs=[OutputDataset(namespace=d.namespace, name=d.name) for d in run.outputs])

    @classmethod
    def for_settings(cls, settings: Settings, log: Callable[[str], None] = print) -> "Lineage":
        return cls(settings, log)


def _quality_facets(dataset: Dataset) -> dict:
    """OpenLineage's data-quality input facets of a checked dataset (``checked``): dataQualityMetrics (its rows)
    and dataQualityAssertions (each assertion, held or not); {} for any other."""
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dqa
    from openlineage.client.facet_v2 import data_quality_metrics_input_dataset as dqm

    facets = {}
    if dataset.rows is not None:
        facets["dataQualityMetrics"] = dqm.DataQualityMetricsInputDatasetFacet(columnMetrics={},
                                                                               rowCount=dataset.rows)
    if dataset.assertions:
        facets["dataQualityAssertions"] = dqa.DataQualityAssertionsDatasetFacet(assertions=[
            dqa.Assertion(assertion=a.assertion, success=a.success, column=a.column, actual=a.actual)
            for a in dataset.assertions])
    return facets


def detector_run(settings: Settings, job: str, until_caught_up: bool, log: Callable[[str], None] = print):
    """The run of a service that reads the events and answers with commands (a detector, the fraud policy),
    around its block: the events topic in, the commands topic out; a SERVICE, or a JOB until caught up."""
    return Lineage.for_settings(settings, log).running(
        job, [kafka_topic(settings, settings.events_topic)], [kafka_topic(settings, settings.commands_topic)],
        job_type="JOB" if until_caught_up else "SERVICE")
