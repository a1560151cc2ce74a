"""The handler's hot path gives exactly what the reference path gives: same commands, same rejections (word for
word), same event bytes, same states and results, same event ids."""
import json
import uuid

import pytest

from event_store.account import AccountState, evolve
from event_store.decider import EVENT_ID_NAMESPACE, event_id_for, execute, execute_encoded
from event_store.envelope import CommandEnvelope, load_json, dumps
from event_store.errors import InvalidRecord
from eventlake.generator import GeneratorConfig, generate_commands

T = "2026-01-01T00:00:00.000Z"


def reference_command(raw):
    """CommandEnvelope.from_json as it was: the standard library's JSON, then from_dict."""
    return CommandEnvelope.from_dict(load_json(raw, "command"))


def outcome(parse, raw):
    try:
        return parse(raw)
    except InvalidRecord as e:
        return f"InvalidRecord: {e}"


def pay(**changes):
    obj = {"command_id": "c1", "command_type": "AuthorizePayment", "aggregate_id": "acc-1",
           "payload": {"payment_id": "p1", "amount_minor": 100, "currency": "USD", "merchant_id": "m1",
                       "location": "US-NYC", "occurred_at": T},
           "aggregate_type": "account", "expected_version": None, "issued_at": T, "correlation_id": None,
           "causation_id": None}
    for name, value in changes.items():
        if name.startswith("p_"):
            obj["payload"][name[2:]] = value
        else:
            obj[name] = value
    return obj


ODD = [
    pay(), pay(p_amount_minor=10**25), pay(p_amount_minor=True), pay(p_amount_minor=1.5), pay(p_amount_minor=0),
    pay(p_currency="XXX"), pay(p_location="nowhere"), pay(p_merchant_country="FRA"), pay(p_merchant_country="FR"),
    pay(p_payment_id=" "), pay(p_occurred_at="yesterday"), pay(expected_version=-1), pay(expected_version=False),
    pay(expected_version=3), pay(issued_at=""), pay(issued_at=0), pay(issued_at="2026-01-01T00:00:00"),
    pay(issued_at="2026-13-01T00:00:00Z"), pay(aggregate_type=7), pay(aggregate_type=""),
    pay(correlation_id=10**30), pay(correlation_id="k"), pay(causation_id=["x"]), pay(command_id=5),
    pay(command_type=["AuthorizePayment"]), pay(command_type="Teleport"), pay(aggregate_id=" "),
    pay(payload=[1]), pay(p_extra=10**40), pay(p_location="FR-PARÍS"), pay(aggregate_id="acc-é"),
    {"command_id": "c2", "command_type": "FlagFraud", "aggregate_id": "a", "payload": {"payment_id": "p",
                                                                                       "rule": "r"}},
    {"command_id": "c3", "command_type": "FreezeAccount", "aggregate_id": "a", "payload": {"reason": None}},
    {"command_id": "c4", "command_type": "FreezeAccount", "aggregate_id": "a", "payload": {}},
    {"command_id": "c5", "command_type": "FlagFraud", "aggregate_id": "a",
     "payload": {"payment_id": "p", "rule": "r", "evidence": None, "occurred_at": "then"}},
    pay(p_location="US-NYC\n"), pay(p_location="us-nyc"), pay(p_payment_id="\u00a0"), pay(p_payment_id="\x1c"),
    pay(p_payment_id=""), pay(p_currency="usd"), pay(p_currency=None), pay(p_merchant_country="US\n"),
    pay(p_merchant_country=None), pay(p_occurred_at=T + "\n"), pay(p_occurred_at="2026-01-01T00:00:00+02:00"),
    pay(p_amount_minor=-10**30), pay(p_amount_minor=1.0), pay(p_amount_minor="1"), pay(p_extra=None),
    pay(expected_version=0), pay(expected_version=10**20), pay(issued_at=None), pay(extra_top_level=[1]),
]


@pytest.mark.parametrize("obj", ODD)
def test_the_fast_command_parser_agrees_with_the_reference(obj):
    raw = json.dumps(obj).encode()
    fast, reference = outcome(CommandEnvelope.from_json, raw), outcome(reference_command, raw)
    if not isinstance(fast, str) and not obj.get("issued_at"):  # both issued "now", a moment apart
        fast, reference = fast.to_dict() | {"issued_at": None}, reference.to_dict() | {"issued_at": None}
    assert fast == reference


ODD_VALUES = [None, True, False, 0, -1, 1, 1.0, 1.5, 10**25, "", " ", "\u2003", "x", "US-NYC", "US-NYC\n", "USD",
              "FR", T, T + "\n", "2026-01-01T00:00:00", [], {}, ["x"]]


def test_randomly_damaged_commands_get_the_same_verdict_on_both_paths():
    import random

    rng = random.Random(11)
    cfg = GeneratorConfig(accounts=20, commands=600, seed=3, run_id="odd")
    for _, raw in generate_commands(cfg):
        obj = json.loads(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("payload"), dict):
            continue
        for _ in range(3):
            damaged = json.loads(raw)
            target = damaged["payload"] if rng.random() < 0.7 else damaged
            name = rng.choice(sorted(target) + ["surplus"])
            target[name] = rng.choice(ODD_VALUES)
            encoded = json.dumps(damaged).encode()
            fast, reference = outcome(CommandEnvelope.from_json, encoded), outcome(reference_command, encoded)
            if not isinstance(fast, str) and not damaged.get("issued_at"):
                fast, reference = fast.to_dict() | {"issued_at": None}, reference.to_dict() | {"issued_at": None}
            assert fast == reference, encoded


def test_a_repeated_key_counts_once_with_its_last_value_on_both_paths():
    raw = json.dumps(pay()).replace('"amount_minor": 100', '"amount_minor": 100, "amount_minor": -5').encode()
    assert outcome(CommandEnvelope.from_json, raw) == outcome(reference_command, raw)
    assert outcome(CommandEnvelope.from_json, raw).startswith("InvalidRecord")


@pytest.mark.parametrize("raw", [b"{nope", b"[1]", b"", b'{"a": NaN}', b'\xef\xbb\xbf{"command_id": 1}',
                                 b'{"command_id": "\\ud800"}', b'{"a": 1e400}', "{\"command_id\": \"c\"}"])
def test_unreadable_records_get_the_reference_reason(raw):
    assert outcome(CommandEnvelope.from_json, raw) == outcome(reference_command, raw)


def test_generated_streams_parse_and_execute_the_same_on_both_paths():
    cfg = GeneratorConfig(accounts=40, commands=3000, seed=5, run_id="core", invalid_rate=0.05,
                          malformed_rate=0.02)
    states: dict[str, AccountState] = {}
    for _, raw in generate_commands(cfg):
        command = outcome(CommandEnvelope.from_json, raw)
        assert command == outcome(reference_command, raw)
        if isinstance(command, str):
            continue
        state = states.get(command.aggregate_id) or AccountState(command.aggregate_id)
        new_state, envelopes, result = execute(state, command, T)
        fast_state, encoded, fast_result = execute_encoded(state, command, T)
        assert encoded == [e.to_json() for e in envelopes]
        assert [json.loads(e) for e in encoded] == [e.to_dict() for e in envelopes]
        assert (fast_state, fast_result) == (new_state, result)
        folded = state
        for e in envelopes:
            folded = evolve(folded, e)
        assert folded == new_state
        states[command.aggregate_id] = new_state


def test_event_ids_are_uuid5_of_the_aggregate_the_version_and_the_command_id():
    for i in range(2000):
        command_id = str(uuid.uuid4()) if i % 3 else f"cmd-{i}-é"
        assert event_id_for("account", f"acc-{i % 7}", i % 5 + 1, command_id) == str(
            uuid.uuid5(EVENT_ID_NAMESPACE, f"account/acc-{i % 7}/{i % 5 + 1}/{command_id}"))


def test_a_command_id_reused_on_another_aggregate_or_later_makes_events_with_ids_of_their_own():
    """A client that reuses a command id (on another aggregate, or on the same one once the first left the
    idempotency window) gets events of its own: readers skip an event whose id they have seen (a repeat)."""
    state_a, events_a, _ = execute(AccountState("a"), CommandEnvelope.create(
        "OpenAccount", "a", {"customer_id": "c", "credit_limit_minor": 10, "currency": "USD"}, command_id="same"))
    state_b, events_b, _ = execute(AccountState("b"), CommandEnvelope.create(
        "OpenAccount", "b", {"customer_id": "c", "credit_limit_minor": 10, "currency": "USD"}, command_id="same"))
    _, events_a2, _ = execute(state_a, CommandEnvelope.create("FreezeAccount", "a", {"reason": "test"},
                                                              command_id="same"))
    ids = [e.event_id for e in events_a + events_b + events_a2]
    assert len(ids) == len(set(ids)) == 3


def test_dumps_writes_what_orjson_refuses():
    assert json.loads(dumps({"amount_minor": 10**25, "b": "é"})) == {"amount_minor": 10**25, "b": "é"}
    assert dumps({"a": None, "b": [1, "x"]}) == b'{"a":null,"b":[1,"x"]}'


# The rebuild's repeat rule without every event id (issue 42) ---------------------------------------------------
def _rebuilt(log):
    """The handler's rebuild of one partition's ``log`` (envelopes in log order), without Kafka."""
    from types import SimpleNamespace

    from event_store.partition_rebuild import PartitionRebuilder
    from event_store.snapshots import PartitionState
    from lakehouse.settings import Settings

    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    part = PartitionState(0)
    for offset, e in enumerate(log):
        rebuilder.apply_logged(part, e, SimpleNamespace(topic="events", offset=offset))
    return part


def _read_side(log):
    """What the read models admit of ``log`` (read_models.sequence), as each account's last version's event id."""
    from read_models.sequence import sequence

    return {e.aggregate_id: e for e in sequence(log).admitted}


def _clean_log():
    from tests.domain_helpers import events_for

    return events_for(GeneratorConfig(accounts=1, commands=8, seed=3, run_id="ids"))


def test_the_events_the_handler_derives_are_not_kept_and_forged_ids_are():
    import dataclasses

    from tests.log_strategies import forged

    clean = _clean_log()
    assert all(e.event_id == event_id_for(e.aggregate_type, e.aggregate_id, e.aggregate_version, e.command_id)
               for e in clean)
    part = _rebuilt(clean + clean[2:5])  # a replay: counted once by the version rule
    assert part.event_ids == set() and part.events_held == len(clean)
    last = clean[-1].aggregate_version
    log = clean + [forged(clean[-1], "forged-next", aggregate_version=last + 1),
                   dataclasses.replace(clean[1], aggregate_version=last + 2)]
    part = _rebuilt(log)
    assert part.event_ids == {"forged-next"}
    assert part.states[("account", clean[0].aggregate_id)].version == last + 1 == \
        _read_side(log)[clean[0].aggregate_id].aggregate_version


def test_a_derived_record_after_a_forged_record_carrying_its_id_counts_nowhere_as_in_the_read_models():
    from tests.log_strategies import forged

    clean = _clean_log()
    last = clean[-1].aggregate_version
    # A forged record takes the next version under the id the handler's next event will derive: the real event
    # that follows repeats an id seen before.
    real = forged(clean[-1], "x", aggregate_version=last + 1)
    real = EventEnvelope_from(real, event_id=event_id_for("account", real.aggregate_id, last + 1, real.command_id))
    thief = EventEnvelope_from(forged(clean[-1], real.event_id, aggregate_version=last + 1), command_id="other")
    log = clean + [thief, real]
    part = _rebuilt(log)
    held = part.states[("account", clean[0].aggregate_id)]
    assert held.version == last + 1 == _read_side(log)[clean[0].aggregate_id].aggregate_version
    assert set(held.payment_ids.keys()) - {e.payload.get("payment_id") for e in clean} == \
        {thief.payload["payment_id"]}


def test_a_derived_event_that_lost_its_waiting_version_then_repeated_under_the_next_counts_nowhere():
    import dataclasses

    from tests.log_strategies import forged

    clean = _clean_log()
    head, tail = clean[:4], clean[5:]  # version 5 missing: versions 6.. wait
    gap_holder = forged(clean[5], "forged-6")  # takes the waiting slot of version 6 first
    repeat = dataclasses.replace(clean[5], aggregate_version=len(clean) + 1)
    log = head + [gap_holder] + tail + [clean[4], repeat]
    part = _rebuilt(log)
    aid = clean[0].aggregate_id
    assert part.states[("account", aid)].version == _read_side(log)[aid].aggregate_version == len(clean)
    assert clean[5].event_id in part.event_ids  # took no version: kept, so its repeat is recognised


def EventEnvelope_from(event, **changes):
    """``event`` with envelope ``changes`` (its payload kept)."""
    from event_store.envelope import EventEnvelope

    return EventEnvelope.from_dict({**json.loads(event.to_json()), **changes})


def test_a_forged_id_from_before_a_snapshot_is_still_caught_after_a_restart_from_it():
    from collections import namedtuple
    from types import SimpleNamespace

    from event_store.partition_rebuild import PartitionRebuilder
    from event_store.snapshots import load_snapshot, snapshot_records
    from lakehouse.settings import Settings
    from tests.log_strategies import forged

    clean = _clean_log()
    last = clean[-1].aggregate_version
    part = _rebuilt(clean + [forged(clean[-1], "forged-next", aggregate_version=last + 1)])
    Record = namedtuple("Record", "key value")
    restored = load_snapshot([Record(k, v) for k, v in snapshot_records(part)], 0, 100)
    assert restored.event_ids == {"forged-next"} and restored.events_held == part.events_held == len(clean) + 1
    again = forged(clean[-1], "forged-next", aggregate_version=last + 2)
    PartitionRebuilder(Settings.load({}), log=lambda *_: None).apply_logged(
        restored, again, SimpleNamespace(topic="events", offset=len(clean) + 1))
    assert restored.states == part.states
