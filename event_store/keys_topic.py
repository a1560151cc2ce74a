"""The keys topic (issue 45, slice 5; docs/forgetting.md): the subjects' data keys and tombstones as the records of
a compacted Kafka topic, the truth every process's local key store (``event_store.personal_data.SubjectKeys``, its
files under the home) follows.

- **Order decides.** The topic has one partition: its records are in one order that every reader sees. A subject's
  first key in that order is its key; a later, different key (another machine made one at the same moment) lost and
  is ignored; a tombstone wins over a key and is never undone (``key_files.merge_record``).
- **A key is on the topic before any event sealed with it commits.** The command handler seals with keys it made
  in the transaction's memory (provisional), publishes them before it commits (``SubjectKeys.sync``) and reads the
  topic back: a key that lost to another instance's aborts the transaction, which is decided again with the winner.
- **Readers follow it**: once per batch at most every ``keys_topic_follow_s`` seconds (a forgetting elsewhere
  reaches them within that), and at once when they meet a subject their local store does not know (a machine that
  never held the home's files restores every key it needs from the topic). What was read is kept as a position
  in the key store's folder (``keys-topic.json``), so a restart reads only what came after; a store that lost
  records its position claims (a kill before its journal reached the disk) is filled by reading the topic from its
  start when a subject is missing.
- **A store's own records reach it**: a key store that holds records but never followed this topic (its home sealed
  with the topic off) publishes, on its first follow, what the topic does not hold (``KeysTopic._adopt``).
- **Key bytes leave the topic by compaction**: a tombstone is a record of its own (never Kafka's null), so
  compaction keeps it and drops the key before it; the topic's ``max.compaction.lag.ms`` bounds how long the
  bytes stay in the broker's segments (``keys_topic_compaction_lag_ms``, an hour by default).

The broker away: a periodic follow logs once and the process goes on with its local store; publishing fails (the
handler's transaction aborts and is tried again); a lookup of an unknown subject fails with the reason.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable, Iterable

import confluent_kafka

from event_store.kafka_clients import keys_reader, keys_writer, produce
from event_store.key_files import KeyRecord, merge_record
from lakehouse.errors import Unavailable
from lakehouse.settings import Settings, SettingsError

__all__ = ["KeysTopic", "KeysTopicError", "keys_topic_on", "POSITION_FILE"]

POSITION_FILE = "keys-topic.json"
# librdkafka's own lines (a refused connection, every retry) go here, not to stderr: the topic's owner says once
# that the topic cannot be read, with the reason.
_QUIET = logging.getLogger("eventlake.keys_topic.librdkafka")
_AWAY = (confluent_kafka.KafkaError._ALL_BROKERS_DOWN, confluent_kafka.KafkaError._TRANSPORT)


class KeysTopicError(Unavailable, RuntimeError):
    """The keys topic could not be read or written (the broker away, the topic missing, a refusal)."""


def keys_topic_on(settings: Settings) -> bool:
    """Whether key stores follow the keys topic (``subject_keys_topic``: "on", the default, or "off": the home's
    files alone, for a single machine)."""
    value = settings.subject_keys_topic
    if value not in ("on", "off"):
        raise SettingsError(f"setting subject_keys_topic={value!r}: expected on or off (EVENTLAKE_SUBJECT_KEYS_TOPIC)")
    return value == "on"


class KeysTopic:
    """One process's reader and writer of the keys topic of ``settings``."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        self.settings = settings
        self.name = settings.keys_topic
        self.log = log
        self.follow_every_s = settings.keys_topic_follow_s
        self.timeout_s = 10.0
        self._consumer: confluent_kafka.Consumer | None = None
        self._asker: confluent_kafka.Consumer | None = None
        self._producer: confluent_kafka.Producer | None = None
        self._position: int | None = None  # the next offset to read; None: not known yet (the folder's file)
        self._saved: int | None = None  # the position last written to the folder's file
        self._fetching_from: int | None = None  # where the assigned consumer's next record is
        self._due = 0.0  # monotonic time from which a periodic follow reads again
        self._said_unavailable = False

    def __repr__(self) -> str:
        return f"KeysTopic({self.name!r})"

    # -- writing --------------------------------------------------------------------------------------------------

    def publish(self, records: Iterable[KeyRecord]) -> None:
        """Write ``records`` to the topic and wait until the broker has them all (``acks=all``); KeysTopicError
        naming the topic and the reason otherwise."""
        records = list(records)
        if not records:
            return
        if self._producer is None:
            self._producer = keys_writer(self.settings, _QUIET)
        failed: list[str] = []

        def delivered(error, _message):
            if error is not None:
                failed.append(str(error))

        try:
            for record in records:
                key, value = record.encode()
                produce(self._producer, self.name, value, key, partition=0, on_delivery=delivered)
            left = self._producer.flush(self.timeout_s)
        except confluent_kafka.KafkaException as e:
            left, failed = -1, [str(e)]
        if left or failed:
            # A new producer for the next try: this one may hold them still, or be fenced for good (a fatal error).
            self._producer = None
            reason = failed[0] if failed else f"not acknowledged within {self.timeout_s:.0f}s"
            raise KeysTopicError(f"the keys topic {self.name}: {len(records)} key record(s) not written ({reason})")

    # -- reading --------------------------------------------------------------------------------------------------

    def follow(self, keys, force: bool = False, from_start: bool = False) -> bool:
        """Take the records written since the last read into ``keys`` (a ``SubjectKeys``); True if any. Without
        ``force`` at most every ``follow_every_s`` seconds, and a failure is logged once and skipped (the local
        store serves meanwhile); with it, a failure raises KeysTopicError. ``from_start``: read the whole topic."""
        now = time.monotonic()
        if not force and not from_start and now < self._due:
            return False
        asked = force or from_start
        # A store that never followed this topic but holds records (made with the topic off, or under another
        # topic's name) brings them to it: read from the topic's start, then what only these files hold published.
        if self._position is None and len(keys) and self._saved_position(keys.directory) is None:
            from_start, adopting = True, {record.subject: record for record in keys.records()}
        else:
            adopting = None
        try:
            records, position = self._read(keys.directory, from_start)
        except KeysTopicError as e:
            if asked:
                raise
            self._due = now + max(self.follow_every_s, 30.0)
            if not self._said_unavailable:
                self._said_unavailable = True
                self.log(f"subject keys: {e}; going on with the local key store {keys.directory} (tried again "
                         f"every 30s, said once)")
            return False
        self._said_unavailable = False
        self._due = now + self.follow_every_s
        if records:
            try:
                keys.take(records)
            except BaseException:
                self._fetching_from = None  # not taken: read again from the position before them
                raise
        if adopting:
            try:
                self._adopt(adopting, records)
            except KeysTopicError as e:
                self._fetching_from = None  # no position kept: read from the start again next time, and publish
                if asked:
                    raise
                self._due = now + max(self.follow_every_s, 30.0)
                self.log(f"subject keys: {e}; the key store {keys.directory}'s own records are published later")
                return bool(records)
        self._position = position
        self._save_position(keys.directory)
        return bool(records)

    def _adopt(self, local: dict[str, KeyRecord], on_topic: list[KeyRecord]) -> None:
        """Publish the ``local`` records the topic (``on_topic``: all of it, in order) does not hold: keys it does
        not know, tombstones of subjects it still has a key for. A subject the topic holds another key for is said
        (its values sealed here open only with these files)."""
        first: dict[str, KeyRecord] = {}
        for record in on_topic:
            merge_record(first, record)
        missing = [record for subject, record in local.items()
                   if subject not in first or (record.forgotten and not first[subject].forgotten)]
        differing = sorted(subject for subject, record in local.items() if not record.forgotten
                           and subject in first and not first[subject].forgotten and first[subject].key != record.key)
        self.publish(missing)
        if missing:
            self.log(f"subject keys: {len(missing)} record(s) that only the key store's files held published to the "
                     f"keys topic {self.name}")
        if differing:
            self.log(f"subject keys: {len(differing)} subject(s) (first: {differing[0]!r}) have another key on the "
                     f"keys topic {self.name} than in this key store: values this home sealed for them open only "
                     f"here; values sealed elsewhere, only with the topic's key")

    def _read(self, directory, from_start: bool) -> tuple[list[KeyRecord], int]:
        """The records from the position (or the topic's start) to its end, and the position after them."""
        tp = confluent_kafka.TopicPartition(self.name, 0)
        if self._consumer is None:
            self._consumer = keys_reader(self.settings, _QUIET)
            # The topic's ends are asked by a client of their own: the reader's connection holds a fetch waiting
            # at the broker, which answers a connection's requests in order (an ask behind it waited ~500 ms).
            self._asker = keys_reader(self.settings, _QUIET)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                low, high = self._asker.get_watermark_offsets(tp, timeout=self.timeout_s)
                break
            except confluent_kafka.KafkaException as e:
                error = e.args[0]
                # A topic just made, a leader moving (librdkafka does not always call these retriable): asked
                # again until the timeout. No broker at all: said now.
                if error.code() in _AWAY or time.monotonic() > deadline:
                    raise KeysTopicError(f"the keys topic {self.name} cannot be read ({error.str()})") from None
                time.sleep(0.1)
        if self._position is None:
            self._position = self._saved_position(directory)
        start = low if from_start or self._position is None or not low <= self._position <= high else self._position
        if start >= high:
            return [], start
        if start != self._fetching_from:
            # Assigned once and kept: librdkafka fetches ahead, so the next read finds what came in the local queue
            # (a handler reads the topic back in every transaction that made keys).
            self._consumer.assign([confluent_kafka.TopicPartition(self.name, 0, start)])
        records: list[KeyRecord] = []
        position = start
        try:
            deadline = time.monotonic() + self.timeout_s
            while position < high:
                if time.monotonic() > deadline:
                    raise KeysTopicError(f"the keys topic {self.name}: offsets {position}..{high} not read within "
                                         f"{self.timeout_s:.0f}s")
                # consume() waits until it has as many records as asked or the timeout passed: ask what is there.
                for message in self._consumer.consume(min(10_000, high - position), timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                            continue
                        raise KeysTopicError(f"the keys topic {self.name} cannot be read ({error.str()})")
                    position = message.offset() + 1
                    try:
                        records.append(KeyRecord.decode(message.key() or b"", message.value() or b""))
                    except (ValueError, UnicodeDecodeError) as e:  # BadInput is a ValueError
                        self.log(f"subject keys: record at offset {message.offset()} of {self.name} skipped: not a key "
                                 f"record ({e})")
                # Past offsets compaction removed: the consumer's own position moves over them.
                moved = self._consumer.position([confluent_kafka.TopicPartition(self.name, 0)])[0].offset
                position = max(position, moved)
        except BaseException:
            self._fetching_from = None  # what it consumed was not taken: assigned again at the position
            raise
        self._fetching_from = position
        return records, position  # the caller moves the position once it took the records

    def _saved_position(self, directory) -> int | None:
        try:
            doc = json.loads((directory / POSITION_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc.get("offset") if doc.get("topic") == self.name and isinstance(doc.get("offset"), int) else None

    def _save_position(self, directory) -> None:
        """The position read up to, beside the key store's files (a hint for the next process: not fsynced)."""
        if self._position is None or self._position == self._saved:
            return
        path = directory / POSITION_FILE
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = path.with_name(f".{POSITION_FILE}.{os.getpid()}")
            temporary.write_text(json.dumps({"topic": self.name, "offset": self._position}), encoding="utf-8")
            os.replace(temporary, path)
            self._saved = self._position
        except OSError as e:
            self.log(f"subject keys: could not record the keys topic's position in {path} ({e})")

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._asker.close()
            self._consumer = self._asker = None
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None
