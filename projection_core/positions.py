"""How far the log goes, and how far a projection is from it: the one owner of "caught up".

A transactional producer's batch ends in a commit marker: a control record that takes an offset but carries no data
and that no reader is handed. So after the command handler's last transaction the log's end offset (its last stable
offset) is one past a marker, not past a record: a reader that has read every record stands one short of it, and
a query whose batch ended at the log's end stands at it. Counted against the end offset, a caught-up projection
showed "lag 1 events", and a table whose batch ended past the marker looked ahead of the archive that ended at the
last record. Here the log's end is the offset after its last *record* (read with a ``read_committed`` reader,
backwards from the end), and a position past it is as caught up as one at it.
"""
from __future__ import annotations

import time
from typing import Mapping

from lakehouse.errors import Unavailable
from lakehouse.settings import Settings

__all__ = ["record_ends", "record_ends_or_none", "lag", "behind", "PositionsUnknown"]

_CALL_TIMEOUT_S = 10.0
_FIRST_WINDOW = 16  # offsets read back from the end first (a few markers, usually none); then 8 times more each turn


class PositionsUnknown(Unavailable, RuntimeError):
    """The broker did not tell where the log ends."""


def record_ends(settings: Settings, topic: str | None = None, timeout_s: float = 30.0) -> dict[int, int]:
    """Partition -> the offset after the partition's last committed record (transaction markers and aborted records
    are not records); a partition without a record: its first offset. Within about ``timeout_s`` (each call to the
    broker too), else ``PositionsUnknown`` or the client's error."""
    from confluent_kafka import KafkaError, TopicPartition

    from event_store import kafka_clients

    topic = topic or settings.events_topic
    consumer = kafka_clients.range_reader(settings, "positions")
    deadline = time.monotonic() + timeout_s
    call_s = min(_CALL_TIMEOUT_S, timeout_s)
    try:
        metadata = consumer.list_topics(topic, timeout=call_s).topics[topic]
        if metadata.error is not None:
            if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return {}  # not created yet: an empty log
            raise PositionsUnknown(f"topic {topic}: {metadata.error}")
        ends = {}
        for partition in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=call_s,
                                                       cached=False)
            window, end = _FIRST_WINDOW, None
            while end is None:
                start = max(low, high - window)
                consumer.assign([TopicPartition(topic, partition, start)])
                last = None
                while True:  # read to the partition's end (read_committed: its last stable offset)
                    if time.monotonic() > deadline:
                        raise PositionsUnknown(f"topic {topic} partition {partition}: no end within {timeout_s}s")
                    m = consumer.poll(min(1.0, call_s))
                    if m is None:
                        continue
                    error = m.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            break
                        if error.fatal() or error.code() == KafkaError._AUTO_OFFSET_RESET:
                            raise PositionsUnknown(f"topic {topic} partition {partition}: {error.str()}")
                        continue
                    last = m.offset()
                if last is not None:
                    end = last + 1
                elif start <= low:
                    end = low
                else:
                    window *= 8
            ends[partition] = end
        return ends
    finally:
        kafka_clients.close_within(consumer, min(5.0, timeout_s), "positions")


def record_ends_or_none(settings: Settings, topic: str | None = None) -> dict[int, int] | None:
    """``record_ends``, or None when the broker cannot be reached (the callers then say the lag is unknown)."""
    try:
        return record_ends(settings, topic)
    except Exception:  # the broker is down or refuses: show what the files say
        return None


def lag(committed: Mapping[int, int], ends: Mapping[int, int]) -> int:
    """Records in the log past ``committed`` (partition -> next offset to read): 0 for a position at or past the
    last record (a batch that ended after a transaction marker is not ahead of anything)."""
    return sum(max(0, end - committed.get(partition, 0)) for partition, end in ends.items())


def behind(position: Mapping[int, int], target: Mapping[int, int],
           ends: Mapping[int, int] | None = None) -> dict[int, int]:
    """The partitions where ``position`` has not reached ``target`` (partition -> offset, exclusive), with the
    target's offset: a target past the log's last record (``ends``, ``record_ends``) counts as that record's end,
    since the offsets between are markers only. Without ``ends``, offsets are compared as they are."""
    out = {}
    for partition, offset in target.items():
        needed = offset if ends is None or partition not in ends else min(offset, ends[partition])
        if position.get(partition, 0) < needed:
            out[partition] = offset
    return out
