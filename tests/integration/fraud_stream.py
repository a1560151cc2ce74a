"""The fraud scenario the service tests stream (a broker restart, a broker lost from a cluster): six accounts'
commands with three findings among them, and how to read what the services made of it."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from lakehouse.settings import Settings
from tests.integration.services import Service, wait_for
from tests.oracle import assert_matches_oracle

__all__ = ["ACCOUNTS", "EXPECTED_FLAGS", "FLAGGED_ACCOUNTS", "SERVICES", "READY_LINES", "FraudStream", "command_stream",
           "read_log", "table", "log_versions", "summary_versions"]

ACCOUNTS = 6
ROUNDS = 10
# The findings the stream holds (event_store.account.fraud_rules), each to be recorded once as FraudSuspected, and so
# these accounts frozen by the policy; every other payment breaks no rule (amounts never rise, a minute apart,
# where the device is). One is sent before the outage, two after it.
EXPECTED_FLAGS = {("p1-2", "amount_above_max"), ("p2-7", "location_mismatch"), ("p3-8b", "rapid_attempts")}
FLAGGED_ACCOUNTS = {"acc-1", "acc-2", "acc-3"}
# The services in the order they are stopped: readers of the log first, the handler (the one writer) last.
SERVICES = {"project": ["project"], "detect-fraud": ["detect-fraud"], "policy": ["policy"], "handler": ["handler"]}
READY_LINES = {"project": "projection: projection-event_archive started", "detect-fraud": "fraud detector: reading",
               "handler": "partitions assigned", "policy": None}


def command_stream() -> list[list[CommandEnvelope]]:
    """Chunks of commands: accounts opened (acc-2's device reported), then rounds of one payment per account, a
    minute apart in event time, dated in the recent past; the three findings of EXPECTED_FLAGS among them."""
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=2)

    def at(minute: int, seconds: int = 0) -> str:
        return (start + timedelta(minutes=minute, seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def pay(account: int, payment_id: str, minute: int, amount: int, location: str = "US-NYC", seconds: int = 0):
        return CommandEnvelope.create("AuthorizePayment", f"acc-{account}", {
            "payment_id": payment_id, "amount_minor": amount, "currency": "USD", "merchant_id": f"m{account % 2}",
            "location": location, "occurred_at": at(minute, seconds + account)})

    opens = [CommandEnvelope.create("OpenAccount", f"acc-{a}", {"customer_id": f"c{a}",
                                                                "credit_limit_minor": 10_000_000, "currency": "USD"})
             for a in range(ACCOUNTS)]
    opens.append(CommandEnvelope.create("ReportDeviceLocation", "acc-2", {"location": "US-NYC",
                                                                          "occurred_at": at(0)}))
    rounds = []
    for r in range(1, ROUNDS + 1):
        chunk = []
        for a in range(ACCOUNTS):
            amount = 1_000 - r  # never above an earlier payment of the account
            if (a, r) == (1, 2):
                amount = 50_000  # amount_above_max
            chunk.append(pay(a, f"p{a}-{r}", r, amount, location="FR-PAR" if (a, r) == (2, 7) else "US-NYC"))
            if (a, r) == (3, 8):
                chunk.append(pay(a, "p3-8b", r, amount, seconds=3))  # rapid_attempts: 3 s after p3-8
        rounds.append(chunk)
    return [opens, *rounds]


def read_log(settings: Settings):
    """(command ids in the commands topic, results by command id, events in log order)."""
    commands = [json.loads(r.value)["command_id"] for r in kafka_log.read_all(settings, settings.commands_topic)]
    results = {r.command_id: r for r in (CommandResult.from_json(rec.value)
                                         for rec in kafka_log.read_all(settings, settings.results_topic))}
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    return commands, results, events


def table(spark, settings: Settings, name: str):
    return spark.read.format("delta").load(str(settings.table_path(name)))


def log_versions(events) -> dict[str, int]:
    last: dict[str, int] = {}
    for e in events:
        last[e.aggregate_id] = max(last.get(e.aggregate_id, 0), e.aggregate_version)
    return last


def summary_versions(spark, settings: Settings) -> dict[str, int]:
    return {r.account_id: r.version for r in table(spark, settings, "account_summary").collect()}


class FraudStream:
    """``command_stream()`` fed to running ``services`` by a client thread, and what must hold once it settled."""

    def __init__(self, settings: Settings, services: dict[str, Service]):
        self.settings, self.services = settings, services
        self.chunks = command_stream()
        self.sent: list[CommandEnvelope] = []  # the commands the broker acknowledged
        self.half_sent, self.feeding_done = threading.Event(), threading.Event()
        # Cleared by a test that sends the second half only once it has caused its fault (``go_on.set()``): a
        # fast service may have done all the first half's work already, so only commands sent after the fault
        # show what the services do while it lasts.
        self.go_on = threading.Event()
        self.go_on.set()

    def start_feeding_when_ready(self) -> None:
        def ready():
            for name, service in self.services.items():
                assert service.process.poll() is None, f"{name} ended early:\n{service.tail()}"
            return all(line is None or line in self.services[name].output() for name, line in READY_LINES.items())

        assert wait_for(ready, 420), {n: s.tail(5) for n, s in self.services.items()}
        threading.Thread(target=self._feed, daemon=True).start()

    def _feed(self) -> None:
        """A client submitting commands steadily; a chunk that fails is sent again (commands are idempotent)."""
        producer = kafka_log.make_producer(self.settings)
        try:
            for i, chunk in enumerate(self.chunks):
                while True:
                    try:
                        kafka_log.produce_all(producer, self.settings.commands_topic,
                                              [(c.aggregate_id, c.to_json()) for c in chunk])
                        break
                    except Exception:  # noqa: BLE001 -- the broker is away: the client retries
                        time.sleep(1)
                self.sent.extend(chunk)
                if i == len(self.chunks) // 2:
                    self.half_sent.set()
                    self.go_on.wait(300)
                time.sleep(0.3)
        finally:
            producer.close()
            self.feeding_done.set()

    def assert_answered_and_projected_once(self, spark) -> None:
        """Every acknowledged command answered and accepted, each event once with gap-free versions, each finding
        flagged once and its account frozen, the archive and the read models equal to the log's oracle."""
        settings, services = self.settings, self.services

        seen = {}

        def settled():
            commands, results, events = read_log(settings)
            flags = {(e.payload["payment_id"], e.payload["rule"]) for e in events if e.event_type == "FraudSuspected"}
            frozen = {e.aggregate_id for e in events if e.event_type == "AccountFrozen"}
            seen.update(unanswered=len(set(commands) - set(results)), commands=len(set(commands)),
                        events=len(events), flags=sorted(flags), frozen=sorted(frozen))
            done = set(commands) <= set(results) and flags >= EXPECTED_FLAGS and frozen >= FLAGGED_ACCOUNTS
            return (commands, results, events) if done else None

        log = wait_for(settled, 300, every_s=3)
        # The handler first: when nothing moves, it is the one that answers and appends.
        assert log, (f"not every command answered, or the fraud loop not closed: {seen['unanswered']} of "
                     f"{seen['commands']} commands unanswered, {seen['events']} events, findings flagged "
                     f"{seen['flags']} (expected {sorted(EXPECTED_FLAGS)}), accounts frozen {seen['frozen']}"
                     + "".join(f"\n--- {n}:\n{services[n].tail(25)}"
                               for n in sorted(services, key=lambda n: n != "handler")))
        commands, results, events = log
        for name, service in services.items():
            assert service.process.poll() is None, f"{name} ended:\n{service.tail()}"

        def projected():
            assert services["project"].process.poll() is None, f"project ended:\n{services['project'].tail()}"
            archived = table(spark, settings, "event_archive").count()
            return archived >= len(events) and summary_versions(spark, settings) == log_versions(events)

        assert wait_for(projected, 420, every_s=3), \
            f"the read models or the archive did not catch up with {len(events)} events:\n{services['project'].tail()}"
        time.sleep(3)  # anything projected twice would show now too

        assert {c.command_id for c in self.sent} <= set(results)
        assert all(r.accepted for r in results.values()), \
            {r.command_id: (r.error_type, r.reason) for r in results.values() if not r.accepted}
        versions = defaultdict(list)
        for e in events:
            versions[e.aggregate_id].append(e.aggregate_version)
        assert {a: v for a, v in versions.items() if v != list(range(1, len(v) + 1))} == {}
        flags = Counter((e.payload["payment_id"], e.payload["rule"]) for e in events
                        if e.event_type == "FraudSuspected")
        assert flags == Counter(EXPECTED_FLAGS), flags  # each finding once, and nothing else flagged
        assert {e.aggregate_id for e in events if e.event_type == "AccountFrozen"} == FLAGGED_ACCOUNTS
        archive = table(spark, settings, "event_archive").select("event_id").collect()
        assert Counter(r.event_id for r in archive) == Counter(e.event_id for e in events)  # once each
        assert_matches_oracle(spark, settings, events)
        statuses = {r.account_id: r.status for r in table(spark, settings, "account_summary").collect()}
        assert {a for a, status in statuses.items() if status == "frozen"} == FLAGGED_ACCOUNTS
