"""The commands topic's handled records deleted, so the plain personal data commands carry leaves the brokers'
disks (issue 45, docs/forgetting.md "Commands in clear").

Commands arrive in clear: a client cannot seal a value under its subject's key, since only the handler knows which
customer an account belongs to. The commands topic would keep them for its retention (7 days). Once the handler has
handled a command (its group's committed offset is past it) the record serves no one: its answer is on the results
topic, its events on the events topic, and the handler's idempotency window is in its own state. So ``eventlake
forget`` deletes every handled command (:func:`purge_handled_commands`), in three steps per partition:

1. **Roll.** A record is only ever deleted with its whole segment, and the broker never deletes the segment it
   appends to. So the topic's ``segment.ms`` is set to 1 ms for a moment and one empty record is appended to each
   partition in a transaction that is then aborted (every reader of the commands topic reads committed records
   only, so none sees it): the append rolls the partition's segment, and every command before it now sits in a
   closed one. ``segment.ms`` goes back to :data:`SEGMENT_MS` at once (a run killed in between leaves 1 ms, which
   rolls a segment per append: the next run puts it back first).
2. **Wait** (up to ``wait_s``) until the handler's committed offset reaches the roll on every partition.
3. **Delete** (Kafka's DeleteRecords) up to the roll, or up to the handler's committed offset where it had not
   reached it: the partition's log start moves past every handled command and, at the broker's next retention
   check (``log.retention.check.interval.ms``: 5 minutes by default, 10 s on eventlake's local broker) and
   ``file.delete.delay.ms`` later (1 s on the commands topic), the closed segments' files are gone.

A command the handler had not handled stays (deleting it would lose it), and with it the bytes of its segment:
the purge says so, and is complete only when every partition's records before the roll went.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Callable

import confluent_kafka
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from event_store.kafka_access import check_access
from event_store.kafka_clients import aborting_producer, admin_client, offsets_reader, range_reader
from event_store.kafka_log import COMMANDS_FILE_DELETE_DELAY_MS as FILE_DELETE_DELAY_MS
from event_store.kafka_log import COMMANDS_SEGMENT_MS as SEGMENT_MS
from lakehouse.faults import fault_point
from lakehouse.settings import Settings

__all__ = ["CommandsPurge", "purge_handled_commands"]

_ROLL_MS = "1"
_TIMEOUT_S = 30.0
_COORDINATOR_MOVING = {confluent_kafka.KafkaError.NOT_COORDINATOR, confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
                       confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS}


@dataclass(frozen=True)
class CommandsPurge:
    """What :func:`purge_handled_commands` did on the commands topic: per partition the offset its records were
    deleted before, and the partitions where commands the handler had not handled (from the offset given) keep
    their segment."""
    topic: str
    deleted_before: dict[int, int]  # partition -> new log start offset
    offsets_deleted: int
    unhandled: dict[int, int]  # partition -> the handler's committed offset, short of the roll
    dry_run: bool = False
    error: str = ""  # why nothing was deleted (the broker away, access refused)

    @property
    def complete(self) -> bool:
        return not self.unhandled and not self.dry_run and not self.error

    def line(self) -> str:
        if self.dry_run:
            return f"commands topic {self.topic}: handled commands would be deleted"
        if self.error:
            return f"commands topic {self.topic}: handled commands not deleted: {self.error}"
        out = (f"commands topic {self.topic}: the handled commands deleted ({self.offsets_deleted:,} offsets on "
               f"{len(self.deleted_before)} partition(s), earlier purges' aborted records among them); the broker "
               f"removes their files at its next retention check")
        if self.unhandled:
            left = ", ".join(f"{p} (handled up to {o:,})" for p, o in sorted(self.unhandled.items()))
            out += (f"; partitions with commands not yet handled keep their segment: {left} (run again once the "
                    f"handler has caught up)")
        return out


def purge_handled_commands(settings: Settings, wait_s: float = 60.0, dry_run: bool = False,
                           log: Callable[[str], None] = print) -> CommandsPurge:
    """Delete every record of the commands topic the handler has handled (module docstring). A broker that does
    not answer or refuses is named in the result (not complete), not raised."""
    topic = settings.commands_topic
    if dry_run:
        return CommandsPurge(topic, {}, 0, {}, dry_run=True)
    try:
        check_access(settings, timeout_s=5.0)
        purge = _purge(settings, topic, wait_s)
    except Exception as e:  # noqa: BLE001 -- named in the report; the run is not complete and is run again
        purge = CommandsPurge(topic, {}, 0, {}, error=f"{type(e).__name__}: {e}")
    log(f"forget: {purge.line()}")
    return purge


def _purge(settings: Settings, topic: str, wait_s: float) -> CommandsPurge:
    admin = admin_client(settings)
    partitions = sorted(admin.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions)
    starts = _offsets(admin, topic, partitions, confluent_kafka.admin.OffsetSpec.earliest())
    _set_segment_ms(admin, topic, _ROLL_MS)
    try:
        fault_point("commands-roll-on")
        rolled = _roll(settings, topic, partitions)
    finally:
        _set_segment_ms(admin, topic, str(SEGMENT_MS))
    holding = {p: o for p, o in rolled.items() if o > starts[p]}  # partitions with records before the roll
    handled = _wait_handled(settings, topic, holding, starts, wait_s) if holding else {}
    upto = {p: min(o, handled.get(p, 0)) for p, o in holding.items()}
    doomed = {p: o for p, o in upto.items() if o > starts[p]}
    if doomed:
        futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in doomed.items()],
                                       request_timeout=_TIMEOUT_S)
        for future in futures.values():
            future.result(timeout=_TIMEOUT_S)
    unhandled = {p: handled.get(p, 0) for p, o in holding.items() if handled.get(p, 0) < o}
    return CommandsPurge(topic, doomed, sum(o - starts[p] for p, o in doomed.items()), unhandled)


def _offsets(admin, topic: str, partitions: list[int], spec) -> dict[int, int]:
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions}, request_timeout=_TIMEOUT_S)
    return {tp.partition: future.result(timeout=_TIMEOUT_S).offset for tp, future in futures.items()}


def _set_segment_ms(admin, topic: str, value: str) -> None:
    """Set the topic's ``segment.ms`` (and its ``file.delete.delay.ms``, for a topic made before it was set), then
    wait until the broker serves it: it applies a topic's config a moment after the controller took it."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("segment.ms", value, incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("file.delete.delay.ms", str(FILE_DELETE_DELAY_MS), incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource], request_timeout=_TIMEOUT_S).values():
        future.result(timeout=_TIMEOUT_S)
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)],
                                           request_timeout=_TIMEOUT_S)
        if next(iter(described.values())).result(timeout=_TIMEOUT_S)["segment.ms"].value == value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: segment.ms={value} not in force after {_TIMEOUT_S:.0f} s")
        time.sleep(0.1)


def _roll(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """Append one empty record to each partition in an aborted transaction; -> the offset of each (the first
    offset of the partition's new segment)."""
    time.sleep(0.2)  # the config is served before every broker's logs took it: leave them a moment
    producer = aborting_producer(settings, f"{settings.topic_prefix}eventlake-purge-{uuid.uuid4().hex[:12]}")
    offsets: dict[int, int] = {}

    def delivered(error, message) -> None:
        if error is not None:
            raise confluent_kafka.KafkaException(error)
        offsets[message.partition()] = message.offset()

    producer.init_transactions(_TIMEOUT_S)
    producer.begin_transaction()
    for p in partitions:
        producer.produce(topic, value=b"", partition=p, on_delivery=delivered,
                         headers={"eventlake": b"segment roll (aborted: no reader sees it)"})
    producer.flush(_TIMEOUT_S)
    producer.abort_transaction(_TIMEOUT_S)
    missing = set(partitions) - set(offsets)
    if missing:
        raise TimeoutError(f"{topic}: the roll's record was not written to partitions {sorted(missing)}")
    return offsets


def _nothing_to_read(settings: Settings, topic: str, froms: dict[int, int], rolled: dict[int, int]) -> dict[int, int]:
    """The partitions of ``froms`` (partition -> the handler's offset) where no committed record lies between that
    offset and the roll (only aborted records and transaction markers, which no reader sees) -> the roll's offset."""
    if not froms:
        return {}
    reader = range_reader(settings, "commands-purge")
    try:
        reader.assign([TopicPartition(topic, p, o) for p, o in froms.items()])
        undecided, clear = set(froms), {}
        deadline = time.monotonic() + _TIMEOUT_S
        while undecided and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None or message.partition() not in undecided:
                continue
            error = message.error()
            if error is not None and error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                raise confluent_kafka.KafkaException(error)
            p = message.partition()
            undecided.discard(p)
            # A record, or the end a read_committed reader sees (the first record of a transaction still open, if
            # any): at or past the roll, nothing a reader would see lies before it.
            if message.offset() >= rolled[p]:
                clear[p] = rolled[p]
        return clear
    finally:
        reader.close()


def _wait_handled(settings: Settings, topic: str, rolled: dict[int, int], starts: dict[int, int],
                  wait_s: float) -> dict[int, int]:
    """Per partition the offset up to which the handler has handled the commands: its group's committed offset,
    or the roll's where only records no reader sees lie between the two (an idle handler's offset stays before an
    earlier purge's aborted record); once every partition reached ``rolled`` or ``wait_s`` passed."""
    reader = offsets_reader(settings, settings.handler_group_id)
    try:
        start = time.monotonic()
        while True:
            try:
                committed = {tp.partition: tp.offset for tp in
                             reader.committed([TopicPartition(topic, p) for p in rolled], timeout=_TIMEOUT_S)
                             if tp.offset >= 0}
            except confluent_kafka.KafkaException as e:  # e.g. the group's coordinator moving or still loading
                if (not (e.args[0].retriable() or e.args[0].code() in _COORDINATOR_MOVING)
                        or time.monotonic() - start >= _TIMEOUT_S):
                    raise
                time.sleep(0.5)
                continue
            short = {p: max(committed.get(p, 0), starts[p]) for p, o in rolled.items() if committed.get(p, -1) < o}
            committed.update(_nothing_to_read(settings, topic, short, rolled))
            if all(committed.get(p, -1) >= o for p, o in rolled.items()) or time.monotonic() - start >= wait_s:
                return committed
            time.sleep(0.5)
    finally:
        reader.close()
