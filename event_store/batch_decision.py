"""The batch decision: one partition's command records in, the records to write for them out. Pure: no Kafka client.

Each command record, in order, is decoded (a record that is no command at all becomes a dead letter with its
bytes; a readable command with a bad field is rejected with the reason), a repeated ``command_id`` is answered with
its first result, and the command is decided against its aggregate's state (``event_store.decider``). Every event
and result is checked against what one record may weigh in its topic before anything is produced: a record the
broker refuses would abort the whole transaction, again on every retry. The handler (``event_store.handler``)
produces what ``decide_records`` returns into its open transaction, and makes the staged states and results true
only once that transaction commits. Records are anything with the confluent-kafka message's accessors (``value()``,
``key()``, ``topic()``, ``partition()``, ``offset()``), so plain objects unit-test it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from event_store.decider import EventTimeLimit, execute_encoded, id_taken
from event_store.domains import DOMAINS
from event_store.envelope import CommandEnvelope, CommandResult, utc_now
from event_store.errors import InvalidRecord
from event_store.partition_state import PartitionState

__all__ = ["RecordLimits", "DecisionCounts", "StagedChanges", "DeadLetter", "PartitionWrites", "decide_records",
           "fit_result", "too_large_rejection", "invalid_result", "command_ids", "version_of", "continue_waiting",
           "PRODUCER_MESSAGE_MAX_BYTES", "RECORD_OVERHEAD_BYTES"]

# The producer's own limit on one record (librdkafka's message.max.bytes, its default written out): the
# size precheck uses the smaller of it and each topic's max.message.bytes.
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
# A record alone in its batch takes this much more than its key and value (v2 batch header: 61 bytes; the
# record's own varints and attributes: at most ~30). Rounded up.
RECORD_OVERHEAD_BYTES = 128


@dataclass(frozen=True)
class RecordLimits:
    """What one record (key and value) may weigh in each topic the handler writes commands' outcomes to."""
    events_topic: str
    results_topic: str
    dead_letters_topic: str
    topic_limits: dict[str, int]  # each topic's max.message.bytes, as the broker says
    record_limits: dict[str, int]  # the smaller of it and the producer's message.max.bytes
    max_event_bytes: int
    max_result_bytes: int
    max_dead_letter_bytes: int

    @classmethod
    def of(cls, events_topic: str, results_topic: str, dead_letters_topic: str,
           topic_limits: dict[str, int]) -> RecordLimits:
        """The limits from the topics' max.message.bytes (``topic_limits``), capped by the producer's."""
        topics = (events_topic, results_topic, dead_letters_topic)
        record_limits = {t: min(topic_limits[t], PRODUCER_MESSAGE_MAX_BYTES) for t in topics}
        return cls(events_topic, results_topic, dead_letters_topic, dict(topic_limits), record_limits,
                   max_event_bytes=record_limits[events_topic] - RECORD_OVERHEAD_BYTES,
                   max_result_bytes=record_limits[results_topic] - RECORD_OVERHEAD_BYTES,
                   max_dead_letter_bytes=record_limits[dead_letters_topic] - RECORD_OVERHEAD_BYTES)

    @property
    def batch_bytes(self) -> int:
        """The producer's batch.size: librdkafka does not split a batch the broker finds too large, so no batch
        may outgrow the smallest limit."""
        return max(1, min(1024 * 1024, *self.record_limits.values()) - RECORD_OVERHEAD_BYTES)


@dataclass
class DecisionCounts:
    """What the decided records came to (the handler adds them to its stats once their transaction commits)."""
    commands: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    events: int = 0
    too_large: int = 0  # rejected EventTooLarge (counted in rejected too)
    # (command type, outcome) -> commands decided (of a registered type: accepted, rejected, duplicate)
    by_type: dict[tuple[str, str], int] = field(default_factory=dict)

    def add_to(self, stats: Any) -> None:
        """Add these counts to the same-named counters of ``stats``."""
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, dict):
                theirs = getattr(stats, f.name)
                for key, n in mine.items():
                    theirs[key] = theirs.get(key, 0) + n
            else:
                setattr(stats, f.name, getattr(stats, f.name) + mine)


@dataclass
class StagedChanges:
    """What one transaction's commit makes true, over all its partitions: each changed aggregate's state and each
    answered command's result (a command repeated later in the same transaction is answered from here)."""
    states: dict[tuple[str, str], tuple[PartitionState, Any]] = field(default_factory=dict)
    results: dict[str, tuple[PartitionState, CommandResult]] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetter:
    """A command record that is no command (no command_id to answer to): the reason, where it lies, its bytes."""
    key: bytes | None
    reason: str
    value: bytes | None
    topic: str
    partition: int
    offset: int


@dataclass
class PartitionWrites:
    """The records to produce for one partition's commands, in order: events and results as (key, value)."""
    events: list[tuple[bytes, bytes]] = field(default_factory=list)
    results: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


def decide_records(records: list, part: PartitionState, staged: StagedChanges, counts: DecisionCounts,
                   recorded_at: str, time_limit: EventTimeLimit | None, limits: RecordLimits,
                   sealer: Any = None) -> PartitionWrites:
    """Decide one partition's command records in order against ``part`` and what ``staged`` holds of the open
    transaction (which they add to): the events, results and dead letters to produce for them. With ``sealer``
    (``event_store.sealing.Sealer``), personal data is sealed and a forgotten subject's commands are refused."""
    out = PartitionWrites()
    from_json, add_event, add_result = CommandEnvelope.from_json, out.events.append, out.results.append
    first_result, state_of = part.first_result, part.state
    staged_states, staged_results = staged.states, staged.results
    max_event_bytes, max_result_bytes = limits.max_event_bytes, limits.max_result_bytes
    accepted = rejected = new_events_total = 0
    by_type = counts.by_type
    for record in records:
        value = record.value()
        try:
            command = from_json(value)
        except InvalidRecord as e:
            rejected += _answer_invalid(record, value, str(e), counts, recorded_at, limits, out)
            continue
        aggregate_id = command.aggregate_id
        command_id = command.command_id
        staged_first = staged_results.get(command_id)
        first = staged_first[1] if staged_first else first_result(aggregate_id, command_id)
        if first is not None and first.aggregate_id == aggregate_id:
            counts.duplicates += 1
            key = (command.command_type, "duplicate")
            by_type[key] = by_type.get(key, 0) + 1
            add_result((command_id.encode(), CommandResult(
                first.command_id, aggregate_id, first.status, first.version, first.event_ids, first.error_type,
                first.reason, recorded_at, duplicate=True).to_json()))
            continue
        # Routed by aggregate type: CommandEnvelope gives every command a registered one, or rejects it.
        state_key = (command.aggregate_type, aggregate_id)
        staged_state = staged_states.get(state_key)
        before = part.known(command, staged_state[1] if staged_state else state_of(*state_key))
        owner = part.owner_of(*state_key, staged_states) if before.version == 0 else None
        if owner is not None:
            state, new_events, result = before, (), id_taken(before, command, owner, recorded_at)
        else:
            state, new_events, result = execute_encoded(before, command, recorded_at, time_limit, sealer)
        result_key, result_value = command_id.encode(), result.to_json()
        if new_events:
            key = aggregate_id.encode()
            # Sizes are checked before anything is produced (see too_large_rejection).
            if (len(key) + max(map(len, new_events)) > max_event_bytes
                    or len(result_key) + len(result_value) > max_result_bytes):
                counts.too_large += 1
                state, result = before, too_large_rejection(before, command, key, new_events, result_key,
                                                            result_value, limits)
                new_events, result_value = (), result.to_json()
            else:
                for event in new_events:
                    add_event((key, event))
        if len(result_key) + len(result_value) > max_result_bytes:  # a rejection quoting a huge value
            result = fit_result(result, limits)
            result_value = result.to_json()
        if result.status == "accepted":
            if part.waiting and new_events:  # rarely: events after a gap this command's events fill
                state = continue_waiting(part, state_key, state)
            staged_states[state_key] = (part, state)
            accepted += 1
            new_events_total += len(new_events)
            outcome = (command.command_type, "accepted")
        else:
            rejected += 1
            outcome = (command.command_type, "rejected")
        by_type[outcome] = by_type.get(outcome, 0) + 1
        staged_results[command_id] = (part, result)
        add_result((result_key, result_value))
    counts.commands += len(records)
    counts.accepted += accepted
    counts.rejected += rejected
    counts.events += new_events_total
    return out


def continue_waiting(part: PartitionState, key: tuple[str, str], state: Any) -> Any:
    """``state`` (of the aggregate ``key``: type and id) with the events that waited for it applied (the versions
    right after it, in order). The waiting events stay listed: a transaction that aborts goes back to an earlier
    state, which needs them."""
    waiting = part.waiting.get(key) if part.waiting else None
    if waiting:
        evolve = DOMAINS[key[0]].evolve
        while (event := waiting.get(state.version + 1)) is not None:
            state = evolve(state, event)
    return state


def too_large_rejection(state: Any, command: CommandEnvelope, key: bytes, new_events, result_key: bytes,
                        result_value: bytes, limits: RecordLimits) -> CommandResult:
    """The rejection of a valid command whose event or result is bigger than a record may be: the broker
    would refuse it (MSG_SIZE_TOO_LARGE) and abort the whole transaction, again on every retry."""
    event_bytes = len(key) + max(map(len, new_events))
    if event_bytes > limits.max_event_bytes:
        what, size, topic = "event", event_bytes, limits.events_topic
    else:
        what, size, topic = "result", len(result_key) + len(result_value), limits.results_topic
    limit = limits.record_limits[topic]
    reason = (f"command {command.command_id}: its {what} would be a record of {size:,} bytes (key and value), "
              f"more than the {limit - RECORD_OVERHEAD_BYTES:,} bytes a record may take in {topic} (the smaller "
              f"of the topic's max.message.bytes {limits.topic_limits[topic]:,} and the producer's "
              f"message.max.bytes {PRODUCER_MESSAGE_MAX_BYTES:,}, less {RECORD_OVERHEAD_BYTES} bytes of "
              f"record overhead); shorten its fields")
    return fit_result(CommandResult(command.command_id, command.aggregate_id, "rejected", state.version,
                                    error_type="EventTooLarge", reason=reason, recorded_at=utc_now()), limits)


def fit_result(result: CommandResult, limits: RecordLimits) -> CommandResult:
    """``result`` with its reason shortened until its record fits the results topic (a rejection may quote
    the huge value it rejects)."""
    limit = limits.max_result_bytes - len(result.command_id.encode())
    reason = result.reason or ""
    while len(result.to_json()) > limit and reason:
        reason = reason[:len(reason) // 2]
        result = dataclasses.replace(result, reason=f"{reason}... (reason truncated to fit "
                                                    f"{limits.results_topic})")
    return result


def _answer_invalid(record, value: bytes | None, reason: str, counts: DecisionCounts, recorded_at: str,
                    limits: RecordLimits, out: PartitionWrites) -> int:
    """An invalid command record: a readable command with a bad field is rejected with the reason (1 is
    returned: one more rejection); a record that is not a command at all (no command_id to answer to)
    goes to the dead letters with its bytes (0)."""
    result = invalid_result(value, reason, recorded_at)
    if result is not None:
        result_value = result.to_json()
        if len(result.command_id) + len(result_value) > limits.max_result_bytes:
            result_value = fit_result(result, limits).to_json()
        out.results.append((result.command_id.encode(), result_value))
        return 1
    counts.dead_lettered += 1
    out.dead_letters.append(DeadLetter(record.key(), reason, value, record.topic(), record.partition(),
                                       record.offset()))
    return 0


def invalid_result(value: bytes | None, reason: str, recorded_at: str) -> CommandResult | None:
    """A rejection for an invalid command whose command_id can be read; None when it cannot."""
    ids = command_ids(value)
    if ids is None:
        return None
    command_id, aggregate_id = ids
    return CommandResult(command_id, aggregate_id, "rejected", -1, error_type="InvalidCommand", reason=reason,
                         recorded_at=recorded_at)


def command_ids(value: bytes | None) -> tuple[str, str] | None:
    """(command_id, aggregate_id) of a command record as far as they can be read; None without a command_id."""
    try:
        obj = json.loads(value)
    except (ValueError, TypeError):
        return None
    command_id = obj.get("command_id") if isinstance(obj, dict) else None
    if not isinstance(command_id, str) or not command_id:
        return None
    aggregate_id = obj.get("aggregate_id")
    return command_id, aggregate_id if isinstance(aggregate_id, str) else ""


def version_of(part: PartitionState, value: bytes | None) -> int:
    """The version of the aggregate a command record names, as far as it can be read (-1 when it cannot)."""
    try:
        command = CommandEnvelope.from_json(value)
    except (InvalidRecord, TypeError):
        return -1
    return part.state(command.aggregate_type, command.aggregate_id).version
