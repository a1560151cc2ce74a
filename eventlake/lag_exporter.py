"""``eventlake lag-exporter``: how far each consumer of the log is behind it, watched from outside (issue 44).

A service's own ``/metrics`` goes when the service goes, so its lag cannot rise while it is stopped; and a
projection's Structured Streaming queries commit no offsets to a consumer group, so Kafka's lag exporters cannot see
it. This service reads the committed positions where they are kept, every ``every_s`` seconds:

- each projection's queries: the end offsets of the last batch their checkpoint's commit log holds
  (``projection_core.checkpoint``, the same files either engine resumes from); a checkpoint that does not exist yet
  stands at the log's start, so a projection that was never started shows the whole log waiting;
- the consumer groups of the handler (commands topic), the fraud policy and the fraud detector (events topic): their
  committed offsets (asked by a consumer in the group's name that never joins it; librdkafka 2.16's admin call for
  them crashed the process on a broker whose offsets topic was not created yet); a group that has committed nothing
  is not shown;

and compares them with each topic's end, counted in records: the events topic's is the offset after its last record
(``projection_core.positions.record_ends``: the handler's transaction markers are no records); the commands topic,
written without transactions, ends at its high watermark (asked of the broker: no command is read). It serves
``eventlake_committed_lag_records{consumer, topic, partition}``, how long the oldest record past each position has
waited (``WaitingSince``), the committed offsets and the log's end offsets, the time each projection last
committed, and each of their tables' last commit (``TableCommits``). A refresh the broker does not
answer is counted and said once; the figures stay as the last refresh left them, and their refresh time says how
old they are.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lakehouse.errors import BadInput
from lakehouse.metrics import Sample
from lakehouse.settings import Settings

__all__ = ["LagExporterError", "Position", "Snapshot", "LagExporter", "TableCommits", "WaitingSince",
           "projection_checkpoints", "projection_tables", "group_topics", "group_positions", "with_waiting_since",
           "high_watermarks", "figures", "lines"]

DEFAULT_EVERY_S = 10.0
# Each read of a refresh waits at most this long for the broker (a healthy one answers in milliseconds), and the
# refresh stops between reads once the exporter is asked to stop: so it stops within seconds with the broker away.
CALL_TIMEOUT_S = 5.0
CLOSE_WITHIN_S = 2.0


class LagExporterError(BadInput, ValueError):
    """An option the exporter cannot work with (an unknown read model, a refresh period of no time)."""


@dataclass(frozen=True)
class Position:
    """Where one consumer stands on one topic: ``committed`` (partition -> next offset to read)."""
    consumer: str
    kind: str  # "projection" (a checkpoint) or "group" (a consumer group)
    topic: str
    committed: dict[int, int]
    committed_at: float | None = None  # a projection's last commit (Unix time); None: none yet, or a group
    # partition -> when the oldest record past ``committed`` was written (its Kafka timestamp, Unix time); only
    # partitions where records wait and that record could be read
    waiting_since: dict[int, float] = field(default_factory=dict)


@dataclass
class Snapshot:
    """The last refresh: the positions, the log's ends per topic, when, and the refreshes so far."""
    positions: list[Position] = field(default_factory=list)
    ends: dict[str, dict[int, int]] = field(default_factory=dict)
    refreshed_at: float | None = None
    refreshes: int = 0
    failures: int = 0
    tables: dict[str, float] = field(default_factory=dict)  # table -> its last commit (Unix time)


def _plans(settings: Settings, projections: list[list[str]]) -> list:
    """The plans of the projections ``eventlake project NAMES...`` runs, one list of names per projection (an empty
    list: the default projection, every read model plus the archive's query)."""
    import read_models
    from projection_core.plan import ProjectionPlan
    from read_models.catalog import ARCHIVE_TABLE

    plans = []
    for names in projections or [[]]:
        named = [n for n in names if n != ARCHIVE_TABLE]
        try:
            models = read_models.select(named) if named else ([] if names else None)
        except KeyError as e:
            raise LagExporterError(f"lag-exporter: --projection {','.join(names)}: {e.args[0]}") from None
        plans.append(ProjectionPlan(settings, models, archive=not names or ARCHIVE_TABLE in names,
                                    log=lambda _: None))
    return plans


def projection_checkpoints(settings: Settings, projections: list[list[str]]) -> dict[str, Path]:
    """The checkpoints of the projections (``_plans``): checkpoint name -> folder."""
    from projection_core.plan import ARCHIVE_QUERY

    out = {}
    for plan in _plans(settings, projections):
        if plan.models:
            out[plan.name] = plan.checkpoint
        if plan.archive:
            out[ARCHIVE_QUERY] = plan.archive_checkpoint
    return out


def projection_tables(settings: Settings, projections: list[list[str]]) -> list[str]:
    """The tables the projections (``_plans``) write: their read models, and the archive when one archives."""
    from read_models.catalog import ARCHIVE_TABLE

    plans = _plans(settings, projections)
    names = list(dict.fromkeys(m.name for plan in plans for m in plan.models))
    return names + ([ARCHIVE_TABLE] if any(plan.archive for plan in plans) else [])


class TableCommits:
    """When each table last committed, read from its Delta log (``deltalake``: the newest commit's timestamp; each
    table's log is followed incrementally): a read model's current generation (from the catalog: a rebuild's switch
    moves it), the archive at its fixed place. A table not created yet is left out; one that cannot be read is said
    once and left out until it can."""

    def __init__(self, settings: Settings, names: list[str], log: Callable[[str], None]):
        self.settings, self.names, self.log = settings, names, log
        self._tables: dict[str, object] = {}  # location -> DeltaTable, for the current locations only
        self._failing: set[str] = set()
        self._catalog = None

    def locations(self) -> dict[str, object]:
        from read_models.catalog import ARCHIVE_TABLE, Catalog

        if self._catalog is None:
            self._catalog = Catalog(self.settings)  # kept: it reads the catalog again only when it changed
        models = [n for n in self.names if n != ARCHIVE_TABLE]
        out = {name: g.table for name, g in self._catalog.current_all(models).items()} if models else {}
        if ARCHIVE_TABLE in self.names:
            out[ARCHIVE_TABLE] = self.settings.table_path(ARCHIVE_TABLE)
        return out

    def read(self) -> dict[str, float]:
        """table -> its last commit (Unix time)."""
        from lakehouse.storage import delta_table

        out, tables = {}, {}
        try:
            locations = self.locations()
        except Exception as e:  # the catalog mid-write or unreadable
            if "_catalog" not in self._failing:
                self.log(f"lag-exporter: cannot read the catalog ({type(e).__name__}: {e}); the tables' last "
                         f"commits are left out until it can")
            self._failing.add("_catalog")
            return {}
        self._failing.discard("_catalog")
        for name, location in locations.items():
            key = str(location)
            try:
                table = self._tables.get(key)
                if table is None:
                    from deltalake.exceptions import TableNotFoundError

                    try:
                        table = delta_table(location)
                    except TableNotFoundError:
                        continue  # not created yet
                else:
                    table.update_incremental()
                tables[key] = table
                out[name] = table.history(1)[0]["timestamp"] / 1000.0
            except Exception as e:  # a log mid-write or unreadable: said once, tried again at the next refresh
                if name not in self._failing:
                    self.log(f"lag-exporter: cannot read table {name}'s last commit at {location} "
                             f"({type(e).__name__}: {e}); trying again at each refresh")
                self._failing.add(name)
                continue
            if name in self._failing:
                self.log(f"lag-exporter: table {name}'s last commit read again")
                self._failing.discard(name)
        self._tables = tables
        return out


def group_topics(settings: Settings) -> dict[str, str]:
    """The consumer groups of eventlake's services -> the topic each reads."""
    return {settings.handler_group_id: settings.commands_topic, settings.policy_group_id: settings.events_topic,
            settings.fraud_detector_group: settings.events_topic}


def checkpoint_position(name: str, checkpoint: Path, topic: str) -> Position:
    from projection_core import checkpoint as checkpoint_log

    commits = checkpoint_log.committed_batches(checkpoint)
    if not commits:
        return Position(name, "projection", topic, {})
    last = commits[-1]
    return Position(name, "projection", topic, checkpoint_log.batch_offsets(checkpoint, last, topic) or {},
                    checkpoint_log.committed_at(checkpoint, last).timestamp())


def group_positions(readers: dict, ends: dict[str, dict[int, int]], timeout_s: float = 10.0) -> list[Position]:
    """Each group's committed offsets on its topic's partitions (``ends``: topic -> partition -> end), asked through
    ``readers`` (group -> (a consumer in that group that never joins it, its topic)); groups that committed none are
    left out."""
    from confluent_kafka import TopicPartition

    out = []
    for group, (consumer, topic) in readers.items():
        partitions = [TopicPartition(topic, p) for p in sorted(ends.get(topic, {}))]
        committed = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=timeout_s)
                     if tp.error is None and tp.offset >= 0} if partitions else {}
        consumer.poll(0)  # serves the client's queued events (errors while the broker was away): none piles up
        if committed:
            out.append(Position(group, "group", topic, committed))
    return out


def high_watermarks(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Partition -> the offset after the last record of a topic written without transactions (no command is read:
    describing the topic is enough). Not ``event_store.kafka_log.end_offsets``: its kafka-python client may wait
    minutes for an absent broker, where a service must stay stoppable within seconds."""
    from confluent_kafka import TopicPartition

    from event_store import kafka_clients

    consumer = kafka_clients.range_reader(settings, "lag-exporter")
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)[1]
                for p in sorted(metadata.partitions)}
    finally:
        kafka_clients.close_within(consumer, 5.0, "lag-exporter")


class WaitingSince:
    """When the oldest record past each position was written: its Kafka timestamp, read by one consumer assigned
    at the position (``kafka_clients.peek_reader``). Below its end the log does not change, so what is read is
    kept while the position stays (only the current positions' are kept): a consumer that keeps still costs no
    read. A record that cannot be read leaves its figure out, said once."""

    def __init__(self, settings: Settings, log: Callable[[str], None], timeout_s: float = CALL_TIMEOUT_S):
        self.settings, self.log, self.timeout_s = settings, log, timeout_s
        self._consumer = None
        self._seen: dict[tuple[str, int, int], float] = {}
        self._failing = False

    def read(self, wanted: set[tuple[str, int, int]]) -> dict[tuple[str, int, int], float]:
        """(topic, partition, offset) -> the timestamp of the first record at or after it (Unix time)."""
        from event_store import kafka_clients

        seen = {key: self._seen[key] for key in wanted if key in self._seen}
        for key in sorted(wanted - seen.keys()):
            try:
                at = self._peek(*key)
            except Exception as e:  # the broker away or refusing: the others wait for the next refresh
                if not self._failing:
                    self.log(f"lag-exporter: cannot read the record at {key[0]} partition {key[1]} offset {key[2]} "
                             f"({type(e).__name__}: {e}); the lag in seconds is left out where it is not known")
                self._failing = True
                # The next refresh reads with a new consumer: after a broker restart a consumer by assignment can
                # stay silent until it is recreated (librdkafka#5153; python_engine/reader.py renews for it too).
                kafka_clients.close_all_within(self.detach(), 5.0, "lag-exporter")
                break
            self._failing = False
            if at is not None:
                seen[key] = at
        self._seen = seen
        return seen

    def _peek(self, topic: str, partition: int, offset: int) -> float | None:
        from confluent_kafka import KafkaError, TopicPartition

        from event_store import kafka_clients

        if self._consumer is None:
            self._consumer = kafka_clients.peek_reader(self.settings, "lag-exporter")
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < deadline:
                m = self._consumer.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        return None  # nothing waits there (any more)
                    raise RuntimeError(m.error().str())
                return m.timestamp()[1] / 1000.0
            raise TimeoutError(f"no record within {self.timeout_s:g} s")
        finally:
            self._consumer.unassign()

    def detach(self) -> list:
        """Its consumer, for the owner to close (none once detached)."""
        consumers, self._consumer = [self._consumer] if self._consumer is not None else [], None
        return consumers


def with_waiting_since(positions: list[Position], ends: dict[str, dict[int, int]], waiting: WaitingSince
                       ) -> list[Position]:
    """``positions`` with, where records wait past them, when the oldest of those was written."""
    import dataclasses

    from projection_core.positions import lag

    behind = {(p.topic, partition, p.committed.get(partition, 0))
              for p in positions for partition, end in ends.get(p.topic, {}).items()
              if lag({partition: p.committed.get(partition, 0)}, {partition: end})}
    seen = waiting.read(behind)
    return [dataclasses.replace(p, waiting_since={
        partition: seen[key] for partition in ends.get(p.topic, {})
        if (key := (p.topic, partition, p.committed.get(partition, 0))) in seen}) for p in positions]


def figures(snapshot: Snapshot) -> list[Sample]:
    """The exporter's Prometheus figures (``lakehouse.metrics``) from its last refresh."""
    from projection_core.positions import lag

    g = "gauge"
    out = [Sample("lag_exporter_refreshes", "counter", "Refreshes of the committed positions and the log's end",
                  snapshot.refreshes, {"result": "ok"}),
           Sample("lag_exporter_refreshes", "counter", "Refreshes of the committed positions and the log's end",
                  snapshot.failures, {"result": "failed"})]
    if snapshot.refreshed_at is not None:
        out.append(Sample("lag_exporter_last_refresh_timestamp_seconds", g,
                          "When the figures below were read (Unix time)", snapshot.refreshed_at))
    for topic, ends in sorted(snapshot.ends.items()):
        out += [Sample("log_end_offset", g, "The offset after the partition's last record", end,
                       {"topic": topic, "partition": str(p)}) for p, end in sorted(ends.items())]
    for position in snapshot.positions:
        ends = snapshot.ends.get(position.topic, {})
        labels = {"consumer": position.consumer, "kind": position.kind, "topic": position.topic}
        for partition, end in sorted(ends.items()):
            at = {**labels, "partition": str(partition)}
            behind = lag({partition: position.committed.get(partition, 0)}, {partition: end})
            out.append(Sample("committed_lag_records", g, "Records in the log past the consumer's committed position",
                              behind, at))
            out.append(Sample("committed_offset", g, "The consumer's committed position (the next offset to read)",
                              position.committed.get(partition, 0), at))
            if not behind or partition in position.waiting_since:
                waited = 0.0 if not behind else max(0.0, snapshot.refreshed_at - position.waiting_since[partition])
                out.append(Sample("committed_lag_seconds", g, "How long the oldest record past the consumer's "
                                  "committed position has waited (its Kafka timestamp to the refresh; 0: none "
                                  "waits)", waited, at))
        if position.committed_at is not None:
            out.append(Sample("committed_timestamp_seconds", g, "When the projection last committed a batch "
                              "(Unix time)", position.committed_at, labels))
    out += [Sample("table_last_commit_timestamp_seconds", g, "When the table last committed (its Delta log's newest "
                   "commit, Unix time): a read model's current generation, or the archive", at, {"table": table})
            for table, at in sorted(snapshot.tables.items())]
    return out


class LagExporter:
    """Refresh the positions every ``every_s`` seconds until ``stop()``; ``figures()`` serves the last refresh."""

    def __init__(self, settings: Settings, projections: list[list[str]] | None = None,
                 every_s: float = DEFAULT_EVERY_S, log: Callable[[str], None] = print):
        if every_s <= 0:
            raise LagExporterError(f"lag-exporter: --every {every_s:g}: expected a number of seconds above 0")
        self.settings, self.every_s, self.log = settings, every_s, log
        self.checkpoints = projection_checkpoints(settings, projections or [])
        self.tables = TableCommits(settings, projection_tables(settings, projections or []), log)
        self.waiting = WaitingSince(settings, log)
        self.groups = group_topics(settings)
        self.snapshot = Snapshot()
        self._stopping = threading.Event()
        self._failing = False
        self._readers = None

    def figures(self) -> list[Sample]:
        return figures(self.snapshot)

    def _group_readers(self) -> dict:
        """A consumer per group, for the exporter's life (it reconnects by itself after a broker restart): in the
        group's name to ask its committed offsets, never subscribing (it joins no group, takes no partition)."""
        if self._readers is None:
            from event_store import kafka_clients

            self._readers = {group: (kafka_clients.offsets_reader(self.settings, group), topic)
                             for group, topic in self.groups.items()}
        return self._readers

    def close(self) -> None:
        """Close its consumers side by side, leaving behind any close that hangs on an absent broker after
        ``CLOSE_WITHIN_S``."""
        from event_store import kafka_clients

        consumers = [consumer for consumer, _ in (self._readers or {}).values()] + self.waiting.detach()
        self._readers = None
        kafka_clients.close_all_within(consumers, CLOSE_WITHIN_S, "lag-exporter")

    def stop(self) -> None:
        self._stopping.set()

    def refresh(self) -> bool:
        """Read every position and the log's ends once. -> whether the broker answered."""
        from projection_core.positions import record_ends

        try:
            topics = sorted(set(self.groups.values()) | {self.settings.events_topic})
            ends = {}
            for topic in topics:
                if self._stopping.is_set():
                    return False
                ends[topic] = (record_ends(self.settings, topic, timeout_s=CALL_TIMEOUT_S)
                               if topic == self.settings.events_topic
                               else high_watermarks(self.settings, topic, timeout_s=CALL_TIMEOUT_S))
            positions = [checkpoint_position(name, path, self.settings.events_topic)
                         for name, path in self.checkpoints.items()]
            if self._stopping.is_set():
                return False
            positions += group_positions(self._group_readers(), ends, timeout_s=CALL_TIMEOUT_S)
            if self._stopping.is_set():
                return False
            positions = with_waiting_since(positions, ends, self.waiting)
        except Exception as e:  # the broker away or refusing, a checkpoint mid-write: said once, tried again
            self.snapshot.failures += 1
            if not self._failing:
                self.log(f"lag-exporter: cannot read the positions ({type(e).__name__}: {e}); the figures stay as "
                         f"the last refresh left them; trying again every {self.every_s:g} s")
            self._failing = True
            return False
        if self._failing:
            self.log("lag-exporter: positions read again")
        self._failing = False
        tables = self.tables.read()
        self.snapshot = Snapshot(positions, ends, time.time(), self.snapshot.refreshes + 1, self.snapshot.failures,
                                 tables)
        return True

    def run(self, once: bool = False) -> Snapshot:
        self.log(f"lag-exporter: watching {', '.join([*self.checkpoints, *self.groups])} every {self.every_s:g} s")
        try:
            while not self._stopping.is_set():
                self.refresh()
                if once:
                    break
                self._stopping.wait(self.every_s)
        finally:
            self.close()
        return self.snapshot


def lines(snapshot: Snapshot) -> list[str]:
    """The last refresh for a person at a terminal (``eventlake lag-exporter --once``)."""
    from projection_core.positions import lag

    if snapshot.refreshed_at is None:
        return ["lag-exporter: the positions could not be read (the broker did not answer)"]
    out = []
    for p in snapshot.positions:
        behind = lag(p.committed, snapshot.ends.get(p.topic, {}))
        waited = f", the oldest waiting {snapshot.refreshed_at - min(p.waiting_since.values()):,.0f} s" \
            if behind and p.waiting_since else ""
        since = "" if p.committed_at is None else f", last commit {time.time() - p.committed_at:,.0f} s ago"
        out.append(f"{p.consumer} ({p.kind}, {p.topic}): {behind:,} record(s) behind{waited}{since}")
    out += [f"table {table}: last commit {time.time() - at:,.0f} s ago" for table, at in sorted(snapshot.tables.items())]
    return out
