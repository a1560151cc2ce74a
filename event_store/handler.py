"""The command handler: the single writer of the events topic.

It consumes commands, runs ``decide`` against in-memory aggregate state, and writes the resulting
events, the command result and the consumer offsets in ONE Kafka transaction. Readers use
``read_committed``, so a crash mid-batch leaves no trace and the batch is redone on restart.
State is rebuilt from the events topic when the handler starts.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from kafka.structs import OffsetAndMetadata

from event_store import kafka_log
from event_store.account import AGGREGATE_TYPE, AccountState, CommandRejected, decide, evolve
from event_store.envelope import (CommandEnvelope, CommandResult, EventEnvelope, InvalidRecord, utc_now)
from event_store.schemas import EVENT_SCHEMA_VERSIONS
from eventlake.settings import Settings

__all__ = ["CommandHandler", "HandlerStats", "execute"]

# Event ids derive from the command id, so a batch redone after an aborted transaction writes the same ids.
_EVENT_ID_NAMESPACE = uuid.UUID("6f1c2b1e-7a4d-4e0b-9a59-3f0e2c1d8b71")


@dataclass
class HandlerStats:
    commands: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    events: int = 0
    transactions: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-9)
        return (f"{self.commands} commands ({self.accepted} accepted, {self.rejected} rejected, "
                f"{self.duplicates} duplicate, {self.dead_lettered} dead-lettered) -> {self.events} events "
                f"in {self.transactions} transactions, {self.commands / secs:,.0f} commands/s")


def execute(state: AccountState, command: CommandEnvelope, recorded_at: str | None = None
            ) -> tuple[AccountState, list[EventEnvelope], CommandResult]:
    """Pure: the new state, the event envelopes to append and the command's result (no Kafka)."""
    try:
        new_events = decide(state, command)
    except CommandRejected as e:
        return state, [], CommandResult(command.command_id, command.aggregate_id, "rejected", state.version,
                                        error_type=e.error_type, reason=e.reason)
    recorded_at = recorded_at or utc_now()
    envelopes = []
    for i, new in enumerate(new_events):
        event = EventEnvelope(
            event_id=str(uuid.uuid5(_EVENT_ID_NAMESPACE, f"{command.command_id}/{i}")),
            event_type=new.event_type, schema_version=EVENT_SCHEMA_VERSIONS[new.event_type],
            aggregate_type=AGGREGATE_TYPE, aggregate_id=command.aggregate_id, aggregate_version=state.version + 1,
            occurred_at=new.occurred_at, recorded_at=recorded_at, command_id=command.command_id,
            correlation_id=command.correlation_id or command.command_id, causation_id=command.command_id,
            payload=dict(new.payload))
        state = evolve(state, event)
        envelopes.append(event)
    return state, envelopes, CommandResult(command.command_id, command.aggregate_id, "accepted", state.version,
                                           event_ids=tuple(e.event_id for e in envelopes))


class CommandHandler:
    """Consume commands, append events. ``run()`` until stopped, or until caught up with ``until_caught_up``."""

    def __init__(self, settings: Settings, instance_id: str = "0", log: Callable[[str], None] = print):
        self.settings = settings
        self.instance_id = instance_id
        self.log = log
        self.states: dict[str, AccountState] = {}
        self.handled_commands: set[str] = set()
        self.stats = HandlerStats()
        self._producer = None
        self._consumer = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        kafka_log.ensure_topics(self.settings, log=self.log)
        transactional_id = f"{self.settings.handler_group_id}-{self.instance_id}"
        self._producer = kafka_log.make_producer(self.settings, transactional_id=transactional_id)
        # Fences any older instance with this id and aborts its open transaction before we read state.
        self._producer.init_transactions()
        self._rebuild_state()
        self._consumer = kafka_log.make_consumer(self.settings, self.settings.commands_topic,
                                                 group_id=self.settings.handler_group_id, max_poll_records=2000)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.close()
        self._consumer = self._producer = None

    def __enter__(self) -> "CommandHandler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rebuild_state(self) -> None:
        started = time.monotonic()
        count = 0
        for record in kafka_log.read_all(self.settings, self.settings.events_topic):
            event = EventEnvelope.from_json(record.value)
            state = self.states.get(event.aggregate_id) or AccountState(event.aggregate_id)
            self.states[event.aggregate_id] = evolve(state, event)
            self.handled_commands.add(event.command_id)
            count += 1
        self.log(f"handler: rebuilt {len(self.states)} accounts from {count} events "
                 f"in {time.monotonic() - started:.1f}s")

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, until_caught_up: bool = False, max_seconds: float | None = None,
            progress_every_s: float = 5.0) -> HandlerStats:
        if self._consumer is None:
            self.start()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        last_progress = time.monotonic()
        while deadline is None or time.monotonic() < deadline:
            batch = self._consumer.poll(timeout_ms=500)
            if batch:
                self.process(batch)
            elif until_caught_up and self._caught_up():
                break
            if time.monotonic() - last_progress >= progress_every_s:
                self.log(f"handler: {self.stats.line()}")
                last_progress = time.monotonic()
        return self.stats

    def _caught_up(self) -> bool:
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        ends = self._consumer.end_offsets(list(assigned))
        return all(self._consumer.position(tp) >= ends[tp] for tp in assigned)

    def process(self, batch: dict) -> None:
        """Handle one polled batch of command records in one transaction."""
        producer = self._producer
        staged: dict[str, AccountState] = {}
        staged_commands: set[str] = set()
        stats = HandlerStats(started=self.stats.started)
        producer.begin_transaction()
        try:
            offsets = {}
            for tp, records in batch.items():
                for record in records:
                    self._handle_record(record, staged, staged_commands, stats)
                offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
            producer.send_offsets_to_transaction(offsets, self._consumer.group_metadata())
            producer.commit_transaction()
        except Exception:
            producer.abort_transaction()
            raise
        # Only a committed transaction changes what the handler believes.
        self.states.update(staged)
        self.handled_commands |= staged_commands
        for name in ("commands", "accepted", "rejected", "duplicates", "dead_lettered", "events"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(stats, name))
        self.stats.transactions += 1

    def _handle_record(self, record, staged, staged_commands, stats: HandlerStats) -> None:
        s = self.settings
        stats.commands += 1
        try:
            command = CommandEnvelope.from_json(record.value)
        except InvalidRecord as e:
            # A readable command with a bad field is rejected with the reason; a record that is not a
            # command at all (no command_id to answer to) goes to the dead-letter topic with its bytes.
            if self._reject_invalid(record, str(e)):
                stats.rejected += 1
            else:
                stats.dead_lettered += 1
                self._producer.send(s.dead_letters_topic, key=record.key,
                                    value=kafka_log.dead_letter_value(str(e), record.value, record.topic,
                                                                      record.partition, record.offset))
            return
        account_id = command.aggregate_id
        state = staged.get(account_id) or self.states.get(account_id) or AccountState(account_id)
        if command.command_id in self.handled_commands or command.command_id in staged_commands:
            stats.duplicates += 1
            self._send_result(CommandResult(command.command_id, account_id, "accepted", state.version,
                                            reason="duplicate command_id: already handled, nothing written"))
            return
        state, events, result = execute(state, command)
        for event in events:
            self._producer.send(s.events_topic, key=account_id.encode(), value=event.to_json())
        if result.accepted:
            staged[account_id] = state
            staged_commands.add(command.command_id)
            stats.accepted += 1
            stats.events += len(events)
        else:
            stats.rejected += 1
        self._send_result(result)

    def _send_result(self, result: CommandResult) -> None:
        self._producer.send(self.settings.results_topic, key=result.command_id.encode(), value=result.to_json())

    def _reject_invalid(self, record, reason: str) -> bool:
        """Send a rejection for an invalid command whose command_id can be read; False when it cannot."""
        try:
            obj = json.loads(record.value)
        except (ValueError, TypeError):
            return False
        command_id = obj.get("command_id") if isinstance(obj, dict) else None
        if not isinstance(command_id, str) or not command_id:
            return False
        aggregate_id = obj.get("aggregate_id") if isinstance(obj.get("aggregate_id"), str) else ""
        self._send_result(CommandResult(command_id, aggregate_id, "rejected", -1, error_type="InvalidCommand",
                                        reason=reason))
        return True
