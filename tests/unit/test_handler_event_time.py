"""Event time ahead of the handler's clock: rejected before anything is written (issue 14, defect 6)."""
from datetime import datetime, timezone

import pytest

from event_store.account import AccountState
from event_store.envelope import CommandEnvelope
from event_store.decider import EventTimeLimit, execute, execute_encoded

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
LIMIT = EventTimeLimit.at(NOW, 900)
OPEN = AccountState("acc-1", version=1, opened=True, customer_id="c", credit_limit_minor=10_000, currency="USD")


def pay(occurred_at: str, issued_at: str = "2026-03-01T11:59:00.000Z") -> CommandEnvelope:
    return CommandEnvelope.create("AuthorizePayment", "acc-1", {
        "payment_id": "p1", "amount_minor": 100, "currency": "USD", "merchant_id": "m1", "location": "US-NYC",
        "occurred_at": occurred_at}, command_id="c1", issued_at=issued_at)


@pytest.mark.parametrize("run", [execute, execute_encoded])
@pytest.mark.parametrize("occurred_at", ["9998-12-31T23:59:59Z", "2026-03-01T12:15:01Z", "2026-03-01T12:15:00.001Z",
                                         "2026-03-01T14:15:01+02:00", "2026-03-02T00:00:00.000Z"])
def test_an_event_time_beyond_the_allowed_skew_is_rejected_naming_both_times_and_the_setting(run, occurred_at):
    state, events, result = run(OPEN, pay(occurred_at), "2026-03-01T12:00:00.000Z", LIMIT)
    assert (state, events, result.status, result.error_type) == (OPEN, [], "rejected", "EventTimeInFuture")
    assert occurred_at in result.reason and "2026-03-01T12:00:00.000Z" in result.reason
    assert "max_event_time_ahead_s" in result.reason and "900s" in result.reason


@pytest.mark.parametrize("run", [execute, execute_encoded])
@pytest.mark.parametrize("occurred_at", ["2026-03-01T12:15:00Z", "2026-03-01T12:14:59.999Z", "2020-01-01T00:00:00Z",
                                         "2026-03-01T14:15:00+02:00", "2026-03-01T11:00:00-01:00"])
def test_event_times_up_to_the_skew_and_in_the_past_are_accepted(run, occurred_at):
    state, events, result = run(OPEN, pay(occurred_at), "2026-03-01T12:00:00.000Z", LIMIT)
    assert result.status == "accepted" and len(events) == 1 and state.version == 2


def test_the_event_time_of_commands_without_occurred_at_is_their_issued_at():
    command = CommandEnvelope.create("FreezeAccount", "acc-1", {"reason": "x"}, command_id="c2",
                                     issued_at="2030-01-01T00:00:00Z")
    _, events, result = execute_encoded(OPEN, command, "2026-03-01T12:00:00.000Z", LIMIT)
    assert (events, result.error_type) == ([], "EventTimeInFuture") and "issued_at 2030-01-01" in result.reason


def test_without_a_limit_the_pure_core_is_unchanged():
    _, events, result = execute_encoded(OPEN, pay("9998-12-31T23:59:59Z"), "2026-03-01T12:00:00.000Z")
    assert result.status == "accepted" and len(events) == 1
