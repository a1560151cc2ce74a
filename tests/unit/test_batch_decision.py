"""The batch decision (event_store.batch_decision) on plain records, without Kafka: size limits, invalid commands,
records that are no command, repeated command ids within one transaction, and what it counts."""
from __future__ import annotations

import json

from event_store.batch_decision import (RECORD_OVERHEAD_BYTES, DecisionCounts, RecordLimits, StagedChanges,
                                        command_ids, decide_records, fit_result)
from event_store.envelope import CommandEnvelope, CommandResult
from event_store.snapshots import PartitionState

T = "2026-01-01T00:00:00.000Z"
TOPICS = ("events", "results", "dead-letters")


class Record:
    """A command record with the accessors of a confluent-kafka message."""

    def __init__(self, value: bytes, offset: int, key: bytes | None = None):
        self._value, self._offset, self._key = value, offset, key

    def value(self):
        return self._value

    def key(self):
        return self._key

    def topic(self):
        return "commands"

    def partition(self):
        return 0

    def offset(self):
        return self._offset


def limits(record_bytes: int = 1_000_000) -> RecordLimits:
    return RecordLimits.of(*TOPICS, dict.fromkeys(TOPICS, record_bytes))


def open_account(account: str, command_id: str) -> bytes:
    return CommandEnvelope.create("OpenAccount", account, {"customer_id": "cu", "credit_limit_minor": 100_000,
                                                           "currency": "USD"}, command_id=command_id).to_json()


def flag(account: str, command_id: str, evidence: str) -> bytes:
    return CommandEnvelope.create("FlagFraud", account, {"payment_id": "p0", "rule": "burst", "evidence": evidence},
                                  command_id=command_id).to_json()


def decide(values: list[bytes], record_limits: RecordLimits, staged: StagedChanges | None = None,
           part: PartitionState | None = None):
    counts = DecisionCounts()
    records = [Record(v, i, key=b"k%d" % i) for i, v in enumerate(values)]
    writes = decide_records(records, part or PartitionState(0), staged or StagedChanges(), counts, T, None,
                            record_limits)
    return writes, counts


def test_the_limits_are_the_smaller_of_the_topics_and_the_producers_less_the_record_overhead():
    got = RecordLimits.of(*TOPICS, {"events": 5_000, "results": 2_000_000, "dead-letters": 3_000})
    assert got.record_limits == {"events": 5_000, "results": 1_000_000, "dead-letters": 3_000}
    assert (got.max_event_bytes, got.max_result_bytes, got.max_dead_letter_bytes) == (
        5_000 - RECORD_OVERHEAD_BYTES, 1_000_000 - RECORD_OVERHEAD_BYTES, 3_000 - RECORD_OVERHEAD_BYTES)
    assert got.batch_bytes == 3_000 - RECORD_OVERHEAD_BYTES


def test_an_event_too_large_for_its_topic_is_rejected_and_writes_nothing_while_the_others_go_through():
    values = [open_account("a", "c1"), flag("a", "c2", "x" * 6_000), flag("a", "c3", "small")]
    writes, counts = decide(values, limits(5_000))
    answers = [CommandResult.from_json(v) for _, v in writes.results]
    assert [(r.command_id, r.status, r.version, r.error_type) for r in answers] == [
        ("c1", "accepted", 1, None), ("c2", "rejected", 1, "EventTooLarge"), ("c3", "accepted", 2, None)]
    assert "more than the 4,872 bytes a record may take in events" in answers[1].reason
    assert "max.message.bytes 5,000" in answers[1].reason
    assert [json.loads(v)["aggregate_version"] for _, v in writes.events] == [1, 2]
    assert (counts.commands, counts.accepted, counts.rejected, counts.too_large, counts.events) == (3, 2, 1, 1, 2)


def test_a_record_that_is_no_command_is_a_dead_letter_and_a_command_with_a_bad_field_is_rejected():
    bad_field = json.dumps({"command_id": "c9", "aggregate_id": "a", "command_type": "OpenAccount"}).encode()
    writes, counts = decide([b"\xff not json", bad_field], limits())
    [dead] = writes.dead_letters
    assert (dead.key, dead.value, dead.topic, dead.partition, dead.offset) == (b"k0", b"\xff not json", "commands",
                                                                                0, 0)
    assert dead.reason
    [(key, value)] = writes.results
    answer = CommandResult.from_json(value)
    assert key == b"c9" and (answer.status, answer.error_type, answer.version) == ("rejected", "InvalidCommand", -1)
    assert (counts.commands, counts.rejected, counts.dead_lettered, counts.accepted) == (2, 1, 1, 0)
    assert command_ids(b"\xff not json") is None and command_ids(bad_field) == ("c9", "a")


def test_a_command_repeated_within_the_transaction_gets_the_staged_first_result_and_no_second_event():
    staged = StagedChanges()
    first, _ = decide([open_account("a", "c1")], limits(), staged)
    again, counts = decide([open_account("a", "c1")], limits(), staged)
    assert len(first.events) == 1 and not again.events
    answer = CommandResult.from_json(again.results[0][1])
    assert answer.duplicate and (answer.status, answer.version) == ("accepted", 1)
    assert counts.duplicates == 1 and counts.accepted == 0
    assert {k: s.version for k, (_, s) in staged.states.items()} == {("account", "a"): 1}


def test_a_result_is_shortened_to_fit_its_topic():
    small = limits(600)
    result = CommandResult("c1", "a", "rejected", 0, error_type="X", reason="y" * 5_000, recorded_at=T)
    fitted = fit_result(result, small)
    assert len(fitted.to_json()) + len(b"c1") <= small.max_result_bytes
    assert fitted.reason.endswith("(reason truncated to fit results)")
