"""The IoT domain's data generator: devices across sites and sensor kinds reporting at a steady cadence, with
deliberate cases for the telemetry detector and the device aggregate's rejections (see
:class:`IotGeneratorConfig`); deterministic for a given seed and ``start``."""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

from event_store.envelope import format_time
from event_store.generated import command_records
from event_store.iot import schemas as iot_schemas

__all__ = ["IotGeneratorConfig", "generate_iot_commands", "SENSOR_KINDS", "records_for_cli"]

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

    yield from command_records(stream, "device", iot_schemas.COMMANDS, random.Random(f"iot/{cfg.run_id}/{cfg.seed}"))


def records_for_cli(settings, args) -> tuple[list, str]:
    """``eventlake generate --domain iot``: event times end at about now, so no reading is one the handler would
    date in the future."""
    start = datetime.now(timezone.utc) - timedelta(minutes=args.minutes + 10)
    records = list(generate_iot_commands(IotGeneratorConfig(devices=args.devices, minutes=args.minutes,
                                                            seed=args.seed, run_id=args.run_id, start=start)))
    return records, f"{args.devices} devices"
