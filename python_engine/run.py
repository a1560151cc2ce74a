"""The Python engine's run loop: its two queries, each a checkpoint, a reader and batches, run in step; a batch off
the common path handed to the Spark engine. The engine as a whole: ``python_engine`` (package docstring)."""
from __future__ import annotations

import time
from typing import Callable, Mapping

from event_store.collector import CollectorPaced
from event_store.sealing import Unsealer
from lakehouse.settings import Settings
from projection_core.checkpoint import Checkpoint
from projection_core.errors import ProjectionError, ProjectionRun
from projection_core.figures import READ_MODELS_QUERY, QueryFigures
from projection_core.plan import ProjectionPlan
from projection_core.reference import ReferenceTables
from python_engine import parsing
from python_engine.batches import archive_batch, read_models_batch
from python_engine.key_index import INDEX_FOLDER, KeyIndex
from python_engine.compaction import Compaction
from python_engine.delta_writes import Batch
from python_engine.errors import HandOver
from python_engine.parsing import ParseWorker
from python_engine.reader import Reader
from python_engine.tables import Tables
from read_models.catalog import ARCHIVE_TABLE, Generation
from read_models.spec import ReadModel
from spark_apps.event_rows import Records
from python_engine.memory import large_blocks_off_the_heap

__all__ = ["PythonProjection", "Query", "supports", "MAX_BATCH_RECORDS"]

# Records per batch at most (or fewer, EVENTLAKE_MAX_OFFSETS_PER_TRIGGER): a batch's records are held as Python
# objects, so a projection far behind catches up in batches of bounded memory.
MAX_BATCH_RECORDS = 100_000


def supports(settings: Settings) -> str:
    """'' when this engine can run here, else why not."""
    for what, where in (("warehouse", settings.warehouse), ("checkpoints", settings.checkpoints)):
        if "://" in str(where) and not str(where).startswith("file://"):
            return f"the {what} is not a local folder ({where}); run the Spark engine (--engine spark)"
    return ""


class Query(QueryFigures):
    """One of the projection's queries (the read models' or the archive's): its checkpoint, reader and batches; its
    figures (``QueryFigures``: batches, records, seconds in all and by step, the last commit's time, the records each
    partition holds past this reader, from librdkafka's last fetch: no round trip) are served as metrics."""

    def __init__(self, engine: "PythonProjection", name: str, checkpoint, process):
        super().__init__()
        self.engine, self.name, self.process = engine, name, process
        settings = engine.settings
        self.checkpoint = Checkpoint(checkpoint, settings.events_topic, settings.spark_shuffle_partitions)
        self.app_id = ProjectionPlan.app_id(checkpoint, name)
        self.reader = Reader(settings, name, log=engine.log)
        self.partitions: list[int] = []
        self.batch_id = 0

    def resume(self, starting_offsets: Mapping[int, int] | None = None) -> None:
        """Position the reader after the last committed batch; an uncommitted planned batch is run first, with
        exactly its planned offsets (as Spark does after a crash)."""
        self.partitions = self.reader.partitions()
        committed, planned = self.checkpoint.last_committed(), self.checkpoint.last_planned()
        if committed is None and planned is None:
            starts = {p: (starting_offsets or {}).get(p, -2) for p in self.partitions}
            starts = {p: self.reader.earliest(p) if o < 0 else o for p, o in starts.items()}
            self.checkpoint.start(starts)
            self.batch_id = 0
        elif planned is not None and (committed is None or planned > committed):
            if planned - 1 >= 0 and self.checkpoint.planned(planned - 1):
                starts = self.checkpoint.ends(planned - 1)
            else:
                starts = self.checkpoint.initial()
            ends = self.checkpoint.ends(planned)
            self.engine.log(f"{self.name}: batch {planned} was planned but not committed; running it again")
            self.reader.seek({p: starts.get(p, 0) for p in ends})
            records = Records()
            while any(self.reader.next.get(p, 0) < e and p not in self.reader.at_end for p, e in ends.items()):
                more = self.reader.read(max(1, sum(e - starts.get(p, 0) for p, e in ends.items())), 1.0)
                records.rows += [r for r in more.rows if r[1] < ends[r[0]]]
            self.batch_id = planned
            self._run(records, ends)
            starts = ends
        else:
            starts = self.checkpoint.ends(committed)
            self.batch_id = committed + 1
        starts.update({p: self.reader.earliest(p) for p in self.partitions if p not in starts})
        self.reader.seek(starts)

    def step(self, limit: int, wait_s: float, until: Mapping[int, int] | None = None) -> int:
        """One batch of what has arrived (if anything; with ``until``, before those offsets): -> its records."""
        records = self.reader.read(limit, wait_s, until)
        if not records.rows:
            return 0
        self.checkpoint.plan(self.batch_id, records.ends)
        self._run(records, records.ends)
        return len(records.rows)

    def _run(self, records: Records, ends: dict[int, int]) -> None:
        started = time.perf_counter()
        steps: dict[str, float] = {}
        batch = Batch(self.name, self.app_id, self.batch_id, steps, self.engine.delta_tables, self.engine.settle)
        try:
            outcomes = self.process(self, records, batch)
        except HandOver as reason:
            self.engine.delta_tables.clear()  # loaded anew after what Spark writes (and whatever failed)
            self.engine.hand_over(self, str(reason))
            return
        except BaseException:
            self.engine.delta_tables.clear()
            raise
        self.checkpoint.commit(self.batch_id)
        if outcomes:
            self.add_outcomes(**outcomes)
        self.engine.compact(batch.written, steps, batch.windowed, batch.merged)
        self.engine.cluster(batch.to_cluster, steps)
        self.rows += len(records.rows)
        self.batches += 1
        self.batch_seconds += time.perf_counter() - started
        for step, t in steps.items():
            self.step_seconds[step] = self.step_seconds.get(step, 0.0) + t
        self.last_commit_at = time.time()
        parts = "; ".join(f"{step} {t:.2f}s" for step, t in steps.items() if t >= 0.005)
        self.engine.log(f"{self.name}: batch {self.batch_id} done in {time.perf_counter() - started:.2f}s "
                        f"({len(records.rows)} records{'; ' + parts if parts else ''})")
        self.batch_id += 1


class PythonProjection:
    """The projection (``spark_apps.spark_projection.Projection``'s queries, checkpoints and tables) run in this process
    on its common path, handing other batches to the Spark query (module docstring)."""

    def __init__(self, settings: Settings, models: list[ReadModel] | None = None,
                 log: Callable[[str], None] = print, archive: bool | None = None,
                 generations: Mapping[str, Generation] | None = None, checkpoint=None,
                 starting_offsets: dict[int, int] | None = None, spark_session: Callable[[], object] | None = None):
        why = supports(settings)
        if why:
            raise ProjectionError(f"projection (engine python): {why}")
        self.settings, self.log = settings, log
        large_blocks_off_the_heap()
        self.plan = ProjectionPlan(settings, models, archive=archive, generations=generations,
                                   checkpoint=checkpoint, log=log)
        self.tables = Tables(self.plan)
        self.models, self.archive = self.plan.models, self.plan.archive
        self.starting_offsets = starting_offsets
        self._spark_session = spark_session
        self.handed_over = 0
        self.stop_requested = None
        self.shared: tuple | None = None  # (span, event rows) of the read models' last batch, for the archive's
        # table -> the engine's index of its keys (and heads) on disk (python_engine.key_index)
        self.known: dict[str, KeyIndex] = {}
        self.compaction = Compaction(log, self.known)  # the small files of the tables it writes
        self.delta_tables: dict = {}  # table -> its DeltaTable, brought up to date by each batch (Batch.table)
        self.limit = settings.max_offsets_per_trigger  # records per batch at most (Spark's maxOffsetsPerTrigger)
        self.queries: list[Query] = []
        self.parser = ParseWorker(log)  # a second process parsing large batches with this one
        # Personal data back in clear for the read models (event_store.sealing; its key store under the home).
        self.unsealer = Unsealer(settings)
        # The reference tables folds join as of each event's time (dim_merchant), read again when they change.
        self.reference = ReferenceTables(settings)

    def key_index(self, path, columns, heads: bool = False) -> KeyIndex:
        """The index on disk of the keys (hashes of ``columns``) and, with ``heads``, the aggregates' heads of the
        table at ``path``, under the read models' checkpoint."""
        key = str(path)
        if key not in self.known:
            self.known[key] = KeyIndex(self.plan.checkpoint / INDEX_FOLDER, key, columns, heads=heads, log=self.log)
        return self.known[key]

    # -- Spark for what is not the common path ---------------------------------------------------------------
    def hand_over(self, query: Query, reason: str) -> None:
        """Spark runs the planned batch again, then the rest of the log until caught up; this query goes on after."""
        from spark_apps.session import build_session
        from spark_apps.spark_projection import Projection

        self.handed_over += 1
        self.log(f"{query.name}: batch {query.batch_id} goes to the Spark engine: {reason}")
        self.wait_for_compaction()
        spark = self._spark_session() if self._spark_session else build_session(
            self.settings, app_name="eventlake-projection", log=self.log)
        models = self.models if query.name == self.plan.name else []
        spark_projection = Projection(spark, self.settings, models, log=self.log,
                                      archive=query.name != self.plan.name,
                                      generations=self.plan.pinned, checkpoint=query.checkpoint.path,
                                      starting_offsets=self.starting_offsets)
        run = spark_projection.run_until_caught_up(max_offsets_per_trigger=self.limit)
        if query.name == self.plan.name:  # what the Spark engine's batches did with their events, in this query's figures
            for figures in spark_projection.figures.query_figures(READ_MODELS_QUERY):
                query.add_outcomes(figures.events, figures.held, figures.newest_event_at)
        self.log(f"{query.name}: the Spark engine ran {run.batches} batch(es), {run.input_rows} records; "
                 f"this engine goes on")
        self._with_broker(query.resume)

    # -- small files (python_engine.compaction) --------------------------------------------------------------
    def compact(self, written: set[str], steps: dict[str, float], windowed: set[str] = frozenset(),
                merged: set[str] = frozenset()) -> None:
        """The tables a batch wrote, compacted on their turns (``Compaction.compact``)."""
        self.compaction.compact(written, steps, windowed, merged)

    def settle(self, path: str) -> bool:
        return self.compaction.settle(path)

    def cluster(self, paths: set[str], steps: dict[str, float]) -> None:
        self.compaction.cluster(paths, steps)

    def expire_logs(self, path: str, table=None) -> None:
        self.compaction.expire_logs(path, table)

    def wait_for_compaction(self) -> None:
        self.compaction.wait_for_compaction()

    # -- the loop -------------------------------------------------------------------------------------------
    def start(self) -> None:
        from event_store import kafka_log

        kafka_log.ensure_topics(self.settings, log=self.log)
        self.tables.ensure_tables()
        if self.models:
            self.queries.append(Query(self, self.plan.name, self.plan.checkpoint, read_models_batch))
        if self.archive:
            self.queries.append(Query(self, f"projection-{ARCHIVE_TABLE}", self.plan.archive_checkpoint,
                                       archive_batch))
        if not self.queries:
            raise ValueError("nothing to project: no read models and no archive")
        for query in self.queries:
            self._with_broker(lambda: query.resume(self.starting_offsets if query.name == self.plan.name else None))
            self.log(f"projection: {query.name} started from {self.settings.events_topic} at "
                     f"{self.settings.bootstrap_servers} (engine python; batch {query.batch_id}; checkpoint "
                     f"{query.checkpoint.path})")
        try:
            behind = self.queries[0].reader.backlog()
        except Exception:  # noqa: BLE001 -- no answer now: the first large batch starts the second parser
            behind = 0
        if behind >= parsing.PARALLEL_PARSE_MIN:  # catching up: the second parser gets ready meanwhile
            self.parser.prepare()

    def _with_broker(self, step: Callable[[], None]) -> None:
        """Run ``step`` (positioning a reader: it asks the broker for partitions and offsets); while no broker
        answers, wait and try again (a stop request ends the wait)."""
        from confluent_kafka import KafkaException

        said = False
        while True:
            try:
                step()
                return
            except KafkaException as e:
                if self.stop_requested is not None and self.stop_requested.is_set():
                    raise
                if not said:
                    self.log(f"projection: no answer from the broker at {self.settings.bootstrap_servers} "
                             f"({e.args[0].str() if e.args else e}); trying again every 2s")
                    said = True
                time.sleep(2)

    def run(self, until_caught_up: bool = False, stop_requested=None,
            max_offsets_per_trigger: int | None = None) -> ProjectionRun:
        """Batches of what has arrived, as soon as it has, until ``stop_requested`` is set (or, with
        ``until_caught_up``, every query has read to the log's end)."""
        started = time.monotonic()
        self.stop_requested = stop_requested
        if not self.queries:
            self.start()
        limit = self.limit = max_offsets_per_trigger or min(self.settings.max_offsets_per_trigger, MAX_BATCH_RECORDS)
        run = ProjectionRun()
        try:
            main = self.queries[0]
            # event_store.collector: short collections between batches; everything every 10 minutes, as the
            # libraries of this loop make reference cycles.
            with CollectorPaced(whole_every_s=600) as collector:
                while stop_requested is None or not stop_requested.is_set():
                    worked = main.step(limit, 0.1)
                    for query in self.queries[1:]:
                        # The archive reads no further than the read models did: in step with them, its batch
                        # holds the read models' batch's records, parsed once for both (``shared``).
                        worked += query.step(limit, 0.0, until=dict(main.reader.next))
                    for query in self.queries:
                        query.lag = query.reader.lag()
                    if until_caught_up and not worked and all(q.reader.caught_up(q.partitions)
                                                              for q in self.queries):
                        break
                    if not worked:  # idle: what the last batch mapped of the key indexes is handed back
                        for index in list(self.known.values()):
                            index.settle()
                    collector.tick()
        finally:
            for query in self.queries:
                query.reader.close()
            self.parser.close()
            self.wait_for_compaction()
            for index in self.known.values():
                index.close()
        main = self.queries[0]
        run.batches, run.input_rows, run.seconds = main.batches, main.rows, time.monotonic() - started
        return run

    def run_until_caught_up(self, max_offsets_per_trigger: int | None = None) -> ProjectionRun:
        return self.run(until_caught_up=True, max_offsets_per_trigger=max_offsets_per_trigger)
