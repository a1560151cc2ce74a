"""The three fraud rules as pure functions: each fires exactly where expected and nowhere else."""
from event_store.account.fraud_rules import FraudState, Observation, detect, flag_command_id

S = 1000  # ms


def pay(version, t, pid, amount=100, location="US-NYC", kind="PaymentAuthorized"):
    return Observation(kind, version, t, pid, amount, location)


def device(version, t, location):
    return Observation("DeviceLocationReported", version, t, location=location)


def run(*events):
    state, out = FraudState(), []
    for e in events:
        state, found = detect(state, e)
        out += [(f.payment_id, f.rule) for f in found]
    return state, out


def test_first_payment_is_never_flagged():
    assert run(pay(2, 0, "p1", amount=10_000))[1] == []


def test_two_attempts_within_ten_seconds_flag_the_later_one_declined_counts_too():
    _, found = run(pay(2, 0, "p1"), pay(3, 9 * S, "p2", amount=50, kind="PaymentDeclined"))
    assert found == [("p2", "rapid_attempts")]
    assert run(pay(2, 0, "p1"), pay(3, 11 * S, "p2", amount=50))[1] == []


def test_out_of_event_time_order_still_flags_the_later_payment():
    # p2 happened first but is processed second: the later payment in event time (p1) is flagged.
    _, found = run(pay(2, 20 * S, "p1"), pay(3, 15 * S, "p2", amount=50))
    assert found == [("p1", "rapid_attempts")]


def test_amount_above_previous_max():
    _, found = run(pay(2, 0, "p1", 100), pay(3, 60 * S, "p2", 100), pay(4, 120 * S, "p3", 101))
    assert found == [("p3", "amount_above_max")]


def test_location_mismatch_uses_the_device_location_at_that_event_time():
    _, found = run(device(2, 0, "US-NYC"), pay(3, 60 * S, "p1", location="US-NYC"),
                   device(4, 100 * S, "GB-LON"), pay(5, 200 * S, "p2", 50, location="US-NYC"),
                   pay(6, 90 * S, "p3", 10, location="GB-LON"))
    # p2: device was in GB-LON at 200 s. p3 (at 90 s, processed late): device was still in US-NYC.
    assert sorted(found) == [("p2", "location_mismatch"), ("p3", "location_mismatch")]


def test_no_device_location_yet_means_no_location_flag():
    assert run(pay(2, 0, "p1", location="FR-PAR"), device(3, 100 * S, "US-SFO"))[1] == []
    assert run(device(2, 100 * S, "US-SFO"), pay(3, 50 * S, "p1", location="FR-PAR"))[1] == []


def test_replayed_events_flag_nothing_twice():
    events = [pay(2, 0, "p1"), pay(3, 5 * S, "p2", 500)]
    state, first = run(*events)
    for e in events:
        state, again = detect(state, e)
        assert again == []
    assert sorted(first) == [("p2", "amount_above_max"), ("p2", "rapid_attempts")]


def test_command_ids_derive_from_payment_and_rule():
    assert flag_command_id("p1", "rapid_attempts") == flag_command_id("p1", "rapid_attempts")
    assert flag_command_id("p1", "rapid_attempts") != flag_command_id("p1", "amount_above_max")


FAR_FUTURE = 253_402_214_399_999  # 9998-12-31T23:59:59.999Z in epoch ms


def test_a_payment_dated_far_in_the_future_changes_nothing_for_the_later_normal_payments():
    state, found = run(device(2, 0, "US-NYC"), pay(3, 10 * S, "p1"),
                       pay(4, FAR_FUTURE, "future", 50, location="GB-LON"),
                       device(5, FAR_FUTURE - 5 * S, "GB-LON"),
                       pay(6, 60 * S, "p2", 50), pay(7, 65 * S, "p3", 50), pay(8, 70 * S, "p4", 50, location="FR-PAR"))
    # The outlier is judged in its own time (the device was in US-NYC then, as far as anyone knows) and meets
    # no normal payment; the normal ones see each other, and the device where it was at their time.
    assert sorted(found) == [("future", "location_mismatch"), ("p3", "rapid_attempts"),
                             ("p4", "location_mismatch"), ("p4", "rapid_attempts")]


def test_the_bounded_history_ages_out_far_future_entries_in_the_order_received():
    # A burst of records dated far in the future (straight into the log: the handler would reject them) must
    # not crowd the account's normal entries out of the bounded history for good.
    future = [pay(2 + i, FAR_FUTURE - i * S, f"f{i}", 1) for i in range(70)]
    future += [device(72 + i, FAR_FUTURE - i * S, "JP-TYO") for i in range(70)]
    v = 142
    _, found = run(*future, device(v, 0, "US-NYC"), pay(v + 1, 10 * S, "p1", 1),
                   pay(v + 2, 15 * S, "p2", 1), pay(v + 3, 60 * S, "p3", 1, location="GB-LON"))
    normal = sorted(f for f in found if f[0].startswith("p"))
    assert normal == [("p2", "rapid_attempts"), ("p3", "location_mismatch")]


def test_history_keeps_the_entries_received_last():
    state, _ = run(*[pay(2 + i, FAR_FUTURE - i, f"f{i}", 1) for i in range(64)], pay(70, 0, "p1", 1))
    assert len(state.attempts) == 64 and state.attempts[-1] == (0, "p1")
