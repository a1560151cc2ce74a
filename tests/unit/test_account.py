"""decide/evolve of the account aggregate: given these events, expect this state and these decisions."""
import pytest

from event_store.account import AccountState, CommandRejected, decide, evolve
from event_store.decider import execute
from event_store.envelope import CommandEnvelope
from event_store.errors import InvalidRecord

T0 = "2026-01-01T10:00:00.000Z"


def cmd(kind, payload, account="acc-1", **kw):
    return CommandEnvelope.create(kind, account, payload, **kw)


def open_cmd(limit=10_000, currency="USD", **kw):
    return cmd("OpenAccount", {"customer_id": "cus-1", "credit_limit_minor": limit, "currency": currency}, **kw)


def pay(amount, payment_id="p1", currency="USD", location="US-NYC", at=T0, **kw):
    return cmd("AuthorizePayment", {"payment_id": payment_id, "amount_minor": amount, "currency": currency,
                                    "merchant_id": "m1", "location": location, "occurred_at": at}, **kw)


def run(*commands):
    state, all_events, results = AccountState("acc-1"), [], []
    for c in commands:
        state, events, result = execute(state, c)
        all_events += events
        results.append(result)
    return state, all_events, results


def test_open_account_emits_account_opened_and_sets_state():
    state, events, _ = run(open_cmd(limit=5000))
    assert [e.event_type for e in events] == ["AccountOpened"]
    assert events[0].aggregate_version == 1
    assert (state.opened, state.status, state.credit_limit_minor, state.available_minor, state.version) == \
        (True, "open", 5000, 5000, 1)


def test_opening_twice_is_rejected():
    with pytest.raises(CommandRejected) as e:
        decide(run(open_cmd())[0], open_cmd())
    assert e.value.error_type == "AccountAlreadyOpen"


def test_payment_on_unknown_account_is_rejected_with_a_reason():
    _, events, results = run(pay(100))
    assert events == []
    assert results[0].status == "rejected" and results[0].error_type == "AccountNotFound"
    assert "OpenAccount" in results[0].reason


def test_payments_within_credit_are_authorized_and_reduce_available():
    state, events, _ = run(open_cmd(limit=1000), pay(300, "p1"), pay(700, "p2"))
    assert [e.event_type for e in events] == ["AccountOpened", "PaymentAuthorized", "PaymentAuthorized"]
    assert [e.aggregate_version for e in events] == [1, 2, 3]
    assert (state.available_minor, state.payments_authorized, state.authorized_total_minor) == (0, 2, 1000)


def test_payment_over_available_credit_is_declined_not_rejected():
    state, events, results = run(open_cmd(limit=1000), pay(600, "p1"), pay(500, "p2"))
    assert events[-1].event_type == "PaymentDeclined"
    assert events[-1].payload["reason"] == "over_credit_limit"
    assert results[-1].accepted
    assert (state.payments_declined, state.available_minor, state.version) == (1, 400, 3)


def test_frozen_account_declines_payments_until_unfrozen():
    state, events, _ = run(open_cmd(), cmd("FreezeAccount", {"reason": "fraud"}), pay(10, "p1"),
                           cmd("UnfreezeAccount", {}), pay(10, "p2"))
    assert [e.event_type for e in events] == ["AccountOpened", "AccountFrozen", "PaymentDeclined",
                                              "AccountUnfrozen", "PaymentAuthorized"]
    assert events[2].payload["reason"] == "account_frozen"
    assert state.status == "open"


def test_freezing_a_frozen_account_is_accepted_without_events():
    state, events, results = run(open_cmd(), cmd("FreezeAccount", {}), cmd("FreezeAccount", {}))
    assert [e.event_type for e in events] == ["AccountOpened", "AccountFrozen"]
    assert results[-1].accepted and results[-1].event_ids == ()


def test_currency_mismatch_is_rejected():
    _, _, results = run(open_cmd(currency="EUR"), pay(10, currency="USD"))
    assert results[-1].error_type == "CurrencyMismatch"


def test_device_location_and_fraud_flag():
    state, events, _ = run(open_cmd(), cmd("ReportDeviceLocation", {"location": "GB-LON", "occurred_at": T0}),
                           cmd("FlagFraud", {"payment_id": "p9", "rule": "location_mismatch"}))
    assert state.last_device_location == "GB-LON"
    assert events[-1].event_type == "FraudSuspected" and events[-1].payload["rule"] == "location_mismatch"


def test_stale_expected_version_is_a_concurrency_conflict():
    _, _, results = run(open_cmd(), pay(10, "p1"), pay(10, "p2", expected_version=1))
    assert results[-1].error_type == "ConcurrencyConflict"
    assert "version 2" in results[-1].reason


def test_event_ids_derive_from_the_command_so_a_redo_writes_the_same_ids():
    c = open_cmd()
    assert execute(AccountState("acc-1"), c)[1][0].event_id == execute(AccountState("acc-1"), c)[1][0].event_id


def test_evolve_refuses_unknown_event_types():
    from event_store.account import NewEvent

    with pytest.raises(ValueError, match="unknown event type"):
        evolve(AccountState("a"), NewEvent("Teleported", {}, T0))


@pytest.mark.parametrize("payload, message", [
    ({"payment_id": "p", "amount_minor": -5, "currency": "USD", "merchant_id": "m", "location": "US-NYC",
      "occurred_at": T0}, "amount_minor' must be > 0"),
    ({"payment_id": "p", "amount_minor": 5.5, "currency": "USD", "merchant_id": "m", "location": "US-NYC",
      "occurred_at": T0}, "amount_minor' must be int"),
    ({"payment_id": "p", "amount_minor": 5, "currency": "XXX", "merchant_id": "m", "location": "US-NYC",
      "occurred_at": T0}, "not a known ISO-4217"),
    ({"payment_id": "p", "amount_minor": 5, "currency": "USD", "merchant_id": "m", "location": "nowhere",
      "occurred_at": T0}, "region code"),
    ({"payment_id": "p", "amount_minor": 5, "currency": "USD", "location": "US-NYC", "occurred_at": T0},
     "missing required field 'merchant_id'"),
])
def test_invalid_commands_are_refused_with_the_field_and_reason(payload, message):
    with pytest.raises(InvalidRecord, match=message):
        CommandEnvelope.create("AuthorizePayment", "acc-1", payload)


def test_a_payment_id_already_attempted_on_the_account_is_rejected_whatever_its_command_id():
    # Two commands (different command_ids) for one payment: the second is not a second payment.
    state, events, results = run(open_cmd(limit=1000), pay(5000, "p1"), pay(100, "p1"), pay(100, "p2"))
    assert [r.error_type for r in results] == [None, None, "DuplicatePayment", None]
    assert "p1" in results[2].reason and "acc-1" in results[2].reason
    assert [e.event_type for e in events] == ["AccountOpened", "PaymentDeclined", "PaymentAuthorized"]
    assert (state.payments_declined, state.payments_authorized, set(state.payment_ids)) == (1, 1, {"p1", "p2"})


def _reachable(root) -> dict[int, object]:
    """Every object the garbage collector reaches from ``root`` (through ``gc.get_referents``), by id."""
    import gc

    seen, todo = {}, [root]
    while todo:
        o = todo.pop()
        if id(o) not in seen:
            seen[id(o)] = o
            todo += gc.get_referents(o)
    return seen


def test_a_new_payment_costs_the_collector_a_few_references_however_many_ids_the_account_holds():
    # Each payment makes a new version of the account's payment ids: young objects, visited by every collection
    # of the youngest generation (the handler's, every few seconds). The new objects a payment makes must hold a
    # few references, not one per id the account has seen (pyrsistent's pset did: its C vector's traversal visits
    # every id, and the handler's young collections grew with the log to seconds; bench/payment_ids.py
    # --collector).
    import gc

    from event_store.account import evolve_fields

    state = evolve_fields(AccountState("acc-1"), "AccountOpened",
                          {"customer_id": "c", "credit_limit_minor": 10 ** 12, "currency": "USD"}, 1)
    for i in range(20_000):
        state = evolve_fields(state, "PaymentAuthorized", {"payment_id": f"p-{i}", "amount_minor": 1}, i + 2)
    after = evolve_fields(state, "PaymentAuthorized", {"payment_id": "p-new", "amount_minor": 1}, 20_002)
    before = _reachable(state.payment_ids)
    new = [o for i, o in _reachable(after.payment_ids).items() if i not in before and gc.is_tracked(o)]
    visited = sum(len(gc.get_referents(o)) for o in new)
    assert "p-new" in after.payment_ids and "p-new" not in state.payment_ids and len(after.payment_ids) == 20_001
    assert visited < 500, f"one payment's new objects hold {visited} references for 20,001 ids"


def test_payment_ids_survive_a_snapshot():
    from event_store.snapshots import PartitionState, load_snapshot, snapshot_records

    state, _, _ = run(open_cmd(), pay(100, "p1"), pay(200, "p2"))
    part = PartitionState(0, states={("account", "acc-1"): state})

    class Record:
        def __init__(self, key, value):
            self.key, self.value = key, value

    loaded = load_snapshot([Record(k, v) for k, v in snapshot_records(part)], 0, 100)
    assert loaded.states[("account", "acc-1")] == state
    with pytest.raises(CommandRejected, match="DuplicatePayment|already attempted"):
        decide(loaded.states[("account", "acc-1")], pay(1, "p2"))


def test_a_quarantined_account_takes_only_the_resolution_that_names_its_record():
    from event_store.account import quarantined

    state, _, _ = run(open_cmd(), pay(100, "p1"))
    state = quarantined(state, "events/2/41", "aggregate_version: must be > 0, got -1")
    assert quarantined(state, "events/2/99", "another") == state  # the first unreadable record stands
    with pytest.raises(CommandRejected, match="events/2/41.*must be > 0") as rejected:
        decide(state, pay(50, "p2"))
    assert rejected.value.error_type == "AccountQuarantined"
    resolve = {"record": "events/2/41", "reason": "forged record, amount refunded", "resolved_by": "ops-anna"}
    with pytest.raises(CommandRejected, match="quarantined by record events/2/41, not events/2/40"):
        decide(state, cmd("ResolveQuarantine", {**resolve, "record": "events/2/40"}))
    [event] = decide(state, cmd("ResolveQuarantine", resolve))
    assert event.event_type == "QuarantineResolved"
    assert event.payload == {**resolve, "evidence": "aggregate_version: must be > 0, got -1"}
    state, events, result = execute(state, cmd("ResolveQuarantine", resolve))
    assert result.status == "accepted" and state.quarantine is None and state.version == 3
    assert execute(state, pay(50, "p2"))[2].status == "accepted"
    with pytest.raises(CommandRejected) as not_quarantined:
        decide(state, cmd("ResolveQuarantine", resolve))
    assert not_quarantined.value.error_type == "NotQuarantined"


def test_a_quarantine_survives_a_snapshot():
    from event_store.account import quarantined
    from event_store.snapshots import PartitionState, load_snapshot, snapshot_records

    state = quarantined(run(open_cmd())[0], "events/0/7", "not JSON")
    part = PartitionState(0, states={("account", "acc-1"): state})

    class Record:
        def __init__(self, key, value):
            self.key, self.value = key, value

    loaded = load_snapshot([Record(k, v) for k, v in snapshot_records(part)], 0, 100)
    assert loaded.states[("account", "acc-1")] == state and loaded.states[("account", "acc-1")].quarantine == ("events/0/7", "not JSON")


def test_forgetting_the_customer_records_it_once_and_the_account_takes_no_command_after():
    from event_store.account import quarantined

    forget = cmd("ForgetSubject", {"customer_id": "cus-1"})
    state, _, _ = run(open_cmd(), cmd("ReportDeviceLocation", {"location": "IS-RKV", "occurred_at": T0}))
    with pytest.raises(CommandRejected) as other:
        decide(state, cmd("ForgetSubject", {"customer_id": "cus-2"}))
    assert other.value.error_type == "SubjectMismatch" and "'cus-1', not 'cus-2'" in other.value.reason
    # Taken even while quarantined: the law does not wait for an operator.
    [event] = decide(quarantined(state, "events/0/3", "not JSON"), forget)
    assert (event.event_type, dict(event.payload)) == ("SubjectForgotten", {"customer_id": "cus-1"})
    state, events, result = execute(state, forget)
    assert result.status == "accepted" and events[0].aggregate_version == 3
    assert state.forgotten and state.last_device_location is None  # the state keeps no location of theirs
    _, again, result = execute(state, forget)
    assert again == [] and result.status == "accepted"  # again (forget run twice): accepted, no event
    for later in (pay(1, "p9"), cmd("FreezeAccount", {}), open_cmd()):
        with pytest.raises(CommandRejected) as refused:
            decide(state, later)
        assert refused.value.error_type == "SubjectForgotten" and "was forgotten" in refused.value.reason
    with pytest.raises(CommandRejected) as unknown:
        decide(AccountState("acc-2"), cmd("ForgetSubject", {"customer_id": "cus-1"}, account="acc-2"))
    assert unknown.value.error_type == "AccountNotFound"
