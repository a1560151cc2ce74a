"""Workloads of the benchmarks by domain: about N generated commands of the accounts, the IoT devices, the sites or
all three interleaved, and the events the pure command handler core makes of them (no Kafka).

The IoT and site generators are sized by fleet and event-time span rather than by a command count: here the span
is chosen so that slightly more than N commands come out, and the stream (in arrival order, so every aggregate is
registered before its later commands) is cut at N. Their event times end a minute before ``now``, so the handler's
clock-skew check (``max_event_time_ahead_s``) never rejects them.
"""
from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Iterable

from eventlake.generator import (GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, decide_all,
                                 generate_commands, generate_iot_commands, generate_site_commands, interleaved)

__all__ = ["DOMAINS", "READ_MODELS", "Workload", "workload", "interleaved", "decided", "read_models_of",
           "scratch_topics", "drop_scratch_topics"]

DOMAINS = ("accounts", "iot", "site", "mixed")
# The read models the benchmarks fold each domain's events into (names in ``read_models.REGISTRY``): the
# accounts' two the benchmarks have always measured, every model of the device and of the site domain, and
# for ``mixed`` all of these.
READ_MODELS = {"accounts": ("account_summary", "payments"),
               "iot": ("device_status", "device_minute_readings", "telemetry_anomalies"),
               "site": ("page_minute_clicks",)}
READ_MODELS["mixed"] = READ_MODELS["accounts"] + READ_MODELS["iot"] + READ_MODELS["site"]
# Readings per device per minute of the IoT generator: its heartbeats (10, 15, 30, 60 s) drawn evenly.
_READINGS_PER_DEVICE_MINUTE = sum(60 / s for s in (10, 15, 30, 60)) / 4


class Workload:
    """One domain's generated commands (Kafka key, command JSON) and a line saying what they are."""

    def __init__(self, domain: str, records: list[tuple[str, bytes]], description: str):
        self.domain, self.records, self.description = domain, records, description

    @property
    def mean_bytes(self) -> float:
        return sum(len(v) for _, v in self.records) / max(len(self.records), 1)


def workload(domain: str, commands: int, *, accounts: int = 2000, devices: int = 200, sites: int = 30,
             run_id: str = "bench", seed: int = 42, late_rate: float | None = None,
             now: datetime | None = None) -> Workload:
    """About ``commands`` commands of ``domain`` (one of ``DOMAINS``); ``mixed`` is a third of each of the other
    three, interleaved. ``late_rate`` None keeps each generator's default."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}")
    now = now or datetime.now(timezone.utc)
    late = {} if late_rate is None else {"late_rate": late_rate}
    if domain == "accounts":
        cfg = GeneratorConfig(accounts=accounts, commands=commands, run_id=run_id, seed=seed, **late)
        return Workload(domain, list(generate_commands(cfg)), f"{accounts} accounts")
    if domain == "iot":
        per_device = max(commands - devices, 1) / devices
        minutes = max(10, math.ceil(1.1 * per_device / _READINGS_PER_DEVICE_MINUTE))
        cfg = IotGeneratorConfig(devices=devices, sites=max(1, devices // 50), minutes=minutes, seed=seed,
                                 run_id=run_id, start=now - timedelta(minutes=minutes + 1), **late)
        records = list(generate_iot_commands(cfg))[:commands]
        return Workload(domain, records, f"{devices} devices at {cfg.sites} site(s) over {minutes} minutes of event "
                                         f"time")
    if domain == "site":
        minutes = 60
        cfg = SiteGeneratorConfig(sites=sites, views=max(commands - sites - 4, 1), minutes=minutes, seed=seed,
                                  run_id=run_id, start=now - timedelta(minutes=minutes + 1), **late)
        records = list(generate_site_commands(cfg))[:commands]
        return Workload(domain, records, f"{sites} sites, {cfg.pages} pages, {cfg.visitors} visitors over "
                                         f"{minutes} minutes of event time")
    parts = [workload(d, max(commands // 3, 1), accounts=max(accounts // 3, 1), devices=max(devices // 3, 11),
                      sites=max(sites // 3, 1), run_id=run_id, seed=seed, late_rate=late_rate, now=now)
             for d in ("accounts", "iot", "site")]
    return Workload(domain, interleaved(*(p.records for p in parts)),
                    "interleaved: " + "; ".join(f"{len(p.records):,} of {p.description}" for p in parts))


def decided(records: Iterable[tuple[str, bytes]], recorded_at: str | None = None
            ) -> tuple[list[tuple[bytes, bytes]], int]:
    """The events the command handler would append for ``records`` (any registered domain's commands), as
    (Kafka key, event JSON) in log order, and how many commands were rejected or unreadable (no events)."""
    events, refused = decide_all(records, recorded_at)
    return [(e.aggregate_id.encode(), e.to_json()) for e in events], refused


def read_models_of(domain: str) -> list:
    """The read model specs (``read_models.REGISTRY``) the benchmarks fold ``domain``'s events into."""
    import read_models

    if domain not in READ_MODELS:
        raise ValueError(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}")
    return [read_models.get(name) for name in READ_MODELS[domain]]


def drop_scratch_topics(settings) -> None:
    """Delete a benchmark's topics (every name starting with ``settings.topic_prefix``): a benchmark of millions
    of events otherwise leaves gigabytes in the broker on each run. A failure (the broker gone) is reported,
    never raised over the run's own outcome."""
    from event_store.kafka_log import delete_topics
    try:
        delete_topics(settings, settings.topic_prefix)
    except Exception as e:  # noqa: BLE001 - reported; the run's own result or error matters more
        print(f"bench: could not delete the topics {settings.topic_prefix}*: {e!r}", file=sys.stderr)


@contextmanager
def scratch_topics(settings, keep: bool = False):
    """A benchmark's run on topics of its own, deleted when it ends unless ``keep`` (``drop_scratch_topics``)."""
    try:
        yield settings
    finally:
        if not keep:
            drop_scratch_topics(settings)
