"""The fraud policy: a process manager that turns ``FraudSuspected`` events into ``FreezeAccount`` commands.

It reads the events topic with ``read_committed`` in its own consumer group and sends commands like any
other client (the handler stays the single writer of events). The command id is derived from the event id,
so a redelivered event (a restart before the offset commit) sends the same command again, which the handler
answers as a duplicate; freezing a frozen account writes nothing either.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from kafka.errors import CommitFailedError, KafkaError, KafkaTimeoutError

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.errors import InvalidRecord
from lakehouse.settings import Settings

__all__ = ["FraudPolicy", "PolicyStats", "commands_for"]

_POLICY_NAMESPACE = uuid.UUID("0b6d7a52-39c2-4c55-8f5e-6c1f7b0e2d94")
# Every blocking client call waits at most this long before stop() is looked at again.
_CALL_TIMEOUT_MS = 5_000


def commands_for(event: EventEnvelope) -> list[CommandEnvelope]:
    """Pure: the commands the policy sends for ``event`` (FreezeAccount for FraudSuspected, else none)."""
    if event.event_type != "FraudSuspected":
        return []
    p = event.payload
    return [CommandEnvelope(
        command_id=str(uuid.uuid5(_POLICY_NAMESPACE, f"freeze/{event.event_id}")), command_type="FreezeAccount",
        aggregate_id=event.aggregate_id,
        payload={"reason": f"fraud suspected: rule {p['rule']} on payment {p['payment_id']}"},
        issued_at=event.recorded_at, correlation_id=event.correlation_id, causation_id=event.event_id)]


@dataclass
class PolicyStats:
    events: int = 0
    commands: int = 0
    skipped: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        return (f"{self.events} events read, {self.commands} FreezeAccount commands sent, "
                f"{self.skipped} unreadable events skipped")


class FraudPolicy:
    """Consume events, send FreezeAccount commands. ``run()`` until stopped or until caught up.

    A broker that goes away and comes back is waited out: commands the broker did not take are sent again, and
    offsets are committed only after every command of their events is delivered. ``stop()`` (SIGTERM in
    ``eventlake policy``) ends ``run()`` within seconds whatever it waits for; what was not committed then is read
    again on the next start, and its commands' ids repeat (the handler answers a repeat with its first result).
    """

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        self.settings = settings
        self.log = log
        self.stats = PolicyStats()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Ask ``run()`` (in another thread, or from a signal handler) to return within seconds."""
        self._stopping.set()

    def run(self, until_caught_up: bool = False, max_seconds: float | None = None) -> PolicyStats:
        s = self.settings
        kafka_log.ensure_topics(s, log=self.log)
        # Bounded client calls: none may wait longer than _CALL_TIMEOUT_S before stop() is looked at again.
        consumer = kafka_log.make_consumer(s, s.events_topic, group_id=s.policy_group_id,
                                           request_timeout_ms=_CALL_TIMEOUT_MS)
        producer = kafka_log.make_producer(s, max_block_ms=_CALL_TIMEOUT_MS)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stopping.is_set() and (deadline is None or time.monotonic() < deadline):
                batch = consumer.poll(timeout_ms=500)
                if batch:
                    commands = [c for records in batch.values() for record in records for c in self._handle(record)]
                    # Commands first, then the offsets: a crash or a stop in between reads the events again, and
                    # the commands' ids repeat.
                    if not (self._send(producer, commands) and self._commit(consumer)):
                        break  # stopped
                elif until_caught_up and _caught_up(consumer):
                    break
        finally:
            producer.close(timeout=_CALL_TIMEOUT_MS / 1000)
            consumer.close(autocommit=False, timeout_ms=_CALL_TIMEOUT_MS)
        return self.stats

    def _handle(self, record) -> list[CommandEnvelope]:
        self.stats.events += 1
        try:
            event = EventEnvelope.from_json(record.value)
        except InvalidRecord as e:
            self.stats.skipped += 1
            self.log(f"policy: skipped events record {record.partition}/{record.offset}: {e}")
            return []
        commands = commands_for(event)
        self.stats.commands += len(commands)
        return commands

    def _send(self, producer, commands: list[CommandEnvelope]) -> bool:
        """Send ``commands`` until the broker has taken every one (what failed is sent again); False when stop()
        came first."""
        pending = commands
        while pending:
            sent = []
            for command in pending:
                try:
                    sent.append((command, producer.send(self.settings.commands_topic,
                                                        key=command.aggregate_id.encode(), value=command.to_json())))
                except KafkaError as e:  # e.g. no metadata within max_block_ms: the broker is away
                    sent.append((command, e))
            while not self._flushed(producer):
                if self._stopping.is_set():
                    return False
            failed = [(c, f if isinstance(f, KafkaError) else f.exception) for c, f in sent
                      if isinstance(f, KafkaError) or f.failed()]
            if failed:
                self.log(f"policy: {len(failed)} command(s) not delivered ({failed[0][1]!r}); sending them again")
                if self._stopping.wait(1.0):
                    return False
            pending = [c for c, _ in failed]
        return True

    @staticmethod
    def _flushed(producer) -> bool:
        try:
            producer.flush(timeout=1.0)
            return True
        except KafkaTimeoutError:  # records still wait for the broker (each fails after delivery_timeout_ms)
            return False

    def _commit(self, consumer) -> bool:
        """Commit the offsets of what was handled, waiting out a broker that does not answer; False when stop()
        came first."""
        waiting_since = None
        while not self._stopping.is_set():
            try:
                consumer.commit(timeout_ms=_CALL_TIMEOUT_MS)
                if waiting_since is not None:
                    self.log(f"policy: offsets committed after {time.monotonic() - waiting_since:.0f}s")
                return True
            except CommitFailedError as e:
                # The group moved the partitions on (this consumer was away too long): their new owner reads the
                # events again from the last commit, and the commands' ids repeat.
                self.log(f"policy: offsets not committed ({e}); those events are read again")
                return True
            except KafkaError as e:
                if not e.retriable:
                    raise
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    self.log(f"policy: committing offsets waits for the broker ({e!r}); retrying")
        return False


def _caught_up(consumer) -> bool:
    assigned = consumer.assignment()
    if not assigned:
        return False
    try:
        ends = consumer.end_offsets(list(assigned))
        return all(consumer.position(tp) >= ends[tp] for tp in assigned)
    except KafkaError:  # the broker does not answer: not known to be caught up
        return False
