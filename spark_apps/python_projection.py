"""The projection's two queries run by one Python process (DuckDB + delta-rs) instead of Spark: a live batch in tenths
of a second instead of seconds. ``eventlake project --engine python``.

**Interchangeable with the Spark queries, batch by batch.** It keeps the same checkpoints (Structured Streaming's
offset and commit logs, written in Spark's own format: ``offsets/N`` is planned before batch N writes anything,
``commits/N`` after), writes the same tables with the same Delta idempotent-write ids (transaction app id
``<app id>/<table>``, version = the batch id) and commit metadata, the same sequence ledger (``admitted_by`` =
``<app id>/<batch>``) and bookkeeping, and resolves the read models' generations the same way (the per-batch marker
included). So either engine can run any batch of the same projection, and status, rebuild, reprocess and the checks
see no difference.

**The common path only; the rest is Spark's.** A read-models batch is done here when it is what a live stream
almost always is: every record a valid event (``EventEnvelope.from_json``, the definition the Spark parser is
generated from; a test keeps the two in agreement), each aggregate's events continuing its head in the sequence
ledger exactly once, nothing held after a version gap for its aggregates, no ``_pending`` event in a current-state
model. Late events are recorded in ``late_events`` as Spark records them. A batch run again after a crash is done
here too when its first run admitted every event (its writes that committed are skipped by their transaction ids; a
windowed model whose MERGE committed splits its events by the watermark that commit recorded). Everything it checks
is read before it writes anything. Any other batch (a record written around the handler, a replayed or forged
event, a gap) - and any failure while writing one, a lost commit race included - is handed to the Spark query
on the same checkpoint: the batch is already planned in the offset log, so Spark runs exactly it again (its re-run
path: what committed is skipped by its transaction id, the rest is done), then the rest of the log, and stops; then
this engine goes on from Spark's last batch. The Spark session is started on the first such batch only (tens of
seconds, once), so records written around the handler cost a live stream that much delay, nothing else.

The archive's query (``event_archive``) is an append of every valid event, with its own checkpoint: always done
here (records that are not events are the read models' dead letters).

Local tables and checkpoints only (a storage URI: use the Spark engine).
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Mapping

from event_store.collector import CollectorPaced
from lakehouse.settings import Settings
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, SHARED_LATE_EVENTS_TABLE, Generation, held_table, \
    ledger_table
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel
from spark_apps.spark_projection import ARCHIVE_STATS_COLUMNS, Projection, ProjectionError, ProjectionRun, \
    dead_letter_schema
from spark_apps import sequence
from spark_apps.arrow_rows import in_schema
from spark_apps.event_rows import Records, event_row_schema, parse_records
from spark_apps.memory import large_blocks_off_the_heap

__all__ = ["PythonProjection", "Checkpoint", "event_row_schema", "supports", "default_engine", "HandOver", "Reader",
           "Batch", "Hashes", "Known", "CompactionTurns", "side_by_side", "merge_into"]

# Spark's metadata log format version (offsets/N, commits/N, sources/0/0).
_LOG_VERSION = "v1"
_CALL_TIMEOUT_S = 10.0
# Records per batch at most (or fewer, EVENTLAKE_MAX_OFFSETS_PER_TRIGGER): a batch's records are held as Python
# objects, so a projection far behind catches up in batches of bounded memory.
MAX_BATCH_RECORDS = 100_000
# Records in a batch from which it is parsed by two processes (``ParseWorker``): catch-up batches, not live ones.
PARALLEL_PARSE_MIN = 20_000
IDLE_BATCHES = 100  # small batches in a row after which the second parser is stopped (started again when needed)
COMPACT_EVERY = 50  # commits of this engine to a table between two compactions of its small files
# The small files a compaction reads into one file, at most (bytes read). delta-rs's own compaction chooses its files
# by this size alone: a file it made is 0.5-0.8 of the files it read, stays under this size and was read again by
# every later compaction (the archive's read 12 MB at the start of a ten-minute live stream, 55-60 MB at its end).
# A compaction of a table MERGEd into is part of a batch, so it adds to the freshness of the batches behind it:
# 32 MiB made some batches seconds slower. (The appended tables' run beside the batches: ``PythonProjection.compact``.)
COMPACT_TARGET_BYTES = 8 * 1024 * 1024
# The files a compaction takes (``spark_apps.small_files``): those under this size. It merges them into files of up
# to ``COMPACT_TARGET_BYTES`` of what it read, about half that written (ZSTD, where an append writes Snappy); a merged
# file this size or more is not read again, so a compaction reads the new small files (and at most one merged file
# under it), however large the table has grown.
SMALL_FILE_BYTES = COMPACT_TARGET_BYTES // 4
# A windowed table (its key holds ``window_start``) is not compacted but clustered: when a MERGE had to copy this
# many unchanged rows (a MERGE rewrites every file holding a row it changes, and one file can hold every window
# since January), the table is rewritten sorted by window into files of ``CLUSTER_TARGET_BYTES``, whose window
# ranges do not overlap: the next MERGEs, which name their windows, touch the newest file only.
CLUSTER_AFTER_COPIED_ROWS = 50_000
CLUSTER_TARGET_BYTES = 256 * 1024
# The session settings Spark 4.2 records with every planned batch and reads back on a restart (a checkpoint this
# engine started has no Spark-written batch to copy them from): Spark's defaults, as its own offsets/N hold them.
_SPARK_OFFSET_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion": "2",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion": "5",
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": "false",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
    "spark.sql.streaming.statefulOperator.useStrictDistribution": "true",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "2",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
    "spark.sql.streaming.aggregation.stateFormatVersion": "2",
    "spark.sql.function.protobufExtensions.enabled": "false",
    "spark.sql.streaming.join.stateFormatVersion": "2",
    "spark.sql.streaming.stateStore.compression.codec": "lz4",
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan": "false",
}


def supports(settings: Settings) -> str:
    """'' when this engine can run here, else why not."""
    for what, where in (("warehouse", settings.warehouse), ("checkpoints", settings.checkpoints)):
        if "://" in str(where) and not str(where).startswith("file://"):
            return f"the {what} is not a local folder ({where}); run the Spark engine (--engine spark)"
    return ""


def default_engine(settings: Settings) -> tuple[str, str]:
    """The engine ``eventlake project`` runs when none is named: (engine, why). This one wherever it can run (local
    tables and checkpoints, Spark in this process), since it gives fresher read models with less memory; the Spark
    engine for storage URIs and for a Spark cluster named by ``EVENTLAKE_SPARK_MASTER``."""
    why = supports(settings)
    if why:
        return "spark", why
    master = settings.spark_master
    if not master.startswith("local"):
        return "spark", (f"EVENTLAKE_SPARK_MASTER={master} names a Spark cluster: the Structured Streaming "
                         f"queries run there")
    return "python", ("the tables and checkpoints are local folders (--engine spark for the Structured Streaming "
                      "queries)")


class HandOver(Exception):
    """This batch is not on the common path: the Spark query runs it (the message says why)."""


class Checkpoint:
    """A Structured Streaming checkpoint's offset and commit logs, read and written the way Spark does (so Spark
    resumes from what this wrote, and this from what Spark wrote)."""

    def __init__(self, path, topic: str, shuffle_partitions: int):
        self.path, self.topic = path, topic
        self.default_conf = {**_SPARK_OFFSET_CONF, "spark.sql.shuffle.partitions": str(shuffle_partitions)}

    def _numbers(self, folder: str) -> list[int]:
        where = self.path / folder
        if not where.exists():
            return []
        return sorted(int(p.name) for p in where.iterdir() if p.name.isdigit())

    def last_committed(self) -> int | None:
        numbers = self._numbers("commits")
        return numbers[-1] if numbers else None

    def last_planned(self) -> int | None:
        numbers = self._numbers("offsets")
        return numbers[-1] if numbers else None

    def ends(self, batch: int) -> dict[int, int]:
        """The offsets batch ``batch`` ends at (exclusive), per partition of the topic."""
        lines = (self.path / "offsets" / str(batch)).read_text().splitlines()
        if not lines or lines[0] != _LOG_VERSION:
            raise ProjectionError(f"checkpoint {self.path}: offsets/{batch} is in a format this engine does not "
                                  f"read ({lines[:1]}); run the Spark engine")
        offsets = json.loads(lines[2])
        if set(offsets) != {self.topic}:
            raise ProjectionError(f"checkpoint {self.path} reads {', '.join(offsets)}, not {self.topic}")
        return {int(p): int(o) for p, o in offsets[self.topic].items()}

    def _conf(self) -> dict:
        last = self.last_planned()
        if last is None:
            return dict(self.default_conf)
        lines = (self.path / "offsets" / str(last)).read_text().splitlines()
        return json.loads(lines[1]).get("conf") or dict(self.default_conf)

    def _write(self, folder: str, name: str, text: str) -> None:
        where = self.path / folder
        where.mkdir(parents=True, exist_ok=True)
        partial = where / f".{name}.tmp"
        partial.write_text(text)
        partial.replace(where / name)  # atomic: a crash leaves no half-written log entry

    def start(self, starts: dict[int, int]) -> None:
        """A new checkpoint: its query id and the Kafka source's first offsets (Spark's ``sources/0/0``)."""
        import uuid

        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / "metadata").exists():
            (self.path / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        if not (self.path / "sources" / "0" / "0").exists():
            # A zero byte first, as Spark's Kafka source writes it (read back by Spark 2.1 too).
            self._write("sources/0", "0", "\0" + _LOG_VERSION + "\n" + json.dumps(
                {self.topic: {str(p): o for p, o in sorted(starts.items())}}))

    def plan(self, batch: int, ends: dict[int, int]) -> None:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": self._conf()}
        self._write("offsets", str(batch), "\n".join([
            _LOG_VERSION, json.dumps(meta, separators=(",", ":")),
            json.dumps({self.topic: {str(p): o for p, o in sorted(ends.items())}}, separators=(",", ":"))]))

    def commit(self, batch: int) -> None:
        self._write("commits", str(batch), _LOG_VERSION + "\n" + json.dumps({"nextBatchWatermarkMs": 0}))
        for folder in ("offsets", "commits"):  # Spark keeps the last 100 (minBatchesToRetain)
            for old in self._numbers(folder):
                if old >= batch - 100:
                    break
                (self.path / folder / str(old)).unlink(missing_ok=True)


class Reader:
    """Reads the events topic from a checkpoint's position, ``read_committed``, by partition assignment (no
    group): a batch is what has arrived, up to ``limit`` records."""

    def __init__(self, settings: Settings, name: str):
        from event_store import kafka_clients

        self.settings, self.name = settings, name
        self.consumer = kafka_clients.range_reader(settings, name)
        self.next: dict[int, int] = {}  # partition -> the next offset the consumer hands out
        self.at_end: set[int] = set()
        self.buffered: list = []

    def partitions(self) -> list[int]:
        topic = self.consumer.list_topics(self.settings.events_topic, timeout=_CALL_TIMEOUT_S).topics[
            self.settings.events_topic]
        if topic.error is not None:
            raise ProjectionError(f"{self.name}: topic {self.settings.events_topic}: {topic.error}")
        return sorted(topic.partitions)

    def earliest(self, partition: int) -> int:
        from confluent_kafka import TopicPartition

        low, _ = self.consumer.get_watermark_offsets(TopicPartition(self.settings.events_topic, partition),
                                                     timeout=_CALL_TIMEOUT_S, cached=False)
        return low

    def seek(self, starts: dict[int, int]) -> None:
        """Read from ``starts`` (partition -> offset); a start the log no longer holds is a gap (Spark's
        ``failOnDataLoss``): refused."""
        from confluent_kafka import TopicPartition

        for partition, offset in starts.items():
            if offset < self.earliest(partition):
                raise ProjectionError(_data_loss(self.settings, self.name, partition, offset))
        self.consumer.assign([TopicPartition(self.settings.events_topic, p, o) for p, o in sorted(starts.items())])
        self.next, self.at_end, self.buffered = dict(starts), set(), []

    def read(self, limit: int, wait_s: float, until: Mapping[int, int] | None = None) -> Records:
        """What has arrived since the last batch (at most ``limit`` records), waiting up to ``wait_s`` for the
        first record; with ``until`` (partition -> offset), no record at or past it."""
        from confluent_kafka import KafkaError

        from event_store import kafka_clients

        batch = Records(ends=dict(self.next), starts=dict(self.next))
        messages, self.buffered = self.buffered, []
        held: list = []  # past ``until``: the next batch's
        held_partitions: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            if held:
                self.buffered = held
                return batch
            if not messages:
                timeout = max(0.0, deadline - time.monotonic()) if not batch.rows else 0.0
                messages = kafka_clients.take(self.consumer, min(limit - len(batch.rows), 10_000), timeout)
                if not messages:
                    return batch
            for i, m in enumerate(messages):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if m.partition() in held_partitions:
                            # The end after a record held back: reached once that record is read (librdkafka
                            # tells of an end once; dropped here, the reader would never be caught up again).
                            held.append(m)
                        elif m.offset() >= self.next.get(m.partition(), 0):
                            self.at_end.add(m.partition())
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise ProjectionError(_data_loss(self.settings, self.name, m.partition(),
                                                         self.next.get(m.partition(), -1)))
                    if error.fatal():
                        raise ProjectionError(f"{self.name}: Kafka: {error.str()}")
                    continue  # transient (a broker away): librdkafka retries by itself
                if len(batch.rows) >= limit:
                    self.buffered = held + messages[i:]
                    return batch
                partition, offset = m.partition(), m.offset()
                if offset < self.next.get(partition, 0):
                    continue  # already read (a re-fetch)
                if until is not None and offset >= until.get(partition, offset + 1):
                    held.append(m)
                    held_partitions.add(partition)
                    self.at_end.discard(partition)
                    continue
                self.at_end.discard(partition)
                batch.rows.append((partition, offset, m.key(), m.value()))
                self.next[partition] = batch.ends[partition] = offset + 1
            messages = []

    def caught_up(self, partitions: list[int]) -> bool:
        return set(partitions) <= self.at_end

    def backlog(self) -> int:
        """Records in the log past where this reader is (read_committed: an upper bound)."""
        from confluent_kafka import TopicPartition

        behind = 0
        for partition, offset in self.next.items():
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.settings.events_topic, partition),
                                                          timeout=_CALL_TIMEOUT_S, cached=False)
            behind += max(0, high - offset)
        return behind

    def close(self) -> None:
        from event_store import kafka_clients

        kafka_clients.close_within(self.consumer, 5.0, self.name)


def _data_loss(settings: Settings, name: str, partition: int, offset: int) -> str:
    return (f"{name} stopped: records of {settings.events_topic} partition {partition} from offset {offset} that it "
            f"had not read yet are gone from Kafka (retention or deleted records), so the read models would silently "
            f"miss events. Nothing was written past the gap. To go on: rebuild the read models from {ARCHIVE_TABLE} if "
            f"it holds those events, or accept the gap by removing the checkpoint and projecting from the log's "
            f"current start.")


class ParseWorker:
    """A second process parsing (``spark_apps.parse_worker``): ``parse`` gives it the first half of a large batch's
    records (``PARALLEL_PARSE_MIN`` or more) while this process parses the rest, with the same parser
    (``spark_apps.event_rows``), so both cores parse and the rows and verdicts are those of ``parse_records`` on the
    whole batch. It is started when the engine starts that far behind (``prepare``), else on the first large batch,
    and used once it is up; live batches (a few thousand records) never start it, and ``IDLE_BATCHES`` of them in a
    row stop it (its memory back). If it fails or ends, this process parses its part itself, and every batch after
    that (said once in the log)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.process = None
        self.small = 0  # small batches in a row since the last large one
        self.ready = False
        self.failed = False
        self.batches = 0

    def _start(self) -> None:
        import os
        import subprocess
        import sys

        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "spark_apps.parse_worker"], cwd=root, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

    def prepare(self) -> None:
        """Start the worker now (it is ready a second or so later), when large batches are coming."""
        if self.process is None and not self.failed:
            self._start()

    def _up(self) -> bool:
        """Whether the worker is ready for a request (started now when it never was)."""
        import select

        if self.failed:
            return False
        if self.process is None:
            self._start()
            return False
        if not self.ready and select.select([self.process.stdout], [], [], 0)[0]:
            from spark_apps.parse_worker import READY

            if self.process.stdout.read(1) != READY:
                self._fail(f"it did not start (exit code {self.process.wait()})")
                return False
            self.ready = True
        return self.ready

    def _fail(self, why: str) -> None:
        self.failed = True
        self.log(f"projection: the second parser process stopped being used: {why}; this process parses every "
                 f"batch alone from now on")
        self.close()

    def parse(self, records: Records, topic: str):
        """``parse_records(records, topic)``, the first part parsed by the worker when the batch is large and it is
        up."""
        import pickle

        import pyarrow as pa

        from spark_apps import parse_worker

        rows = records.rows
        if len(rows) < PARALLEL_PARSE_MIN:
            self.small += 1
            if self.small == IDLE_BATCHES and self.process is not None:  # caught up, live: its memory back
                self.close()
            return parse_records(records, topic)
        self.small = 0
        if not self._up():
            return parse_records(records, topic)
        cut = len(rows) // 2
        request = pickle.dumps((topic, rows[:cut]), protocol=pickle.HIGHEST_PROTOCOL)
        sent: list[BaseException] = []

        def send() -> None:  # writing to the pipe lets go of the GIL: this process parses its part meanwhile
            try:
                parse_worker.write_message(self.process.stdin, request)
            except OSError as e:
                sent.append(e)

        sending = threading.Thread(target=send, name="projection-parse-request", daemon=True)
        sending.start()
        mine, my_bad = parse_records(Records(rows=rows[cut:]), topic)
        sending.join()
        try:
            if sent:
                raise sent[0]
            head = parse_worker.read_message(self.process.stdout)
            answer = pickle.loads(head) if head is not None else ("error", "it ended")
            if answer[0] == "ok":
                body = parse_worker.read_message(self.process.stdout)
                if body is None:
                    answer = ("error", "it ended")
        except OSError as e:
            answer = ("error", f"{type(e).__name__}: {e}")
        if answer[0] != "ok":
            exit_code = self.process.poll()
            self._fail(f"{answer[1]}{'' if exit_code is None else f' (exit code {exit_code})'}")
            theirs, their_bad = parse_records(Records(rows=rows[:cut]), topic)
        else:
            theirs, their_bad = pa.ipc.open_stream(body).read_all(), answer[1]
            self.batches += 1
        return pa.concat_tables([theirs, mine]), their_bad + my_bad

    def close(self) -> None:
        """Stop the worker (its input ends; killed if it does not end within 5 s)."""
        import subprocess

        process, self.process, self.ready = self.process, None, False
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Hashes:
    """A set of 64-bit hashes (DuckDB's ``hash`` of a key) in sorted NumPy chunks, merged as they grow (8 bytes a
    key, a lookup is a binary search per chunk). A hit is only a maybe (two keys can share a hash); a miss is
    certain. A hash added twice is kept twice (harmless: only membership is asked; ``len`` is for the log)."""

    def __init__(self):
        self.chunks: list = []

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)

    def add(self, hashes) -> None:
        import numpy as np

        if len(hashes):
            self.chunks.append(np.sort(hashes))
        while len(self.chunks) > 1 and len(self.chunks[-2]) <= 2 * len(self.chunks[-1]):
            last = self.chunks.pop()
            merged = np.concatenate((self.chunks.pop(), last))  # twice the keys in memory (np.union1d: ~4 times)
            merged.sort()
            self.chunks.append(merged)

    def hits(self, hashes) -> int:
        import numpy as np

        found = 0
        for chunk in self.chunks:
            at = np.minimum(np.searchsorted(chunk, hashes), len(chunk) - 1)
            found += int(np.count_nonzero(chunk[at] == hashes))
        return found


def _hashes(con, relation: str, columns) -> "object":
    """DuckDB's 64-bit hash of ``columns`` (as text: equal keys hash alike whatever their Arrow or Parquet type)
    for each row of ``relation`` -> a NumPy uint64 array."""
    expression = ", ".join(f"CAST({c} AS VARCHAR)" for c in columns)
    return con.sql(f"SELECT hash({expression}) AS h FROM {relation}").to_arrow_table().column("h").to_numpy()


class Known:
    """What the engine keeps in memory between batches about a table it writes, so a live batch reads no more of
    the table than its own keys: the sequence ledger's heads (aggregate -> last admitted version) and event ids,
    an insert-once table's keys. Valid while every commit to the table since it was read is this engine's own:
    its writes (each applied here as it commits) and its compactions (the same rows in fewer files), in whatever
    order they came. Any other writer (the Spark engine after a hand-over, a repair, a second process) leaves a
    version not among them, and the next batch reads the table again."""

    def __init__(self):
        self.version: int | None = None  # the table's version this holds (None: to be read)
        self.heads: dict[str, int] = {}
        self.keys = Hashes()
        self._mine: set[int] = set()  # versions after ``version`` committed by this engine
        self._lock = threading.Lock()  # a compaction on the background thread tells its version

    def current(self, table) -> bool:
        """Whether this holds for ``table`` (a loaded DeltaTable) as of its version."""
        latest = table.version()
        with self._lock:
            if self.version is None or latest < self.version \
                    or any(v not in self._mine for v in range(self.version + 1, latest + 1)):
                return False
            self.version = latest
            self._mine = {v for v in self._mine if v > latest}
            return True

    def loaded(self, version: int) -> None:
        """This was just read from the table at ``version``."""
        with self._lock:
            self.version = version
            self._mine = {v for v in self._mine if v > version}  # a compaction committed since the read

    def forget(self) -> None:
        """To be read again at the next batch."""
        with self._lock:
            self.version = None

    def written(self, version: int) -> None:
        """This engine committed ``version``: a write it applied here, or a compaction."""
        with self._lock:
            self._mine.add(version)


class _Tables(Projection):
    """The Spark projection's plan of tables, generations and ids, its tables created with delta-rs (no JVM)."""

    def ensure_tables(self) -> None:
        from spark_apps.archive_fold import arrow_schema

        rows = event_row_schema()
        tables = {DEAD_LETTER_TABLE: (arrow_schema(dead_letter_schema()), None)}
        if self.archive:
            tables[ARCHIVE_TABLE] = (rows, ARCHIVE_STATS_COLUMNS)
        if self.models:
            tables[ledger_table(self.name)] = (arrow_schema(sequence.ledger_schema()), ("aggregate_id",))
            tables[held_table(self.name)] = (rows, None)
        for name, (schema, stats) in tables.items():
            _ensure(self.settings.table_path(name), schema, stats)
        if self.models:
            self._ensure_generation_tables(self._resolve())
        self._tables_ready = True

    def _ensure_generation_tables(self, generations, spark=None) -> None:
        from spark_apps.archive_fold import arrow_schema
        from spark_apps.merge import bookkeeping_tables

        for model, generation in self._units(generations):
            if (model.name, generation.number) in self._ensured:
                continue
            _ensure(generation.table, arrow_schema(model.schema()), tuple(model.stats_columns or model.key))
            for path, schema in bookkeeping_tables(model, _SparkRowsSchema, generation).items():
                _ensure(path, event_row_schema() if schema is _SparkRowsSchema else arrow_schema(schema), None)
            self._ensured.add((model.name, generation.number))


_SparkRowsSchema = object()  # stands for the event rows' schema in merge.bookkeeping_tables


def _ensure(path, schema, stats_columns) -> None:
    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(str(path)):
        return
    configuration = {"delta.dataSkippingStatsColumns": ",".join(stats_columns)} if stats_columns else None
    Path(str(path)).mkdir(parents=True, exist_ok=True)
    DeltaTable.create(str(path), schema, mode="ignore", configuration=configuration)


class Batch:
    """The writes of one batch, each carrying the Spark projection's idempotent-write id and metadata."""

    def __init__(self, projection: str, app_id: str, batch_id: int, steps: dict[str, float],
                 tables: dict | None = None, settle: Callable[[str], bool] | None = None):
        self.projection, self.app_id, self.batch_id, self.steps = projection, app_id, batch_id, steps
        self.written: set[str] = set()  # the tables this batch committed to
        self.merged: set[str] = set()  # of those, the tables it MERGEd into (compacted by the batch, not beside it)
        # Waits for a compaction of the table at a path running beside the batches: -> whether there was one
        self.settle = settle
        self.windowed: set[str] = set()  # of those, windowed tables (clustered, not compacted)
        self.to_cluster: set[str] = set()  # windowed tables whose MERGE copied too many unchanged rows
        self.tables = {} if tables is None else tables  # path -> DeltaTable, kept between batches
        self._locks: dict[str, threading.Lock] = {}  # path -> the lock of its DeltaTable, for writes side by side

    def table(self, path):
        """The Delta table at ``path`` as of now: loaded once, then brought up to date by reading only the
        commits since (a fresh load reads the log from its last checkpoint, up to 100 commits, every time)."""
        from deltalake import DeltaTable

        key = str(path)
        with self.lock(key):
            table = self.tables.get(key)
            if table is None:
                table = self.tables[key] = DeltaTable(key)
            else:
                table.update_incremental()
            return table

    def lock(self, path) -> threading.Lock:
        return self._locks.setdefault(str(path), threading.Lock())

    @contextmanager
    def timed(self, step: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.steps[step] = self.steps.get(step, 0.0) + time.perf_counter() - started

    def metadata(self, **extra) -> str:
        return json.dumps({"projection": self.projection, "app_id": self.app_id, "batch_id": self.batch_id,
                           "input_rows": -1, **extra})

    def commit(self, txn_app_id: str, **metadata):
        from deltalake import CommitProperties, Transaction

        return CommitProperties(app_transactions=[Transaction(txn_app_id, self.batch_id)],
                                custom_metadata={"userMetadata": self.metadata(**metadata)})

    @staticmethod
    def hooks():
        """What delta-rs does after each of this engine's commits: a Delta log checkpoint every 100 commits, not the
        expired logs' cleanup (``PythonProjection.expire_logs``, on the tables' compaction turns instead)."""
        from deltalake import PostCommitHookProperties

        return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

    def done(self, table, txn_app_id: str) -> bool:
        return (table.transaction_version(txn_app_id) or -1) >= self.batch_id

    def append(self, data, path, name: str, writer: str = "", txn: str | None = None, table=None) -> int | None:
        """``BatchContext.append``'s write (transaction ``<app id>/<name>/<writer>``), once: -> the version it
        committed (None: nothing written)."""
        from deltalake import write_deltalake

        txn = txn or f"{self.app_id}/{name}/{writer}"
        table = table if table is not None else self.table(path)
        with self.lock(path):
            if self.done(table, txn) or data.num_rows == 0:
                return None
            write_deltalake(table, _cast(data, table), mode="append", commit_properties=self.commit(txn),
                            post_commithook_properties=self.hooks())
            self.written.add(str(path))
            return table.version()  # this commit's version (after any other writer's, resolved by delta-rs)


_Batch = Batch  # bench/delta_log.py names it so


def _cast(data, table):
    """``data``'s columns in the order and types of the Delta ``table``'s schema."""
    import pyarrow as pa

    return in_schema(data, pa.schema(table.schema().to_arrow()))


def _register(con, name: str, path, table=None) -> None:
    """The Delta table at ``path`` as DuckDB view ``name``: its data files through DuckDB's own Parquet reader (as
    ``archive_fold`` reads the archive), or through delta-rs when the table uses features that reader does not
    apply (deletion vectors, column mapping, partitions)."""
    from deltalake import DeltaTable

    table = table if table is not None else DeltaTable(str(path))
    protocol = table.protocol()
    if protocol.reader_features or protocol.min_reader_version > 1 or table.metadata().partition_columns:
        con.register(f"{name}_data", table.to_pyarrow_dataset().to_table())
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {name}_data")
        return
    files = table.file_uris()
    if not files:
        import pyarrow as pa

        con.register(f"{name}_data", pa.schema(table.schema().to_arrow()).empty_table())
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {name}_data")
        return
    con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM read_parquet([{_sql_text(files)}], "
                f"union_by_name = true)")


def _sql_text(values) -> str:
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in values)


class CompactionTurns:
    """When each table is compacted: every ``every`` commits of this engine to it, the tables' turns spread over
    those commits (the n-th table seen starts n golden-ratio steps of ``every`` along). A batch commits to most
    tables; counted from zero, they all came due in the same batch, which then took the sum of their compactions
    (seconds) - each such batch a step in the freshness of what followed."""

    def __init__(self, every: int):
        self.every = every
        self.commits: dict[str, int] = {}

    def due(self, table: str) -> bool:
        """One more commit to ``table``: -> whether it is its turn to be compacted."""
        count = self.commits.get(table)
        if count is None:
            count = round(len(self.commits) * 0.6180339887 * self.every) % self.every
        self.commits[table] = count + 1
        return (count + 1) % self.every == 0


class _Query:
    """One of the projection's queries (the read models' or the archive's): its checkpoint, reader and batches."""

    def __init__(self, engine: "PythonProjection", name: str, checkpoint, process):
        self.engine, self.name, self.process = engine, name, process
        settings = engine.settings
        self.checkpoint = Checkpoint(checkpoint, settings.events_topic, settings.spark_shuffle_partitions)
        self.app_id = Projection._app_id(checkpoint, name)
        self.reader = Reader(settings, name)
        self.partitions: list[int] = []
        self.batch_id = 0
        self.rows = 0
        self.batches = 0

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
            if planned - 1 >= 0 and (self.checkpoint.path / "offsets" / str(planned - 1)).exists():
                starts = self.checkpoint.ends(planned - 1)
            else:
                starts = _initial(self.checkpoint)
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
            self.process(self, records, batch)
        except HandOver as reason:
            self.engine.delta_tables.clear()  # loaded anew after what Spark writes (and whatever failed)
            self.engine.hand_over(self, str(reason))
            return
        except BaseException:
            self.engine.delta_tables.clear()
            raise
        self.checkpoint.commit(self.batch_id)
        self.engine.compact(batch.written, steps, batch.windowed, batch.merged)
        self.engine.cluster(batch.to_cluster, steps)
        self.rows += len(records.rows)
        self.batches += 1
        parts = "; ".join(f"{step} {t:.2f}s" for step, t in steps.items() if t >= 0.005)
        self.engine.log(f"{self.name}: batch {self.batch_id} done in {time.perf_counter() - started:.2f}s "
                        f"({len(records.rows)} records{'; ' + parts if parts else ''})")
        self.batch_id += 1


def _lowest_priority() -> None:
    """The calling thread at nice 19 (Linux, where a thread has its own): the compactions beside the batches read
    their small files on it (decoding is most of their work), in whatever CPU the live path leaves. At the default
    priority, the archive's (30-40 MB read, 3-5 s) made the batches beside it two to three times slower, every
    50 batches: the freshness's p99."""
    import os
    import sys

    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


def _initial(checkpoint: Checkpoint) -> dict[int, int]:
    """A checkpoint's first offsets (``sources/0/0``)."""
    lines = (checkpoint.path / "sources" / "0" / "0").read_text().lstrip("\0").splitlines()
    return {int(p): int(o) for p, o in json.loads(lines[1])[checkpoint.topic].items()}


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
        self.tables = _Tables(None, settings, models, log=log, archive=archive, generations=generations,
                              checkpoint=checkpoint, starting_offsets=starting_offsets)
        self.models, self.archive = self.tables.models, self.tables.archive
        self.starting_offsets = starting_offsets
        self._spark_session = spark_session
        self.handed_over = 0
        self.stop_requested = None
        self.shared: tuple | None = None  # (span, event rows) of the read models' last batch, for the archive's
        self._commits = CompactionTurns(COMPACT_EVERY)
        self._background: ThreadPoolExecutor | None = None  # compactions of the appended-only tables (``compact``)
        self._compacting: dict = {}  # table -> its compaction on that thread (a Future)
        self.known: dict[str, Known] = {}  # table -> what this engine keeps of it between batches
        self.delta_tables: dict = {}  # table -> its DeltaTable, brought up to date by each batch (Batch.table)
        self.limit = settings.max_offsets_per_trigger  # records per batch at most (Spark's maxOffsetsPerTrigger)
        self.queries: list[_Query] = []
        self.parser = ParseWorker(log)  # a second process parsing large batches with this one

    # -- Spark for what is not the common path ---------------------------------------------------------------
    def hand_over(self, query: _Query, reason: str) -> None:
        """Spark runs the planned batch again, then the rest of the log until caught up; this query goes on after."""
        from spark_apps.session import build_session

        self.handed_over += 1
        self.log(f"{query.name}: batch {query.batch_id} goes to the Spark engine: {reason}")
        self.wait_for_compaction()
        spark = self._spark_session() if self._spark_session else build_session(
            self.settings, app_name="eventlake-projection", log=self.log)
        models = self.models if query.name == self.tables.name else []
        spark_projection = Projection(spark, self.settings, models, log=self.log,
                                      archive=query.name != self.tables.name,
                                      generations=self.tables.pinned, checkpoint=query.checkpoint.path,
                                      starting_offsets=self.starting_offsets)
        run = spark_projection.run_until_caught_up(max_offsets_per_trigger=self.limit)
        self.log(f"{query.name}: the Spark engine ran {run.batches} batch(es), {run.input_rows} records; "
                 f"this engine goes on")
        self._with_broker(query.resume)

    # -- small files ------------------------------------------------------------------------------------------
    def compact(self, written: set[str], steps: dict[str, float], windowed: set[str] = frozenset(),
                merged: set[str] = frozenset()) -> None:
        """Every ``COMPACT_EVERY`` commits of this engine to a table, its small files are compacted (a live batch
        writes one file per table; left alone, readers and this engine's own reads of the bookkeeping tables
        open thousands); a windowed table is clustered instead, when it holds many more files than that would
        make. Delta log checkpoints are delta-rs's own (every 100 commits); the expired commits of the log are
        deleted on the same turns (``expire_logs``).

        A table the batch appended to (the archive, the sequence ledger, an insert-once table, a windowed
        model's applied-ids ledger, ``late_events``) is compacted on a thread of its own while the batches go on:
        an append and a compaction commit one after the other whichever comes first (the compaction rewrites only
        files it read), and no live batch waits for it. Inside the batches, the ledger's took 0.6-0.8 s after ten
        minutes of a live stream, and payments' and fraud_alerts' 0.3-0.8 s each, every 50 batches: the probes
        of those batches made the freshness's p99. A table the batch MERGEd into is compacted by the batch itself:
        a MERGE meeting a compaction of the files it read fails, so a MERGE into a table being compacted beside
        the batches (an insert-once table's key seen before) first waits for that compaction (``settle``)."""
        import pyarrow as pa
        from deltalake import DeltaTable

        for path in sorted(written):
            if not self._commits.due(path):
                continue
            if path in windowed:
                table = DeltaTable(path)
                self.expire_logs(path, table)
                sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
                if len(sizes) > 2 * (sum(sizes) // CLUSTER_TARGET_BYTES + 1) + 10:
                    self.cluster({path}, steps)
                continue
            running = self._compacting.get(path)
            if path not in merged:
                if running is None or running.done():  # else still at it: the next turn
                    if running is not None:
                        self._finished(path, running)
                    if self._background is None:
                        self._background = ThreadPoolExecutor(1, thread_name_prefix="projection-compact",
                                                              initializer=_lowest_priority)
                    self._compacting[path] = self._background.submit(self._compact_table, path, None)
                continue
            if running is not None and not running.done():
                continue  # compacted beside the batches right now: two compactions would race, one giving up
            self._compact_table(path, steps)

    def settle(self, path: str) -> bool:
        """Wait for the compaction of ``path`` running beside the batches, if any (its failure is logged by
        ``_finished`` later): -> whether there was one."""
        running = self._compacting.get(path)
        if running is None:
            return False
        try:
            running.result()
        except Exception:  # noqa: BLE001 -- the table is as its last commit left it
            pass
        return True

    def _compact_table(self, path: str, steps: dict[str, float] | None) -> None:
        """Compact the table at ``path`` (``steps``: a batch's, when the batch runs it; else on the background
        thread)."""
        from deltalake import DeltaTable

        from spark_apps.small_files import compact_small_files

        started = time.perf_counter()
        self.expire_logs(path)
        try:
            metrics = compact_small_files(path, SMALL_FILE_BYTES, COMPACT_TARGET_BYTES)
            if metrics is None:  # a table of another protocol: delta-rs's compaction (it reads again what it made)
                table = DeltaTable(path)
                before = table.version()
                # One thread: the platform's other services (the fraud detector, the handler) keep a core.
                metrics = table.optimize.compact(target_size=COMPACT_TARGET_BYTES, max_concurrent_tasks=1)
                metrics["version"] = table.version() if table.version() != before else None
        except Exception as e:  # noqa: BLE001 -- a race with another writer: the next round compacts
            self.log(f"projection: compacting {path} skipped: {str(e).splitlines()[0][:200]}")
            return
        index = self.known.get(path)
        if index is not None and metrics["version"] is not None:
            index.written(metrics["version"])  # the same rows in fewer files: what the engine keeps of them holds
        if steps is not None:
            steps[f"compact {Path(path).name}"] = time.perf_counter() - started
        if metrics.get("numFilesRemoved"):
            read = f" ({metrics['removedBytes'] / 1e6:.1f} MB)" if "removedBytes" in metrics else ""
            self.log(f"projection: compacted {path}: {metrics['numFilesRemoved']} files{read} into "
                     f"{metrics['numFilesAdded']} ({time.perf_counter() - started:.2f}s"
                     f"{'' if steps is not None else ', while the batches went on'})")

    def expire_logs(self, path: str, table=None) -> None:
        """The table's Delta log commits older than its ``delta.logRetentionDuration`` (30 days unless set: time
        travel reaches back that far) and before its last checkpoint, deleted (delta-rs's ``cleanup_metadata``).
        delta-rs does this after every commit unless told not to, listing the whole log each time: 24 ms of a 40 ms
        append once the log holds 4,000 commits (about 45 minutes of a live stream), growing with the log. The
        engine's commits leave it to the table's compaction turns (``Batch.hooks``), every ``COMPACT_EVERY``
        commits. ``table``: the table at ``path``, when the caller loaded it already."""
        from deltalake import DeltaTable

        try:
            (table if table is not None else DeltaTable(path)).cleanup_metadata()
        except Exception as e:  # noqa: BLE001 -- nothing deleted: the next turn tries again
            self.log(f"projection: deleting the expired Delta log of {path} skipped: {str(e).splitlines()[0][:200]}")

    def wait_for_compaction(self) -> None:
        """Let the compactions on the background thread finish: before another writer (Spark) takes the tables
        on, and before the engine stops."""
        compacting, self._compacting = self._compacting, {}
        for path, running in compacting.items():
            self._finished(path, running)

    def _finished(self, path: str, running) -> None:
        try:
            running.result()
        except Exception as e:  # noqa: BLE001 -- a compaction not made: the table is as its last commit left it
            self.log(f"projection: compacting {path} failed: {type(e).__name__}: {e}")

    def cluster(self, paths: set[str], steps: dict[str, float]) -> None:
        """Each windowed table in ``paths`` rewritten sorted by ``window_start`` into small files of disjoint
        window ranges (``CLUSTER_AFTER_COPIED_ROWS``)."""
        from deltalake import DeltaTable

        for path in paths:
            started = time.perf_counter()
            try:
                metrics = DeltaTable(path).optimize.z_order(["window_start"], target_size=CLUSTER_TARGET_BYTES,
                                                          max_concurrent_tasks=1)
            except Exception as e:  # noqa: BLE001 -- a race with another writer: the next large MERGE asks again
                self.log(f"projection: clustering {path} by window skipped: {str(e).splitlines()[0][:200]}")
                continue
            steps[f"cluster {Path(path).name}"] = time.perf_counter() - started
            self.log(f"projection: clustered {path} by window: {metrics.get('numFilesRemoved')} files into "
                     f"{metrics.get('numFilesAdded')} ({time.perf_counter() - started:.2f}s)")

    # -- the loop -------------------------------------------------------------------------------------------
    def start(self) -> None:
        from event_store import kafka_log

        kafka_log.ensure_topics(self.settings, log=self.log)
        self.tables.ensure_tables()
        if self.models:
            self.queries.append(_Query(self, self.tables.name, self.tables.checkpoint, _read_models_batch))
        if self.archive:
            self.queries.append(_Query(self, f"projection-{ARCHIVE_TABLE}", self.tables.archive_checkpoint,
                                       _archive_batch))
        if not self.queries:
            raise ValueError("nothing to project: no read models and no archive")
        for query in self.queries:
            self._with_broker(lambda: query.resume(self.starting_offsets if query.name == self.tables.name else None))
            self.log(f"projection: {query.name} started from {self.settings.events_topic} at "
                     f"{self.settings.bootstrap_servers} (engine python; batch {query.batch_id}; checkpoint "
                     f"{query.checkpoint.path})")
        try:
            behind = self.queries[0].reader.backlog()
        except Exception:  # noqa: BLE001 -- no answer now: the first large batch starts the second parser
            behind = 0
        if behind >= PARALLEL_PARSE_MIN:  # catching up: the second parser gets ready meanwhile
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
                    if until_caught_up and not worked and all(q.reader.caught_up(q.partitions)
                                                              for q in self.queries):
                        break
                    collector.tick()
        finally:
            for query in self.queries:
                query.reader.close()
            self.parser.close()
            self.wait_for_compaction()
        main = self.queries[0]
        run.batches, run.input_rows, run.seconds = main.batches, main.rows, time.monotonic() - started
        return run

    def run_until_caught_up(self, max_offsets_per_trigger: int | None = None) -> ProjectionRun:
        return self.run(until_caught_up=True, max_offsets_per_trigger=max_offsets_per_trigger)


# -- the archive's batch ---------------------------------------------------------------------------------------
def _archive_batch(query: _Query, records: Records, batch: Batch) -> None:
    engine = query.engine
    with batch.timed("parse"):
        if engine.shared is not None and engine.shared[0] == records.span:
            events = engine.shared[1]  # the read models' batch: the same records, parsed already
        else:
            events, _ = engine.parser.parse(records, engine.settings.events_topic)
        engine.shared = None
    with batch.timed("append"):
        batch.append(events, query.engine.settings.table_path(ARCHIVE_TABLE), ARCHIVE_TABLE)


# -- the read models' batch ------------------------------------------------------------------------------------
def _read_models_batch(query: _Query, records: Records, batch: Batch) -> None:
    import duckdb

    engine = query.engine
    settings = engine.settings
    with batch.timed("parse"):
        events, bad = engine.parser.parse(records, settings.events_topic)
        engine.shared = (records.span, events) if len(engine.queries) > 1 else None
    if bad:
        partition, offset, reason = bad[0]
        raise HandOver(f"{len(bad)} record(s) that are not valid events (partition {partition} offset {offset}: "
                       f"{reason[:200]}) -> the dead-letter table")
    generations = engine.tables._generations_for_batch(None, query.batch_id)
    con = duckdb.connect(config={"threads": 2})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("batch", events)
        with batch.timed("sequence: check"):
            ledger_name = ledger_table(query.name)
            ledger_path = settings.table_path(ledger_name)
            ledger = batch.table(ledger_path)
            rerun = batch.done(ledger, f"{query.app_id}/{ledger_name}/")
            held_path = settings.table_path(held_table(query.name))
            _register(con, "held", held_path, batch.table(held_path))
            held = con.execute("SELECT count(*) FROM held WHERE aggregate_id IN (SELECT aggregate_id FROM batch)"
                               ).fetchall()[0][0]
            if held:
                raise HandOver(f"{held} event(s) of this batch's aggregates are held after a version gap")
            if rerun:
                _register(con, "ledger", ledger_path, ledger)
                # Run again after a crash, its ledger rows written: when its first run admitted every event (the
                # common path), the rest of its writes are done here, each skipped where it committed; else Spark's
                # re-run path takes it.
                admitted_by = f"{query.app_id}/{query.batch_id}"
                mine, missing = con.execute(f"""
                    SELECT (SELECT count(*) FROM ledger WHERE admitted_by = '{admitted_by}'),
                           (SELECT count(*) FROM batch ANTI JOIN (SELECT event_id FROM ledger
                                                                 WHERE admitted_by = '{admitted_by}') USING (event_id))
                    """).fetchall()[0]
                if missing or mine != events.num_rows:
                    raise HandOver("a batch run again after a crash, whose first run did not admit every event")
                engine.log(f"{query.name}: batch {query.batch_id}: run again after a crash; its sequence ledger "
                           f"rows are written, the writes not yet committed are done now")
            else:
                # Against what the engine keeps of the ledger (its heads and event ids, read again whenever another
                # writer changed it): the batch's own aggregates and ids only, however long the ledger.
                index = engine.known.setdefault(str(ledger_path), Known())
                if not index.current(ledger):
                    _load_ledger(con, ledger, ledger_path, index, engine.log)
                runs = con.execute("SELECT aggregate_id, min(aggregate_version), max(aggregate_version), count(*), "
                                   "count(DISTINCT aggregate_version) FROM batch GROUP BY 1").fetchall()
                repeated = con.execute("SELECT count(*) - count(DISTINCT event_id) FROM batch").fetchall()[0][0]
                off_head = sum(1 for aggregate, first, last, n, distinct in runs
                               if first != index.heads.get(aggregate, 0) + 1 or n != distinct
                               or n != last - first + 1)
                ids = _hashes(con, "batch", ["event_id"])
                known = 0
                if index.keys.hits(ids):  # maybe admitted before (or a hash shared): the ledger decides
                    _register(con, "ledger", ledger_path, ledger)
                    known = con.execute("SELECT count(*) FROM ledger WHERE event_id IN (SELECT event_id FROM batch)"
                                        ).fetchall()[0][0]
                if repeated or known or off_head:
                    raise HandOver(f"not every aggregate simply continues its head ({repeated} event id(s) repeated "
                                   f"in the batch, {known} admitted before, {off_head} aggregate(s) off their head)")
        with batch.timed("pending"):
            for model, generation in engine.tables._units(generations):
                pending = batch.table(generation.pending) if model.merge_strategy == CURRENT_STATE_BY_VERSION \
                    else None
                if pending is not None and pending.file_uris() and pending.to_pyarrow_dataset().count_rows():
                    raise HandOver(f"{model.name}: events wait in {generation.pending} for an earlier version")
        types = {t for (t,) in con.execute("SELECT DISTINCT event_type FROM batch").fetchall()}
        units = [(m, g) for m, g in engine.tables._units(generations) if types.intersection(m.event_types)]
        writes = [_plan_unit(con, batch, model, generation, engine.known, engine.log) for model, generation in units]
        with batch.timed("sequence: ledger"):
            admitted = con.sql(f"SELECT aggregate_id, aggregate_version, event_id, kafka_partition, kafka_offset, "
                               f"'{query.app_id}/{query.batch_id}' AS admitted_by FROM batch").to_arrow_table()
            version = batch.append(admitted, ledger_path, ledger_name, table=ledger)
            if version is not None and not rerun:
                index.written(version)
                index.heads.update((aggregate, last) for aggregate, _, last, _, _ in runs)
                index.keys.add(ids)
        with batch.timed("the models' writes, side by side"):
            side_by_side(writes)
    except HandOver:
        raise
    except Exception as e:  # noqa: BLE001 -- a lost commit race, a table in a shape this engine cannot write ...
        raise HandOver(f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}") from e
    finally:
        con.close()


def side_by_side(writes: list[Callable[[], None]]) -> None:
    """The models' writes, each on its own thread (delta-rs does its work without Python's lock): a batch commits
    its tables in the time of its slowest write rather than of all of them. Every write has ended when this
    returns, whatever happened (a hand-over must not find one still running); then the first failure is raised.
    Each write touches its own model's tables; a table two of them share (``late_events``) is appended to under
    ``Batch``'s lock for its path."""
    if len(writes) <= 1:
        for write in writes:
            write()
        return
    with ThreadPoolExecutor(len(writes), thread_name_prefix="projection-write") as pool:
        futures = [pool.submit(write) for write in writes]
    for future in futures:
        future.result()


def _load_ledger(con, ledger, path, index: Known, log) -> None:
    """``index`` := the sequence ledger's heads and event ids, read from ``ledger`` (a loaded DeltaTable)."""
    started = time.perf_counter()
    index.loaded(ledger.version())
    _register(con, "ledger", path, ledger)
    index.heads = dict(con.execute("SELECT aggregate_id, max(aggregate_version) FROM ledger GROUP BY 1").fetchall())
    index.keys = Hashes()
    index.keys.add(_hashes(con, "ledger", ["event_id"]))
    log(f"projection: read the sequence ledger {path} (version {index.version}): {len(index.heads)} aggregates, "
        f"{len(index.keys)} event ids ({time.perf_counter() - started:.2f}s)")


def _fold(con, model: ReadModel, relation: str):
    """``model.fold_sql`` over ``relation`` (its relation ``events``) -> an Arrow table."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM {relation}")
    return con.sql(model.fold_sql).to_arrow_table()


def merge_into(batch: Batch, target, path, txn: str, source, on: str, insert: dict, update: dict | None = None,
           guard: bool = False, **metadata) -> dict:
    """``source`` MERGEd into ``target`` with the model's own update and insert expressions (the write of
    ``spark_apps.merge._merge``), once per batch: skipped when the table holds this batch's transaction id.
    ``guard``: a row changes only when the changes continue its version, and a new row only from version 1 (current
    state by version)."""
    if batch.done(target, txn):
        return {}
    batch.written.add(str(path))
    batch.merged.add(str(path))
    if batch.settle is not None and batch.settle(str(path)):
        # A compaction beside the batches removed files this MERGE would read as of the older snapshot: it
        # fails on such a commit. The rows are the same; the MERGE reads them as the compaction left them.
        with batch.lock(path):
            target.update_incremental()
    merger = target.merge(source, predicate=on, source_alias="s", target_alias="t",
                          commit_properties=batch.commit(txn, **metadata),
                          post_commithook_properties=batch.hooks())
    if update:
        merger = merger.when_matched_update(updates=update,
                                            predicate="s.first_version = t.version + 1" if guard else None)
    return merger.when_not_matched_insert(updates=insert, predicate="s.first_version = 1" if guard else None
                                          ).execute()


def _plan_unit(con, batch: Batch, model: ReadModel, generation: Generation, known: dict[str, Known],
               log: Callable[[str], None]) -> Callable[[], None]:
    """Check that ``model``'s part of the batch is on the common path (HandOver if not) and return its writes."""
    if not model.fold_sql:
        raise HandOver(f"{model.name}: no fold_sql (its fold in DuckDB's SQL)")
    view = f"events_{model.name}"
    con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM batch WHERE event_type IN "
                f"({_sql_text(model.event_types)})")
    target = batch.table(generation.table)
    txn = f"{batch.app_id}/{model.name}"
    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    insert = dict(model.merge_insert) or {f: f"s.{f}" for f in model.columns}

    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        if batch.done(target, txn):  # a batch run again: this model's part committed in its first run
            return lambda: None
        with batch.timed(f"{model.name}: fold"):
            key = model.key[0]
            con.register(f"folded_{model.name}", _fold(con, model, view))
            _register(con, f"target_{model.name}", generation.table, target)
            con.execute(f"CREATE OR REPLACE TEMP VIEW current_{model.name} AS SELECT {key}, version FROM "
                        f"target_{model.name} SEMI JOIN folded_{model.name} USING ({key})")
            stuck = con.execute(f"SELECT count(*) FROM folded_{model.name} s LEFT JOIN current_{model.name} c "
                                f"USING ({key}) WHERE s.first_version <> coalesce(c.version, 0) + 1 "
                                f"OR s._events <> s.version - s.first_version + 1").fetchall()[0][0]
            if stuck:
                raise HandOver(f"{model.name}: {stuck} key(s) do not continue their row's version")
            source = con.sql(f"SELECT * FROM folded_{model.name}").to_arrow_table()

        def write() -> None:
            with batch.timed(f"{model.name}: merge"):
                merge_into(batch, target, generation.table, txn, source, on, insert, dict(model.merge_update),
                       guard=True)
        return write

    if model.merge_strategy == INSERT_ONCE:
        with batch.timed(f"{model.name}: fold"):
            keys = ", ".join(model.key)
            con.register(f"folded_{model.name}", _fold(con, model, view))
            source = con.sql(f"SELECT DISTINCT ON ({keys}) * FROM folded_{model.name}").to_arrow_table()
        own = con.cursor()  # its own DuckDB connection (to the same database): the write runs on its own thread

        def write() -> None:
            try:
                if model.merge_insert:  # rows computed by SQL over the source: the MERGE evaluates it
                    with batch.timed(f"{model.name}: merge"):
                        merge_into(batch, target, generation.table, txn, source, on, insert)
                    return
                with batch.timed(f"{model.name}: insert"):
                    _insert_once(own, batch, model, generation.table, target, txn, source, on, insert,
                                 known.setdefault(str(generation.table), Known()), log)
            finally:
                own.close()
        return write

    if model.merge_strategy == WINDOWED_SUM:
        return _plan_windowed(con, batch, model, generation, target, view, txn, on, insert)
    raise HandOver(f"{model.name}: merge strategy {model.merge_strategy!r} is not on this engine's path")


def _insert_once(con, batch: Batch, model: ReadModel, path, target, txn: str, source, on: str, insert: dict,
                 index: Known, log: Callable[[str], None]) -> None:
    """An insert-once model's write: when none of the batch's keys is in the table (checked against the keys the
    engine keeps of it, read again whenever another writer changed the table), a plain append, whose cost does not
    grow with the table as a MERGE's does; else the MERGE (a key seen before keeps its first row). Either way once
    per batch (the same transaction id)."""
    if batch.done(target, txn):
        return
    if not index.current(target):
        started = time.perf_counter()
        index.loaded(target.version())
        _register(con, f"keys_{model.name}", path, target)
        index.keys = Hashes()
        index.keys.add(_hashes(con, f"keys_{model.name}", model.key))
        log(f"projection: read the keys of {path} (version {index.version}): {len(index.keys)} "
            f"({time.perf_counter() - started:.2f}s)")
    rows = _cast(source, target)
    con.register(f"new_{model.name}", rows)
    hashes = _hashes(con, f"new_{model.name}", model.key)
    if index.keys.hits(hashes):
        index.forget()  # read again after the MERGE
        merge_into(batch, target, path, txn, source, on, insert)
        return
    version = batch.append(rows, path, model.name, txn=txn, table=target)
    if version is not None:
        index.written(version)
        index.keys.add(hashes)


def _late_rows(con, model: ReadModel, fresh: str, watermark):
    """The late events' rows of ``late_events`` (``spark_apps.merge._windowed_sum``'s): the event as JSON in Spark's
    ``to_json`` shape (null fields left out, times as ``yyyy-MM-dd'T'HH:mm:ss.SSSZ`` in UTC)."""
    import datetime as dt

    import pyarrow as pa

    rows = con.sql(f"SELECT * EXCLUDE (_late) FROM {fresh} WHERE _late").to_arrow_table().to_pylist()
    now = dt.datetime.now(dt.timezone.utc)
    out = {"read_model": [], "event_id": [], "event_type": [], "aggregate_id": [], "event_time": [],
           "watermark": [], "event": [], "recorded_at": []}
    for row in rows:
        for name in ("event_id", "event_type", "aggregate_id"):
            out[name].append(row[name])
        out["read_model"].append(model.name)
        out["event_time"].append(row[model.event_time])
        out["watermark"].append(watermark)
        out["event"].append(json.dumps({k: _spark_json_value(v) for k, v in row.items() if v is not None},
                                       separators=(",", ":")))
        out["recorded_at"].append(now)
    when = pa.timestamp("us", tz="UTC")
    return pa.table(out, schema=pa.schema([("read_model", pa.string()), ("event_id", pa.string()),
                                           ("event_type", pa.string()), ("aggregate_id", pa.string()),
                                           ("event_time", when), ("watermark", when), ("event", pa.string()),
                                           ("recorded_at", when)]))


def _spark_json_value(value):
    import datetime as dt

    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.timezone.utc)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    return value


def _plan_windowed(con, batch: Batch, model: ReadModel, generation: Generation, target, view: str,
                   txn: str, on: str, insert: dict) -> Callable[[], None]:
    import datetime as dt

    from spark_apps.merge import newest_event_time_on_clock, utc_time, watermark_delay, windowed_watermark

    with batch.timed(f"{model.name}: watermark"):
        metadata = [json.loads(c["userMetadata"]) for c in target.history(5) if c.get("userMetadata")]
        found, newest = newest_event_time_on_clock(metadata)
        again = bool(metadata) and metadata[0].get("app_id") == batch.app_id and \
            metadata[0].get("batch_id") == batch.batch_id
        if not found and not again:
            _register(con, "window_table", generation.table, target)
            newest_start = con.execute("SELECT max(window_start) FROM window_table").fetchall()[0][0]
            if newest_start is not None:
                newest = min(newest_start.astimezone(dt.timezone.utc), dt.datetime.now(dt.timezone.utc))
        # A batch run again whose MERGE committed: its events are split by the watermark that commit recorded.
        watermark = utc_time(metadata[0].get("watermark_before")) if again else \
            windowed_watermark(newest, watermark_delay(model))
    with batch.timed(f"{model.name}: not yet applied"):
        _register(con, f"applied_{model.name}", generation.applied, batch.table(generation.applied))
        lo, hi = con.execute(f"SELECT min({model.event_time}), max({model.event_time}) FROM {view}").fetchall()[0]
        con.execute(f"CREATE OR REPLACE TEMP TABLE fresh_{model.name} AS SELECT * FROM {view} ANTI JOIN "
                    f"(SELECT event_id FROM applied_{model.name} WHERE event_time IS NULL OR event_time BETWEEN "
                    f"$lo AND $hi) USING (event_id)", {"lo": lo, "hi": hi})
        fresh = f"fresh_{model.name}"
        is_late = "false" if watermark is None else \
            f"{model.event_time} < TIMESTAMPTZ '{watermark.isoformat()}'"
        con.execute(f"ALTER TABLE {fresh} ADD COLUMN _late BOOLEAN")
        con.execute(f"UPDATE {fresh} SET _late = coalesce({is_late}, false)")
        newest_on_clock = con.execute(f"SELECT max(least({model.event_time}, recorded_at, now())) "
                                      f"FROM {fresh}").fetchall()[0][0]
        if newest_on_clock is not None:
            newest_on_clock = newest_on_clock.astimezone(dt.timezone.utc)
            newest = newest_on_clock if newest is None else max(newest, newest_on_clock)
        con.execute(f"CREATE OR REPLACE TEMP VIEW on_time_{model.name} AS SELECT * EXCLUDE (_late) FROM {fresh} "
                    f"WHERE NOT _late")
        source = _fold(con, model, f"on_time_{model.name}")
        clustered = "window_start" in model.key and "window_start" in source.column_names
        if source.num_rows and clustered:
            # The rows this MERGE can match lie in the source's windows: said in its condition, delta-rs skips
            # every file whose windows lie elsewhere (without it, each live batch reads the whole table).
            con.register(f"windows_{model.name}", source.select(["window_start"]))
            first, last = con.execute(f"SELECT strftime(min(window_start), '%Y-%m-%dT%H:%M:%S.%fZ'), "
                                      f"strftime(max(window_start), '%Y-%m-%dT%H:%M:%S.%fZ') "
                                      f"FROM windows_{model.name}").fetchall()[0]
            on = f"{on} AND t.window_start >= '{first}' AND t.window_start <= '{last}'"
        ledger = con.sql(f"SELECT event_id, {model.event_time} AS event_time, _late FROM {fresh}").to_arrow_table()
        late = _late_rows(con, model, fresh, watermark)
    extra = {"watermark_before": None if watermark is None else watermark.isoformat(),
             "watermark_newest_event_time": None if newest is None else newest.isoformat()}

    def write() -> None:
        if source.num_rows:
            with batch.timed(f"{model.name}: merge"):
                metrics = merge_into(batch, target, generation.table, txn, source, on, insert, dict(model.merge_update),
                                 **extra)
            if clustered:
                batch.windowed.add(str(generation.table))
                if metrics.get("num_target_rows_copied", 0) >= CLUSTER_AFTER_COPIED_ROWS:
                    batch.to_cluster.add(str(generation.table))
        if late.num_rows:
            with batch.timed(f"{model.name}: late events"):
                batch.append(late, generation.late_events, SHARED_LATE_EVENTS_TABLE, writer=model.name)
        if ledger.num_rows:
            with batch.timed(f"{model.name}: applied ledger"):
                batch.append(ledger, generation.applied, f"_applied/{model.name}")
    return write
