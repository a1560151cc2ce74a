"""Structured Streaming's checkpoint log, the one place that reads and writes its format.

A query's checkpoint folder holds ``metadata`` (the query id, JSON), ``sources/0/0`` (a zero byte, the version line
and the Kafka source's first offsets), ``offsets/N`` (batch N's plan, written before it writes anything: the version
line, the batch's metadata with the session settings, then one JSON line per source: topic -> partition -> end
offset, exclusive) and ``commits/N`` (written once batch N is done: the version line and
``{"nextBatchWatermarkMs": ...}``). Both engines keep their queries' positions here in Spark's own format, so either
resumes from what the other wrote; ``eventlake status``, the reconciliation and the benchmarks read them here too.
``tests/integration/test_checkpoint_format.py`` holds this module to a checkpoint real Spark writes.
"""
from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from lakehouse.storage import location
from projection_core.errors import ProjectionError

__all__ = ["LOG_VERSION", "OFFSETS", "COMMITS", "METADATA", "SOURCES", "SPARK_OFFSET_CONF", "RETAINED_BATCHES",
           "Checkpoint", "batch_numbers", "committed_batches", "last_committed_batch", "batch_offsets",
           "offsets_total", "committed_at", "planned_at", "planned_not_committed", "initial_offsets"]

# Spark's metadata log format version: the first line of offsets/N, commits/N and sources/0/0.
LOG_VERSION = "v1"
OFFSETS, COMMITS, METADATA, SOURCES = "offsets", "commits", "metadata", "sources"
RETAINED_BATCHES = 100  # Spark keeps the last 100 batches' entries (spark.sql.streaming.minBatchesToRetain)
# The session settings Spark 4.2 records with every planned batch and reads back on a restart (a checkpoint the
# Python engine started has no Spark-written batch to copy them from): Spark's defaults, as its own offsets/N hold them.
SPARK_OFFSET_CONF = {
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


def batch_numbers(folder: Path) -> list[int]:
    """The batch numbers of a log folder (``offsets`` or ``commits``), in order; none for a missing folder."""
    folder = location(folder)
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def committed_batches(checkpoint: Path) -> list[int]:
    """The batches the checkpoint's commit log holds (the last ``RETAINED_BATCHES``), in order."""
    return batch_numbers(location(checkpoint) / COMMITS)


def last_committed_batch(checkpoint: Path) -> int | None:
    batches = committed_batches(checkpoint)
    return batches[-1] if batches else None


def batch_offsets(checkpoint: Path, batch: int, topic: str) -> dict[int, int] | None:
    """Partition -> end offset (exclusive) of ``batch`` for ``topic`` (None when not recorded)."""
    path = location(checkpoint) / OFFSETS / str(batch)
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:  # the version line, the batch's metadata, one line per source
        source = json.loads(line)
        if isinstance(source, dict) and topic in source:
            return {int(p): int(o) for p, o in source[topic].items()}
    return None


def offsets_total(checkpoint: Path, batch: int, topic: str) -> int:
    """``batch``'s end offsets summed over the topic's partitions (0 when not recorded)."""
    return sum((batch_offsets(checkpoint, batch, topic) or {}).values())


def committed_at(checkpoint: Path, batch: int) -> datetime:
    """When batch ``batch`` was committed (its commit log entry's time)."""
    return datetime.fromtimestamp((location(checkpoint) / COMMITS / str(batch)).stat().st_mtime, timezone.utc)


def planned_at(checkpoint: Path, batch: int) -> datetime:
    """When batch ``batch`` was planned (its offset log entry's time)."""
    return datetime.fromtimestamp((location(checkpoint) / OFFSETS / str(batch)).stat().st_mtime, timezone.utc)


def planned_not_committed(checkpoint: Path) -> list[int]:
    """The batches planned (``offsets/N``) after the last committed one: the batch a query is running, or was running
    when it stopped (its next start runs it again with exactly those offsets)."""
    last = last_committed_batch(checkpoint)
    return [n for n in batch_numbers(location(checkpoint) / OFFSETS) if last is None or n > last]


def initial_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """A checkpoint's first offsets (the Kafka source's ``sources/0/0``)."""
    lines = (location(checkpoint) / SOURCES / "0" / "0").read_text().lstrip("\0").splitlines()
    return {int(p): int(o) for p, o in json.loads(lines[1])[topic].items()}


class Checkpoint:
    """A Structured Streaming checkpoint's offset and commit logs, read and written the way Spark does (so Spark
    resumes from what this wrote, and this from what Spark wrote)."""

    def __init__(self, path, topic: str, shuffle_partitions: int):
        self.path, self.topic = Path(path), topic
        self.default_conf = {**SPARK_OFFSET_CONF, "spark.sql.shuffle.partitions": str(shuffle_partitions)}

    def last_committed(self) -> int | None:
        return last_committed_batch(self.path)

    def last_planned(self) -> int | None:
        numbers = batch_numbers(self.path / OFFSETS)
        return numbers[-1] if numbers else None

    def planned(self, batch: int) -> bool:
        return (self.path / OFFSETS / str(batch)).exists()

    def ends(self, batch: int) -> dict[int, int]:
        """The offsets batch ``batch`` ends at (exclusive), per partition of the topic."""
        lines = (self.path / OFFSETS / str(batch)).read_text().splitlines()
        if not lines or lines[0] != LOG_VERSION:
            raise ProjectionError(f"checkpoint {self.path}: offsets/{batch} is in a format this engine does not "
                                  f"read ({lines[:1]}); run the Spark engine")
        offsets = json.loads(lines[2])
        if set(offsets) != {self.topic}:
            raise ProjectionError(f"checkpoint {self.path} reads {', '.join(offsets)}, not {self.topic}")
        return {int(p): int(o) for p, o in offsets[self.topic].items()}

    def initial(self) -> dict[int, int]:
        """The first offsets (``sources/0/0``)."""
        return initial_offsets(self.path, self.topic)

    def _conf(self) -> dict:
        last = self.last_planned()
        if last is None:
            return dict(self.default_conf)
        lines = (self.path / OFFSETS / str(last)).read_text().splitlines()
        return json.loads(lines[1]).get("conf") or dict(self.default_conf)

    def _write(self, folder: str, name: str, text: str) -> None:
        where = self.path / folder
        where.mkdir(parents=True, exist_ok=True)
        partial = where / f".{name}.tmp"
        partial.write_text(text)
        partial.replace(where / name)  # atomic: a crash leaves no half-written log entry

    def start(self, starts: dict[int, int]) -> None:
        """A new checkpoint: its query id and the Kafka source's first offsets (Spark's ``sources/0/0``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / METADATA).exists():
            (self.path / METADATA).write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        if not (self.path / SOURCES / "0" / "0").exists():
            # A zero byte first, as Spark's Kafka source writes it (read back by Spark 2.1 too).
            self._write(f"{SOURCES}/0", "0", "\0" + LOG_VERSION + "\n" + json.dumps(
                {self.topic: {str(p): o for p, o in sorted(starts.items())}}))

    def plan(self, batch: int, ends: dict[int, int]) -> None:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": self._conf()}
        self._write(OFFSETS, str(batch), "\n".join([
            LOG_VERSION, json.dumps(meta, separators=(",", ":")),
            json.dumps({self.topic: {str(p): o for p, o in sorted(ends.items())}}, separators=(",", ":"))]))

    def commit(self, batch: int) -> None:
        self._write(COMMITS, str(batch), LOG_VERSION + "\n" + json.dumps({"nextBatchWatermarkMs": 0}))
        for folder in (OFFSETS, COMMITS):  # Spark keeps the last 100 (minBatchesToRetain)
            for old in batch_numbers(self.path / folder):
                if old >= batch - RETAINED_BATCHES:
                    break
                (self.path / folder / str(old)).unlink(missing_ok=True)
