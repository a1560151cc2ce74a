"""The client API of the write side: submit commands, get their results.

``EventStore.submit(command)`` sends one command and (by default) waits for its result, correlated by
``command_id`` on the command-results topic. ``submit_many`` is the bulk path: send many without waiting,
then optionally wait for all results. Results are read with ``read_committed``, so a result is only seen
once its events are committed.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from kafka import TopicPartition

from event_store import kafka_clients, kafka_log
from event_store.envelope import CommandEnvelope, CommandResult
from event_store.errors import InvalidRecord
from lakehouse.settings import Settings

__all__ = ["command_id_needles", "EventStore", "as_command"]


def as_command(command: CommandEnvelope | Mapping[str, Any]) -> CommandEnvelope:
    """A validated command from an envelope or a JSON-like dict (``command_id`` is generated when missing), whose
    every text can be sent (encoded as UTF-8: the record's key is its aggregate id's bytes)."""
    command = _as_command(command)
    _refuse_unencodable(command.to_dict())
    return command


def _refuse_unencodable(value: Any, path: tuple = ()) -> None:
    """InvalidRecord naming the field, when a text in ``value`` (a value or a field name, at any depth) cannot be
    encoded as UTF-8: a lone surrogate (U+D800..U+DFFF), which valid JSON can spell (``"\\ud800"``) but no UTF-8
    byte sequence holds."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            where = ".".join(map(str, path))
            code = ord(value[e.start])
            raise InvalidRecord(
                f"command: field '{where}' = {value[:40]!r} cannot be sent: it holds a lone surrogate U+{code:04X} "
                f"at character {e.start + 1} (one half of a UTF-16 pair, e.g. a JSON \\u{code:04x} escape without "
                f"its other half), which UTF-8 cannot encode") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _refuse_unencodable(key, (*path, "(a field name)"))
            _refuse_unencodable(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_unencodable(item, (*path, i))


def _as_command(command: CommandEnvelope | Mapping[str, Any]) -> CommandEnvelope:
    if isinstance(command, CommandEnvelope):
        return command
    if not isinstance(command, Mapping):
        raise InvalidRecord(f"command: expected a JSON object, got {type(command).__name__}")
    obj = dict(command)
    if not obj.get("command_id"):
        return CommandEnvelope.create(obj.get("command_type"), obj.get("aggregate_id"), obj.get("payload"),
                                      **{k: v for k, v in obj.items()
                                         if k in ("expected_version", "correlation_id", "causation_id",
                                                  "issued_at") and v is not None})
    return CommandEnvelope.from_dict(obj)


class EventStore:
    """Send commands to the commands topic and read their results. Use as a context manager, or ``close()``."""

    def __init__(self, settings: Settings, ensure_topics: bool = True):
        self.settings = settings
        if ensure_topics:
            kafka_log.ensure_topics(settings, log=lambda *_: None)
        self._producer = kafka_log.make_producer(settings)
        self._results = kafka_log.make_consumer(settings)
        partitions = [TopicPartition(settings.results_topic, p)
                      for p in sorted(self._results.partitions_for_topic(settings.results_topic) or ())]
        self._results.assign(partitions)
        # Results are only looked for after this point: anything sent from now on is answered after it.
        self._results.seek_to_end(*partitions)
        for tp in partitions:
            self._results.position(tp)
        self._seen: dict[str, CommandResult] = {}
        self._bulk = None  # librdkafka producer of send_raw, made on first use

    def close(self) -> None:
        self._producer.close()
        self._results.close()
        if self._bulk is not None:
            self._bulk.flush(30)
            self._bulk = None

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, command: CommandEnvelope | Mapping[str, Any], wait: bool = True,
               timeout_s: float = 30.0) -> CommandResult | None:
        """Send ``command``; with ``wait`` return its result (the first one, for a re-sent ``command_id``)."""
        command = as_command(command)
        self._producer.send(self.settings.commands_topic, key=command.aggregate_id.encode(), value=command.to_json())
        self._producer.flush()
        if not wait:
            return None
        return self.wait_for([command.command_id], timeout_s, what={command.command_id: command})[command.command_id]

    def submit_many(self, commands: Iterable[CommandEnvelope | Mapping[str, Any]], wait: bool = False,
                    timeout_s: float = 120.0) -> list[str] | dict[str, CommandResult]:
        """Send many commands (validated first); their ids, or with ``wait`` their results by command id."""
        ids = []
        for command in commands:
            command = as_command(command)
            ids.append(command.command_id)
            self._producer.send(self.settings.commands_topic, key=command.aggregate_id.encode(),
                                value=command.to_json())
        self._producer.flush()
        return self.wait_for(ids, timeout_s) if wait else ids

    def send_raw(self, records: Iterable[tuple[str, bytes]]) -> int:
        """The generator's bulk path: already-serialized (key, value) records, sent as they are (no validation,
        so malformed test records reach the handler too). Returns the count, once all are acknowledged.

        It sends with librdkafka (confluent-kafka): kafka-python's pure-Python send path tops out below the
        handler's rate. Same guarantees (idempotent, ``acks=all``) and the same partition for a key as the
        kafka-python producer of ``submit`` (murmur2, like the Java client), so an account's commands never
        straddle two partitions whichever path sent them."""
        if self._bulk is None:
            self._bulk_failed: list[str] = []

            def on_delivery(error, message):  # only called for failed records (delivery.report.only.error)
                self._bulk_failed.append(f"{message.key()!r}: {error}")

            self._bulk = kafka_clients.bulk_producer(self.settings, on_delivery)
        producer, topic = self._bulk, self.settings.commands_topic
        failed = self._bulk_failed
        failed.clear()
        count = 0
        for key, value in records:
            key_bytes = key.encode() if isinstance(key, str) else key
            kafka_clients.produce(producer, topic, value, key_bytes)
            count += 1
            if count % 10_000 == 0:
                producer.poll(0)
        if producer.flush(60) or failed:
            raise RuntimeError(f"{len(failed) or 'some'} of {count} command record(s) could not be sent to {topic}"
                               + (f", e.g. {failed[0]}" if failed else " within 60s"))
        return count

    def wait_for(self, command_ids: Iterable[str], timeout_s: float = 120.0,
                 what: Mapping[str, CommandEnvelope] | None = None,
                 partial: bool = False) -> dict[str, CommandResult]:
        """The results of ``command_ids`` (sent after this EventStore was made); TimeoutError if any is missing
        (``partial``: those that came by then)."""
        wanted = set(command_ids)
        found = {cid: self._seen.pop(cid) for cid in list(wanted) if cid in self._seen}
        # On a busy results topic most records answer other commands: one that cannot hold a wanted id is not
        # parsed (a client waiting for one command read ~6,000 results/s of others, each parsed, in the bench).
        needles = command_id_needles(wanted)
        deadline = time.monotonic() + timeout_s
        while len(found) < len(wanted):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if partial:
                    return found
                missing = sorted(wanted - set(found))
                first = what.get(missing[0]) if what else None
                about = f" ({first.command_type} on {first.aggregate_id})" if first else ""
                raise TimeoutError(
                    f"no result for {len(missing)} of {len(wanted)} command(s), e.g. {missing[0]}{about}, on "
                    f"{self.settings.results_topic} within {timeout_s:g}s; is a command handler running "
                    f"(`eventlake handler`)? The commands are on {self.settings.commands_topic} and will be "
                    f"handled when one runs.")
            batch = self._results.poll(timeout_ms=int(min(remaining, 0.5) * 1000) or 1, max_records=10_000)
            for records in batch.values():
                for record in records:
                    if needles and record.value is not None and not any(n in record.value for n in needles):
                        continue
                    result = CommandResult.from_json(record.value)
                    if result.command_id in wanted:
                        found.setdefault(result.command_id, result)
        return found


_MAX_NEEDLES = 16


def command_id_needles(command_ids: set[str]) -> list[bytes] | None:
    """What each of ``command_ids`` looks like in a result's JSON, to tell a record that cannot answer any of them
    without parsing it; None (parse every record) when they are many, or when one may be written escaped (not
    ASCII, or holding a quote, a backslash or a control character)."""
    if len(command_ids) > _MAX_NEEDLES:
        return None
    needles = []
    for command_id in command_ids:
        if not command_id.isascii() or any(c in '"\\' or ord(c) < 32 for c in command_id):
            return None
        needles.append(b'"' + command_id.encode() + b'"')
    return needles
