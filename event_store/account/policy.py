"""The fraud policy: a process manager that turns ``FraudSuspected`` events into ``FreezeAccount`` commands.

It reads the events topic with ``read_committed`` in its own consumer group and sends commands like any
other client (through librdkafka, which waits out a broker restart by itself) (the handler stays the single writer of events). The command id is derived from the event id,
so a redelivered event (a restart before the offset commit) sends the same command again, which the handler
answers as a duplicate; freezing a frozen account writes nothing either.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from event_store import kafka_clients, kafka_log
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.errors import InvalidRecord
from lakehouse.metrics import Sample, consumer_lag_samples
from lakehouse.settings import Settings

__all__ = ["FraudPolicy", "PolicyStats", "commands_for", "figures"]

_POLICY_NAMESPACE = uuid.UUID("0b6d7a52-39c2-4c55-8f5e-6c1f7b0e2d94")
# Every blocking client call waits at most this long before stop() is looked at again.
_CALL_TIMEOUT_S = 5.0
_MAX_RECORDS = 2_000


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
    consumers_renewed: int = 0  # consumers replaced after not rejoining their group (kafka_clients.RejoinWatch)
    lag: dict[int, int] = field(default_factory=dict)  # partition -> events past this instance (kafka_clients.LagWatch)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        return (f"{self.events} events read, {self.commands} FreezeAccount commands sent, "
                f"{self.skipped} unreadable events skipped"
                + (f", {self.consumers_renewed} consumers renewed after not rejoining their group"
                   if self.consumers_renewed else ""))


def figures(stats: PolicyStats) -> list[Sample]:
    """The fraud policy's Prometheus figures (``lakehouse.metrics``), read from ``stats`` at scrape time."""
    c = "counter"
    return [Sample("policy_events", c, "Events records read", stats.events),
            Sample("policy_commands", c, "FreezeAccount commands sent", stats.commands),
            Sample("policy_skipped_events", c, "Unreadable events records skipped", stats.skipped),
            Sample("policy_consumers_renewed", c, "Consumers replaced after not rejoining their group",
                   stats.consumers_renewed),
            *consumer_lag_samples(stats.lag)]


class FraudPolicy:
    """Consume events, send FreezeAccount commands. ``run()`` until stopped or until caught up.

    A broker that goes away and comes back is waited out (librdkafka reconnects by itself): commands the broker
    did not take are sent again, and offsets are committed only after every command of their events is delivered.
    ``stop()`` (SIGTERM in ``eventlake policy``) ends ``run()`` within seconds whatever it waits for; what was not
    committed then is read again on the next start, and its commands' ids repeat (the handler answers a repeat
    with its first result).
    """

    def __init__(self, settings: Settings, log: Callable[[str], None] = print):
        self.settings = settings
        self.log = log
        self.stats = PolicyStats()
        self._stopping = threading.Event()
        self._at_end: set[tuple[str, int]] = set()  # partitions read to their end (nothing newer seen since)
        self._broker_error: str | None = None
        self._rejoin = kafka_clients.RejoinWatch()
        self._lag = kafka_clients.LagWatch()

    def stop(self) -> None:
        """Ask ``run()`` (in another thread, or from a signal handler) to return within seconds."""
        self._stopping.set()

    def run(self, until_caught_up: bool = False, max_seconds: float | None = None) -> PolicyStats:
        s = self.settings
        kafka_log.ensure_topics(s, log=self.log)
        consumer = self._subscribed()
        sender = kafka_clients.RecordSender(s, "policy", self.log, self._stopping)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stopping.is_set() and (deadline is None or time.monotonic() < deadline):
                renewed = self._rejoin.renew_if_overdue(consumer, self._subscribed, self.log, "policy")
                if renewed is not consumer:
                    self.stats.consumers_renewed += 1
                    consumer = renewed
                records = self._records(kafka_clients.take(consumer, _MAX_RECORDS, 0.5))
                if records:
                    commands = [c for record in records for c in self._handle(record)]
                    # Commands first, then the offsets: a crash or a stop in between reads the events again, and
                    # the commands' ids repeat.
                    if not sender.send(s.commands_topic, [(c.aggregate_id.encode(), c.to_json()) for c in commands],
                                       "command(s)"):
                        break  # stopped
                    self._commit(consumer, records)
                elif until_caught_up and self._caught_up(consumer):
                    break
                if self._lag.refresh(consumer, {p for topic, p in self._at_end if topic == s.events_topic}):
                    self.stats.lag = self._lag.lag
        finally:
            sender.flush(_CALL_TIMEOUT_S)  # what is not delivered now is sent again after the next start
            kafka_clients.close_within(consumer, _CALL_TIMEOUT_S, "policy")
        return self.stats

    def _subscribed(self):
        consumer = kafka_clients.group_reader(self.settings, self.settings.policy_group_id,
                                              on_error=self._on_client_error)
        consumer.subscribe([self.settings.events_topic], on_assign=self._on_assign, on_lost=self._on_lost)
        return consumer

    def _records(self, messages: list) -> list:
        """The event records among ``messages``; an end-of-partition marker is noted, other errors raised."""
        records = []
        for m in messages:
            error = m.error()
            if error is None:
                self._at_end.discard((m.topic(), m.partition()))
                records.append(m)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._at_end.add((m.topic(), m.partition()))
            elif error.fatal() or not error.retriable():
                raise KafkaException(error)
            else:
                self._on_client_error(error)
        if records and self._broker_error is not None:
            self.log(f"policy: reading events again after: {self._broker_error}")
            self._broker_error = None
        return records

    def _handle(self, record) -> list[CommandEnvelope]:
        self.stats.events += 1
        try:
            event = EventEnvelope.from_json(record.value())
        except InvalidRecord as e:
            self.stats.skipped += 1
            self.log(f"policy: skipped events record {record.partition()}/{record.offset()}: {e}")
            return []
        commands = commands_for(event)
        self.stats.commands += len(commands)
        return commands

    def _commit(self, consumer, records: list) -> None:
        """Commit the offsets after ``records``. Asynchronous: a commit lost to an absent broker or a rebalance
        only means those events are read again (by this consumer or the partition's new owner), and their
        commands' ids repeat; a later commit covers them anyway."""
        ends: dict[tuple[str, int], int] = {}
        for r in records:
            ends[(r.topic(), r.partition())] = max(ends.get((r.topic(), r.partition()), -1), r.offset() + 1)
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=True)
        except KafkaException as e:
            self.log(f"policy: offsets not committed ({e.args[0]}); those events may be read again")

    def _caught_up(self, consumer) -> bool:
        assigned = consumer.assignment()
        return bool(assigned) and all((tp.topic, tp.partition) in self._at_end for tp in assigned)

    # librdkafka calls these from inside consume(), on this thread.
    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self._rejoin.assigned()

    def _on_lost(self, consumer, partitions: list[TopicPartition]) -> None:
        """The group session timed out (e.g. the broker restarted): the partitions may be someone else's already;
        what was not committed of them is read again by their next owner."""
        self._rejoin.lost()
        self.log(f"policy: group session lost; partitions {sorted(tp.partition for tp in partitions)} dropped")
        consumer.incremental_unassign(partitions)
        self._at_end.difference_update((tp.topic, tp.partition) for tp in partitions)

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if self._broker_error is None:  # once per outage, not once per retry
            self._broker_error = error.str()
            self.log(f"policy: waiting for the broker: {error.str()}")
