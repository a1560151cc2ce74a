"""The account domain's data generator: customers, merchants, payments, device locations; bursts of payments,
payments over the credit limit, location mismatches, freezes, and (on request) malformed records; deterministic
for a given seed (and ``start``). ``eventlake.generator`` gathers the domains' generators.

Event time of a run: ``eventlake generate`` and ``eventlake demo`` date each run with ``dated``: its event times
end at the current time (never ahead of it, where the handler's clock-skew check would reject them) and start
at the later of (now - the run's nominal span) and the newest event time already in the log that is not ahead
of the clock. A second run thus lands after the first, past the read models' watermark: only the payments the
generator makes late on purpose (``late_rate``) go to ``late_events``. A run that follows the last one closely
is squeezed into the time since then (denser in event time: more rapid-attempt findings), rather than dated in
the future.
"""
from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Iterator

from event_store.envelope import CommandEnvelope, format_time

__all__ = ["GeneratorConfig", "generate_commands", "MALFORMED_SAMPLES", "REGIONS", "dated", "run_start",
           "newest_event_time", "records_for_cli"]

REGIONS = ("US-NYC", "US-SFO", "US-CHI", "GB-LON", "DE-BER", "FR-PAR", "JP-TYO", "BR-SAO", "IN-BOM", "AU-SYD")

# Records that are not commands at all; the handler must dead-letter them and go on.
MALFORMED_SAMPLES = (b"{not json", b"[1, 2, 3]", b"\xff\xfe\x00garbage", b'{"hello": "world"}')


@dataclass(frozen=True)
class GeneratorConfig:
    accounts: int = 300
    commands: int = 3000           # total, including the OpenAccount commands
    merchants: int = 50
    seed: int = 42
    run_id: str = "demo"           # prefixes account ids, so several runs can share one log
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    end: datetime | None = None    # if set, the stream's event times are spread over start..end, none after it
    currency: str = "USD"
    mean_interval_s: float = 1.0   # mean event-time gap between two commands of the stream
    burst_rate: float = 0.05       # share of payments followed by a second one within 10 s
    late_rate: float = 0.01        # share of payments whose event time is 15-120 minutes in the past
    invalid_rate: float = 0.0      # share of commands with a bad field (rejected with a reason)
    malformed_rate: float = 0.0    # share of records that are not commands (dead-lettered)


def generate_commands(cfg: GeneratorConfig) -> Iterator[tuple[str, bytes]]:
    """(Kafka key, command JSON) pairs: every account is opened before it is used."""
    rng = random.Random(cfg.seed)
    accounts = [f"acc-{cfg.run_id}-{i:05d}" for i in range(cfg.accounts)]
    home = {a: rng.choice(REGIONS) for a in accounts}
    # One stream clock: commands arrive in event-time order, about mean_interval_s apart, except the late ones.
    now = cfg.start
    mean_interval_s = cfg.mean_interval_s
    if cfg.end is not None:
        # Three standard deviations of the sum of the gaps to spare: the stream rarely reaches ``end``.
        steps = max(cfg.commands - cfg.accounts, 1)
        mean_interval_s = max((cfg.end - cfg.start).total_seconds(), 0.0) / (steps + 3 * steps ** 0.5)
    end = cfg.end or datetime.max.replace(tzinfo=timezone.utc)
    clock = {a: cfg.start + timedelta(milliseconds=10 * i) for i, a in enumerate(accounts)}
    limits = {a: rng.choice((50_000, 100_000, 250_000, 500_000)) for a in accounts}
    merchants = [f"mer-{i:04d}" for i in range(cfg.merchants)]
    payment_seq = 0

    def command(kind: str, account: str, payload: dict) -> tuple[str, bytes]:
        command_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return account, CommandEnvelope.create(kind, account, payload, command_id=command_id,
                                               issued_at=format_time(clock[account])).to_json()

    for i, a in enumerate(accounts):
        opening = {"customer_id": f"cus-{a[4:]}", "credit_limit_minor": limits[a], "currency": cfg.currency}
        if i % 2 == 0:  # the customer's name and email (personal: issue 45) on every other account; without them
            # on the rest, as commands written before they existed. Derived from the id: the stream's random
            # draws stay what they were.
            opening.update(customer_name=f"Customer {a[4:]}", customer_email=f"cus-{a[4:]}@example.org")
        yield command("OpenAccount", a, opening)
    for _ in range(max(cfg.commands - cfg.accounts, 0)):
        a = rng.choice(accounts)
        r = rng.random()
        if r < cfg.malformed_rate:
            yield a, rng.choice(MALFORMED_SAMPLES)
            continue
        if r < cfg.malformed_rate + cfg.invalid_rate:
            bad = json.loads(command("AuthorizePayment", a, _payment(rng, a, "pay-x", merchants, home, clock,
                                                                      cfg))[1])
            bad["payload"]["amount_minor"] = -abs(bad["payload"]["amount_minor"])
            yield a, json.dumps(bad).encode()
            continue
        now = min(now + timedelta(seconds=rng.expovariate(1.0 / mean_interval_s) if mean_interval_s else 0), end)
        clock[a] = now
        kind = rng.random()
        if kind < 0.12:
            home[a] = rng.choice(REGIONS) if rng.random() < 0.3 else home[a]
            yield command("ReportDeviceLocation", a, {"location": home[a], "occurred_at": format_time(clock[a])})
        elif kind < 0.14:
            yield command("FreezeAccount", a, {"reason": "customer request"})
        elif kind < 0.16:
            yield command("UnfreezeAccount", a, {"reason": "customer verified"})
        else:
            payment_seq += 1
            if rng.random() < cfg.late_rate:  # e.g. a terminal that was offline: arrives long after it happened
                clock[a] = now - timedelta(minutes=rng.randint(15, 120))
            yield command("AuthorizePayment", a, _payment(rng, a, f"pay-{cfg.run_id}-{payment_seq:07d}",
                                                          merchants, home, clock, cfg))
            if rng.random() < cfg.burst_rate:
                payment_seq += 1
                clock[a] = min(clock[a] + timedelta(seconds=rng.randint(1, 9)), end)
                yield command("AuthorizePayment", a, _payment(rng, a, f"pay-{cfg.run_id}-{payment_seq:07d}",
                                                              merchants, home, clock, cfg))


def _payment(rng: random.Random, account: str, payment_id: str, merchants, home, clock, cfg) -> dict:
    # Mostly small card payments, sometimes a large one that can exceed the available credit.
    amount = int(rng.lognormvariate(7.5, 1.0)) + 100 if rng.random() < 0.97 else rng.randint(50_000, 400_000)
    location = home[account] if rng.random() < 0.93 else rng.choice(REGIONS)
    return {"payment_id": payment_id, "amount_minor": amount, "currency": cfg.currency,
            "merchant_id": rng.choice(merchants), "location": location, "occurred_at": format_time(clock[account])}


def dated(cfg: GeneratorConfig, settings=None, now: datetime | None = None) -> GeneratorConfig:
    """``cfg`` dated for a run at ``now`` (default: the current time): its event times end at ``now`` and start
    at ``run_start`` (after the newest event time of the events topic of ``settings``, when given)."""
    now = now or datetime.now(timezone.utc)
    newest = newest_event_time(settings, now) if settings is not None else None
    return replace(cfg, start=run_start(cfg, now, newest), end=now)


def run_start(cfg: GeneratorConfig, now: datetime, newest: datetime | None) -> datetime:
    """The later of (now - the run's nominal span: one mean interval per command) and ``newest``, the newest
    event time already in the log (ignored if ahead of ``now``: an outlier must not date the run)."""
    start = now - timedelta(seconds=cfg.mean_interval_s * max(cfg.commands - cfg.accounts, 0))
    if newest is not None and start < newest <= now:
        start = newest
    return start


def newest_event_time(settings, now: datetime, tail: int = 1000) -> datetime | None:
    """The newest ``occurred_at`` not ahead of ``now`` among the last ``tail`` records of each partition of the
    events topic (the newest run's events are at the ends); None if the topic is empty or missing. Records that
    are not readable events are skipped: they date nothing."""
    from kafka import TopicPartition

    from event_store import kafka_log
    from event_store.envelope import parse_time

    consumer = kafka_log.make_consumer(settings)
    newest = None
    try:
        partitions = [TopicPartition(settings.events_topic, p)
                      for p in sorted(consumer.partitions_for_topic(settings.events_topic) or ())]
        ends = consumer.end_offsets(partitions) if partitions else {}
        for tp in partitions:
            for record in kafka_log.read_partition(consumer, tp, max(ends[tp] - tail, 0), ends[tp],
                                                   idle_timeout_s=1.0):
                try:
                    t = parse_time(json.loads(record.value)["occurred_at"], "occurred_at")
                except Exception:  # noqa: BLE001 - a null, non-JSON or odd record dates nothing
                    continue
                if t <= now and (newest is None or t > newest):
                    newest = t
    finally:
        consumer.close()
    return newest


def records_for_cli(settings, args) -> tuple[list, str]:
    """``eventlake generate --domain accounts``: dated from now (after the log's newest event), so a second run is
    on time, not late against the first."""
    cfg = dated(GeneratorConfig(accounts=args.accounts, commands=args.commands, seed=args.seed, run_id=args.run_id,
                                invalid_rate=args.invalid_rate, malformed_rate=args.malformed_rate), settings)
    return list(generate_commands(cfg)), f"{args.accounts} accounts"
