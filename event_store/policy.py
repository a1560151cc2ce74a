"""The fraud policy: a process manager that turns ``FraudSuspected`` events into ``FreezeAccount`` commands.

It reads the events topic with ``read_committed`` in its own consumer group and sends commands like any
other client (the handler stays the single writer of events). The command id is derived from the event id,
so a redelivered event (a restart before the offset commit) sends the same command again, which the handler
answers as a duplicate; freezing a frozen account writes nothing either.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, EventEnvelope, InvalidRecord
from eventlake.settings import Settings

__all__ = ["FraudPolicy", "PolicyStats", "commands_for"]

_POLICY_NAMESPACE = uuid.UUID("0b6d7a52-39c2-4c55-8f5e-6c1f7b0e2d94")


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
    """Consume events, send FreezeAccount commands. ``run()`` until stopped or until caught up."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        self.settings = settings
        self.log = log
        self.stats = PolicyStats()

    def run(self, until_caught_up: bool = False, max_seconds: float | None = None) -> PolicyStats:
        s = self.settings
        kafka_log.ensure_topics(s, log=self.log)
        consumer = kafka_log.make_consumer(s, s.events_topic, group_id=s.policy_group_id)
        producer = kafka_log.make_producer(s)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while deadline is None or time.monotonic() < deadline:
                batch = consumer.poll(timeout_ms=500)
                if batch:
                    for records in batch.values():
                        for record in records:
                            self._handle(record, producer)
                    # Commands first, then the offsets: a crash in between redelivers, and the ids repeat.
                    producer.flush()
                    consumer.commit()
                elif until_caught_up and _caught_up(consumer):
                    break
        finally:
            producer.close()
            consumer.close()
        return self.stats

    def _handle(self, record, producer) -> None:
        self.stats.events += 1
        try:
            event = EventEnvelope.from_json(record.value)
        except InvalidRecord as e:
            self.stats.skipped += 1
            self.log(f"policy: skipped events record {record.partition}/{record.offset}: {e}")
            return
        for command in commands_for(event):
            producer.send(self.settings.commands_topic, key=command.aggregate_id.encode(), value=command.to_json())
            self.stats.commands += 1


def _caught_up(consumer) -> bool:
    assigned = consumer.assignment()
    if not assigned:
        return False
    ends = consumer.end_offsets(list(assigned))
    return all(consumer.position(tp) >= ends[tp] for tp in assigned)
