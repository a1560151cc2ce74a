"""The write side routes by aggregate type: a second, test-only domain (a counter) registered here gets the same
treatment as accounts (expected_version, idempotent command_id, snapshots, the rebuild, rejections that name the
input), through the generic decider and the handler's batch code, without Kafka."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from event_store import domains, schemas
from event_store.batch_decision import DecisionCounts, RecordLimits, StagedChanges, decide_records
from event_store.decider import execute, execute_encoded, initial_state
from event_store.domain import CommandRejected, Domain, NewEvent
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from event_store.errors import InvalidRecord
from event_store.fields import Field
from event_store.partition_rebuild import PartitionRebuilder
from event_store.snapshots import PartitionState, load_snapshot, snapshot_records
from lakehouse.settings import Settings

T = "2026-01-01T00:00:00.000Z"


@dataclass(frozen=True)
class CounterState:
    counter_id: str
    version: int = 0
    value: int = 0
    quarantine: tuple[str, str] | None = None


def _decide(state: CounterState, command) -> list[NewEvent]:
    if state.quarantine is not None:
        raise CommandRejected("CounterQuarantined", f"counter {state.counter_id} is quarantined")
    if command.command_type == "Increment":
        return [NewEvent("Incremented", {"by": command.payload["by"]}, command.issued_at)]
    raise CommandRejected("UnknownCommand", f"counter cannot handle {command.command_type}")


def _evolve(state: CounterState, event) -> CounterState:
    if event.event_type != "Incremented":
        raise ValueError(f"counter cannot apply {event.event_type}")
    version = getattr(event, "aggregate_version", None)
    return replace(state, value=state.value + event.payload["by"],
                   version=state.version if version is None else version)


COUNTER = Domain(
    aggregate_type="counter",
    initial=CounterState,
    decide=_decide,
    evolve=_evolve,
    commands={"Increment": {"by": Field(int, gt=0, le=1000)}},
    events={"Incremented": {"by": Field(int, gt=0, le=1000)}},
    event_schema_versions={"Incremented": 1},
    encode_state=lambda s: {"counter_id": s.counter_id, "version": s.version, "value": s.value,
                            "quarantine": s.quarantine},
    decode_state=lambda f: CounterState(f["counter_id"], f["version"], f["value"],
                                        tuple(f["quarantine"]) if f["quarantine"] else None),
    quarantined=lambda s, record, reason: s if s.quarantine else replace(s, quarantine=(record, reason)),
)


@pytest.fixture
def counter():
    with domains.registered(COUNTER) as domain:
        yield domain
    assert "counter" not in domains.DOMAINS and "Increment" not in schemas.COMMANDS


def raw(command_id: str, by: int = 1, aggregate_id: str = "c-1", **envelope) -> bytes:
    return json.dumps({"command_id": command_id, "command_type": "Increment", "aggregate_id": aggregate_id,
                       "payload": {"by": by}, "issued_at": T, **envelope}).encode()


def both_paths(value: bytes):
    """The command as the handler's fast path and the reference path read it (the same, or the same error)."""
    outcomes = []
    for parse in (CommandEnvelope.from_json, lambda r: CommandEnvelope.from_dict(json.loads(r))):
        try:
            outcomes.append(parse(value))
        except InvalidRecord as e:
            outcomes.append(f"InvalidRecord: {e}")
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


def test_the_registered_domain_joins_the_unions_and_routes_by_command_type(counter):
    assert schemas.COMMANDS["Increment"] is COUNTER.commands["Increment"]
    assert schemas.EVENT_SCHEMA_VERSIONS["Incremented"] == 1
    assert "Incremented" in schemas.EVENT_ENVELOPE["event_type"].choices
    assert both_paths(raw("c1")).aggregate_type == "counter"  # no aggregate_type: its command type says
    assert both_paths(raw("c1", aggregate_type="counter")).aggregate_type == "counter"
    assert CommandEnvelope.create("FreezeAccount", "acc-1", {}).aggregate_type == "account"


def test_a_counter_is_decided_and_evolved_by_the_generic_decider_with_expected_version(counter):
    state = initial_state(both_paths(raw("c1")))
    assert state == CounterState("c-1")
    state, events, result = execute(state, both_paths(raw("c1", 2, expected_version=0)), recorded_at=T)
    assert result.accepted and result.version == 1 and state == CounterState("c-1", 1, 2)
    assert [(e.aggregate_type, e.aggregate_version, e.event_type) for e in events] == [("counter", 1, "Incremented")]
    # A logged event reads back through the registry's schemas and folds to the same state.
    assert _evolve(CounterState("c-1"), EventEnvelope.from_json(events[0].to_json())) == state
    stale, none, rejected = execute(state, both_paths(raw("c2", expected_version=0)), recorded_at=T)
    assert (rejected.error_type, stale, none) == ("ConcurrencyConflict", state, [])
    assert rejected.reason == "expected version 0 of counter c-1, but it is at version 1"
    encoded_state, encoded, encoded_result = execute_encoded(CounterState("c-1"), both_paths(raw("c1", 2)), T)
    assert encoded_state == state and encoded == [events[0].to_json()] and encoded_result == result


@pytest.mark.parametrize("envelope, reason", [
    ({"aggregate_type": "nosuch"}, "command c9: unknown aggregate_type 'nosuch'; known: account, device, site, counter"),
    ({"aggregate_type": "account"}, "command c9: command_type 'Increment' is not a command of aggregate type "
                                    "'account' (it belongs to 'counter'); account's commands: OpenAccount, "),
])
def test_an_unknown_or_mismatched_aggregate_type_is_rejected_naming_it(counter, envelope, reason):
    rejection = both_paths(raw("c9", **envelope))
    assert isinstance(rejection, str) and rejection.startswith(f"InvalidRecord: {reason}")


def test_an_account_command_sent_to_the_counter_is_rejected_too(counter):
    value = json.dumps({"command_id": "c9", "command_type": "FreezeAccount", "aggregate_id": "a",
                        "aggregate_type": "counter", "payload": {}}).encode()
    assert both_paths(value) == ("InvalidRecord: command c9: command_type 'FreezeAccount' is not a command of "
                                 "aggregate type 'counter' (it belongs to 'account'); counter's commands: Increment")


class _Record:
    """A command record as confluent-kafka hands it to the handler."""

    def __init__(self, value: bytes, offset: int):
        self._value, self._offset = value, offset

    def value(self):
        return self._value

    def key(self):
        return None

    def topic(self):
        return "commands"

    def partition(self):
        return 0

    def offset(self):
        return self._offset


def test_the_handlers_batch_routes_each_command_to_its_aggregate_with_idempotency_and_concurrency(counter):
    """One batch through the handler's own code (no Kafka): a counter cannot take an account's id (ids are one
    namespace across aggregate types); a repeated command_id gets the first result; a stale expected_version
    is a conflict; an unknown aggregate type is rejected with its reason in the command result."""
    limits = RecordLimits.of("events", "results", "dead-letters", dict.fromkeys(("events", "results", "dead-letters"),
                                                                                  1_000_000))
    open_x = CommandEnvelope.create("OpenAccount", "x", {"customer_id": "cu", "credit_limit_minor": 10,
                                                         "currency": "USD"}, command_id="a1").to_json()
    values = [open_x, raw("k0", 5, "x"), raw("k1", 5, "y"), raw("k1", 5, "y"), raw("k2", 1, "y", expected_version=1),
              raw("k3", 1, "y", expected_version=1), raw("k4", aggregate_type="nosuch")]
    part, staged = PartitionState(0), StagedChanges()
    writes = decide_records([_Record(v, i) for i, v in enumerate(values)], part, staged, DecisionCounts(), T, None,
                            limits)
    events, results = writes.events, writes.results
    answers = [CommandResult.from_json(v) for _, v in results]
    assert [(r.command_id, r.status, r.version, r.duplicate, r.error_type) for r in answers] == [
        ("a1", "accepted", 1, False, None), ("k0", "rejected", 0, False, "AggregateIdTaken"),
        ("k1", "accepted", 1, False, None), ("k1", "accepted", 1, True, None),
        ("k2", "accepted", 2, False, None), ("k3", "rejected", 2, False, "ConcurrencyConflict"),
        ("k4", "rejected", -1, False, "InvalidCommand")]
    assert "unknown aggregate_type 'nosuch'" in answers[-1].reason
    assert answers[1].reason == ("command k0: aggregate id 'x' is taken by an aggregate of type 'account'; a "
                                 "'counter' cannot have it (aggregate ids are unique across aggregate types)")
    assert {k: s.version for k, (_, s) in staged.states.items()} == {("account", "x"): 1, ("counter", "y"): 2}
    assert [json.loads(v)["aggregate_type"] for _, v in events] == ["account", "counter", "counter"]


def test_snapshots_record_the_aggregate_type_and_the_rebuild_folds_by_it(counter):
    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    part = PartitionState(0)
    state, events, _ = execute(CounterState("x"), both_paths(raw("k1", 3, "x")), recorded_at=T)
    for offset, event in enumerate(events):
        rebuilder.apply_logged(part, event, SimpleNamespace(topic="events", offset=offset))
    assert part.states == {("counter", "x"): state}
    # An event whose aggregate type does not own its event type is not folded (the rebuild quarantines it).
    with pytest.raises(ValueError, match="Incremented is not an event of aggregate type 'account'"):
        rebuilder.apply_logged(part, replace(events[0], event_id="other", aggregate_type="account"),
                               SimpleNamespace(topic="events", offset=9))
    part.states[("account", "x")] = initial_state(CommandEnvelope.create("FreezeAccount", "x", {}))
    records = [SimpleNamespace(key=k, value=v) for k, v in snapshot_records(part)]
    assert b'"aggregate_type":"counter"' in b"".join(r.value for r in records)
    assert load_snapshot(records, 0, 100).states == part.states


def test_a_command_or_event_type_name_is_unique_across_domains(counter):
    for clash in (replace(COUNTER, aggregate_type="other"),
                  replace(COUNTER, aggregate_type="other", commands={"FreezeAccount": {}})):
        with pytest.raises(ValueError, match="already belong to aggregate type"):
            domains.register(clash)
    with pytest.raises(ValueError, match="registered twice"):
        domains.register(COUNTER)
    assert "other" not in domains.DOMAINS
