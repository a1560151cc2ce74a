"""Data generators: command streams for the demo, the tests and the benchmarks, deterministic for a given seed
(and ``start``).

- Accounts (``generate_commands``): customers, merchants, payments, device locations; bursts of payments,
  payments over the credit limit, location mismatches, freezes, and (on request) malformed records.
- IoT telemetry (``generate_iot_commands``): devices across sites and sensor kinds reporting at a steady cadence,
  with deliberate cases for the telemetry detector and the device aggregate's rejections (see
  :class:`IotGeneratorConfig`).
- Web traffic (``generate_site_commands``): sites and their page views, some of them late, with a retired site
  and an unknown one for the site aggregate's rejections (see :class:`SiteGeneratorConfig`).

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
from typing import Iterable, Iterator

from event_store.envelope import CommandEnvelope, dumps, format_time
from event_store.fields import validate_payload
from event_store.iot import schemas as iot_schemas
from event_store.site import schemas as site_schemas

__all__ = ["GeneratorConfig", "generate_commands", "MALFORMED_SAMPLES", "dated", "run_start",
           "newest_event_time", "IotGeneratorConfig", "generate_iot_commands", "SENSOR_KINDS", "SiteGeneratorConfig",
           "generate_site_commands", "interleaved", "decide_all"]

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

    for a in accounts:
        yield command("OpenAccount", a, {"customer_id": f"cus-{a[4:]}", "credit_limit_minor": limits[a],
                                         "currency": cfg.currency})
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


# Sensor kind -> (unit, allowed range min and max, typical value, noise), values in thousandths of the unit.
SENSOR_KINDS: dict[str, tuple[str, int, int, int, int]] = {
    "temperature": ("C", -10_000, 40_000, 21_000, 1_500),
    "humidity": ("%RH", 20_000, 80_000, 45_000, 4_000),
    "pressure": ("hPa", 950_000, 1_050_000, 1_013_000, 3_000),
    "co2": ("ppm", 350_000, 1_500_000, 600_000, 50_000),
    "vibration": ("mm/s", 0, 12_000, 3_000, 800),
}
# A unit each kind's devices do not use (a reading in it is rejected UnitMismatch).
_WRONG_UNITS = {"C": "F", "%RH": "g/m3", "hPa": "psi", "ppm": "ppb", "mm/s": "in/s"}
_HEARTBEATS_S = (10, 15, 30, 60)


@dataclass(frozen=True)
class IotGeneratorConfig:
    """An IoT telemetry stream: ``devices`` registered at ``start`` across ``sites`` and the sensor kinds, each
    reporting every heartbeat interval for ``minutes`` of event time, and these deliberate cases (a silent, a
    decommissioned and an out-of-range device each has that one case; wrong units and re-registrations go to
    the other devices; late readings to any device, never inside an out-of-range run):

    - ``out_of_range_runs`` runs of 3 to 5 consecutive readings outside the device's range (each must be
      flagged) and ``short_out_of_range_runs`` runs of exactly 2 (must not be); every other reading is in range;
    - ``late_rate``: the share of readings that arrive 1 to 10 minutes after they were measured, behind
      readings measured later (out of order);
    - ``silent_devices`` that stop reporting halfway through, without being decommissioned (each must be
      flagged silent once its heartbeat interval passes);
    - ``decommissions``: devices decommissioned at two thirds of the span, each sent one more reading after
      (rejected ``DeviceNotActive``);
    - ``unknown_device_readings`` for devices never registered (rejected ``DeviceNotFound``),
      ``wrong_unit_readings`` in a unit the device does not use (rejected ``UnitMismatch``) and
      ``duplicate_registrations`` of registered devices (rejected ``DeviceAlreadyRegistered``).
    """
    devices: int = 24
    sites: int = 4
    minutes: int = 30
    seed: int = 42
    run_id: str = "demo"           # prefixes device ids, so several runs can share one log
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    out_of_range_runs: int = 3
    short_out_of_range_runs: int = 1
    late_rate: float = 0.02
    silent_devices: int = 1
    decommissions: int = 2
    unknown_device_readings: int = 3
    wrong_unit_readings: int = 3
    duplicate_registrations: int = 1


def generate_iot_commands(cfg: IotGeneratorConfig) -> Iterator[tuple[str, bytes]]:
    """(Kafka key, command JSON) pairs in arrival order (``issued_at``): every device is registered before its
    readings arrive. Every command is valid against the device domain's schemas; the rejections are the
    deliberate cases of ``cfg``. Built without the command envelope's routing, which needs the domain in the
    registry (``event_store.domains``); the JSON is what ``CommandEnvelope.to_json`` writes."""
    special = cfg.out_of_range_runs + cfg.short_out_of_range_runs + cfg.silent_devices + cfg.decommissions
    if cfg.devices < special + 1:
        raise ValueError(f"IotGeneratorConfig: devices={cfg.devices} is too few for its cases: "
                         f"{special} devices take a case of their own, and one more must stay ordinary")
    if cfg.minutes < 10:
        raise ValueError(f"IotGeneratorConfig: minutes={cfg.minutes}; at least 10 minutes, so that every device "
                         f"reports often enough for an out-of-range run with in-range readings around it, and a "
                         f"silent device stays silent for longer than the longest heartbeat interval")
    rng = random.Random(cfg.seed)
    span = timedelta(minutes=cfg.minutes)
    end = cfg.start + span
    sites = [f"site-{cfg.run_id}-{i:02d}" for i in range(cfg.sites)]
    kinds = list(SENSOR_KINDS)
    devices = [f"dev-{cfg.run_id}-{i:05d}" for i in range(cfg.devices)]
    kind_of = {d: kinds[i % len(kinds)] for i, d in enumerate(devices)}
    heartbeat = {d: rng.choice(_HEARTBEATS_S) for d in devices}
    # Each case on devices of its own: [silent | decommissioned | long runs | short runs | ordinary ...].
    order = rng.sample(devices, len(devices))
    taken: dict[str, set[str]] = {}
    at = 0
    for name, n in (("silent", cfg.silent_devices), ("decommissioned", cfg.decommissions),
                    ("long_run", cfg.out_of_range_runs), ("short_run", cfg.short_out_of_range_runs)):
        taken[name], at = set(order[at:at + n]), at + n
    ordinary = order[at:]
    stream: list[tuple[datetime, int, str, str, dict]] = []  # (arrival, tiebreak, device, command type, payload)

    def add(arrival: datetime, device: str, kind: str, payload: dict) -> None:
        stream.append((arrival, len(stream), device, kind, payload))

    for i, d in enumerate(devices):
        unit, low, high, _, _ = SENSOR_KINDS[kind_of[d]]
        add(cfg.start + timedelta(milliseconds=10 * i), d, "RegisterDevice", {
            "site_id": sites[i % len(sites)], "sensor_kind": kind_of[d], "unit": unit, "range_min_milli": low,
            "range_max_milli": high, "heartbeat_interval_s": heartbeat[d]})
    decommission_at = cfg.start + span * 2 / 3
    for d in devices:
        unit, low, high, typical, noise = SENSOR_KINDS[kind_of[d]]
        stop = end
        if d in taken["silent"]:
            stop = cfg.start + span / 2
        elif d in taken["decommissioned"]:
            stop = decommission_at
        times = []
        t = cfg.start + timedelta(seconds=1 + rng.uniform(0, heartbeat[d]))
        while t < stop:
            times.append(t)
            t += timedelta(seconds=heartbeat[d])
        run: set[int] = set()
        if d in taken["long_run"] or d in taken["short_run"]:
            length = rng.randint(3, 5) if d in taken["long_run"] else 2
            first = rng.randint(1, len(times) - length - 1)  # in-range readings before and after it
            run = set(range(first, first + length))
        above = rng.random() < 0.5
        for k, measured in enumerate(times):
            if k in run:
                excess = rng.randint(noise, 3 * noise) + 1
                value = high + excess if above else low - excess
            else:
                value = min(max(int(rng.gauss(typical, noise)), low), high)
            arrival = measured
            if k not in run and rng.random() < cfg.late_rate:  # a gateway that was offline: sent minutes later
                arrival = measured + timedelta(seconds=rng.randint(60, 600))
                if arrival >= stop and d in taken["decommissioned"]:
                    arrival = measured  # late after its decommissioning would be rejected: not a case of its own
            add(arrival, d, "RecordReading", {"reading_id": f"rdg-{d[4:]}-{k:06d}", "value_milli": value,
                                              "unit": unit, "measured_at": format_time(measured)})
        if d in taken["decommissioned"]:
            add(decommission_at, d, "DecommissionDevice", {"reason": "replaced"})
            after = decommission_at + timedelta(seconds=heartbeat[d])
            add(after, d, "RecordReading", {"reading_id": f"rdg-{d[4:]}-after-decommission", "value_milli": typical,
                                            "unit": unit, "measured_at": format_time(after)})

    def some_time() -> datetime:
        return cfg.start + timedelta(seconds=rng.uniform(60, span.total_seconds() / 2))

    for i in range(cfg.unknown_device_readings):
        t = some_time()
        add(t, f"dev-{cfg.run_id}-unknown-{i:02d}", "RecordReading", {
            "reading_id": f"rdg-{cfg.run_id}-unknown-{i:02d}", "value_milli": 21_000, "unit": "C",
            "measured_at": format_time(t)})
    for i in range(cfg.wrong_unit_readings):
        d, t = rng.choice(ordinary), some_time()
        unit, _, _, typical, _ = SENSOR_KINDS[kind_of[d]]
        add(t, d, "RecordReading", {"reading_id": f"rdg-{d[4:]}-wrong-unit-{i:02d}", "value_milli": typical,
                                    "unit": _WRONG_UNITS[unit], "measured_at": format_time(t)})
    for i in range(cfg.duplicate_registrations):
        d = rng.choice(ordinary)
        unit, low, high, _, _ = SENSOR_KINDS[kind_of[d]]
        add(some_time(), d, "RegisterDevice", {
            "site_id": sites[0], "sensor_kind": kind_of[d], "unit": unit, "range_min_milli": low,
            "range_max_milli": high, "heartbeat_interval_s": heartbeat[d]})

    yield from _commands(stream, "device", iot_schemas.COMMANDS, random.Random(f"iot/{cfg.run_id}/{cfg.seed}"))


@dataclass(frozen=True)
class SiteGeneratorConfig:
    """Web traffic: ``sites`` registered at ``start``, ``views`` page views over ``pages`` pages by ``visitors``
    visitors spread over ``minutes`` of event time (a few pages and visitors draw most views), and these
    deliberate cases:

    - ``late_rate``: the share of views that arrive 1 to 10 minutes after they happened (a tracker's retry);
    - one site retired at two thirds of the span (``retire``), with one more view sent after (rejected
      ``SiteNotActive``); the views before stay counted;
    - ``unknown_site_views`` for a site never registered (rejected ``SiteNotFound``).
    """
    sites: int = 3
    pages: int = 8
    visitors: int = 60
    views: int = 600
    minutes: int = 10
    seed: int = 42
    run_id: str = "demo"           # prefixes site ids, so several runs can share one log
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    late_rate: float = 0.02
    retire: bool = True
    unknown_site_views: int = 2


def generate_site_commands(cfg: SiteGeneratorConfig) -> Iterator[tuple[str, bytes]]:
    """(Kafka key, command JSON) pairs in arrival order: every site is registered before its views arrive. Every
    command is valid against the site domain's schemas; the rejections are the deliberate cases of ``cfg``."""
    if cfg.sites < 1 or cfg.pages < 1 or cfg.visitors < 1 or cfg.minutes < 1:
        raise ValueError(f"SiteGeneratorConfig: sites, pages, visitors and minutes must be at least 1 ({cfg})")
    rng = random.Random(cfg.seed)
    span = timedelta(minutes=cfg.minutes)
    sites = [f"web-{cfg.run_id}-{i:02d}" for i in range(cfg.sites)]
    pages = ["/"] + [f"/{name}" for name in ("pricing", "docs/start", "docs/sql", "blog", "blog/launch", "about",
                                              "careers", "contact", "status")][:max(cfg.pages - 1, 0)]
    pages += [f"/page/{i}" for i in range(len(pages), cfg.pages)]
    page_weights = [1 / (rank + 1) for rank in range(len(pages))]  # a few pages draw most views
    visitors = [f"vis-{cfg.run_id}-{i:05d}" for i in range(cfg.visitors)]
    retired = sites[-1] if cfg.retire else None
    retire_at = cfg.start + span * 2 / 3
    stream: list[tuple[datetime, int, str, str, dict]] = []

    def add(arrival: datetime, site: str, kind: str, payload: dict) -> None:
        stream.append((arrival, len(stream), site, kind, payload))

    for i, site in enumerate(sites):
        add(cfg.start + timedelta(milliseconds=10 * i), site, "RegisterSite",
            {"site_name": f"Site {i} of run {cfg.run_id}", "host": f"site{i}.{cfg.run_id}.example.com"})
    for n in range(cfg.views):
        site = rng.choice(sites)
        viewed = cfg.start + timedelta(seconds=1 + rng.uniform(0, span.total_seconds() - 2))
        if site == retired and viewed >= retire_at:
            site = sites[0]  # the retired site's only view after its retirement is the deliberate case below
        arrival = viewed
        if rng.random() < cfg.late_rate and site != retired:
            arrival = viewed + timedelta(seconds=rng.randint(60, 600))
        add(arrival, site, "RecordPageView", {
            "view_id": f"view-{cfg.run_id}-{n:07d}", "page": rng.choices(pages, weights=page_weights)[0],
            "visitor_id": rng.choice(visitors), "viewed_at": format_time(viewed)})
    if retired is not None:
        add(retire_at, retired, "RetireSite", {"reason": "moved to another host"})
        after = retire_at + timedelta(seconds=5)
        add(after, retired, "RecordPageView", {"view_id": f"view-{cfg.run_id}-after-retirement", "page": "/",
                                               "visitor_id": visitors[0], "viewed_at": format_time(after)})
    for i in range(cfg.unknown_site_views):
        t = cfg.start + timedelta(seconds=rng.uniform(60, span.total_seconds() / 2))
        add(t, f"web-{cfg.run_id}-unknown-{i:02d}", "RecordPageView", {
            "view_id": f"view-{cfg.run_id}-unknown-{i:02d}", "page": "/", "visitor_id": visitors[0],
            "viewed_at": format_time(t)})

    yield from _commands(stream, "site", site_schemas.COMMANDS, random.Random(f"site/{cfg.run_id}/{cfg.seed}"))


def _commands(stream, aggregate_type: str, schemas, ids: random.Random) -> Iterator[tuple[str, bytes]]:
    """(key, command JSON) of a generator's (arrival, tiebreak, aggregate id, command type, payload) items in
    arrival order, as ``CommandEnvelope.to_json`` writes them; ``ids`` draws the command ids (a generator's own,
    salted by its domain, so two generators with one seed make different ids)."""
    for arrival, _, aggregate_id, kind, payload in sorted(stream, key=lambda item: (item[0], item[1])):
        command_id = str(uuid.UUID(int=ids.getrandbits(128), version=4))
        validate_payload(schemas[kind], payload, f"generated command {command_id} ({kind})")
        yield aggregate_id, dumps({"command_id": command_id, "command_type": kind, "aggregate_id": aggregate_id,
                                   "payload": payload, "aggregate_type": aggregate_type, "expected_version": None,
                                   "issued_at": format_time(arrival), "correlation_id": None,
                                   "causation_id": None})


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


def interleaved(*streams: Iterable) -> list:
    """Several streams (of commands or events) as one, taking from each in turn: each keeps its own order, so
    every aggregate's records stay in order."""
    iterators = [iter(s) for s in streams]
    out: list = []
    while iterators:
        for it in list(iterators):
            record = next(it, _END)
            if record is _END:
                iterators.remove(it)
            else:
                out.append(record)
    return out


_END = object()


def decide_all(records: Iterable[tuple[str, bytes]], recorded_at: str | None = "2026-02-01T00:00:00.000Z"):
    """The events the command handler would append for ``records`` (any registered domain's commands, as (key,
    JSON) pairs), in log order, decided by the pure core without Kafka, and how many commands appended nothing
    (rejected or unreadable). -> (events, refused)."""
    from event_store.decider import execute, initial_state
    from event_store.errors import InvalidRecord

    states: dict[tuple[str, str], object] = {}
    events: list = []
    refused = 0
    for _, raw in records:
        try:
            command = CommandEnvelope.from_json(raw)
        except InvalidRecord:
            refused += 1
            continue
        key = (command.aggregate_type, command.aggregate_id)
        states[key], new, result = execute(states.get(key) or initial_state(command), command,
                                           recorded_at=recorded_at)
        refused += result.status != "accepted"
        events += new
    return events, refused
