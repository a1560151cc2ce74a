"""Data generators: command streams for the demo, the tests and the benchmarks, deterministic for a given seed
(and ``start``). Each domain's generator lives in its domain's folder (``event_store/<domain>/generator.py``);
this module gathers them, with what mixes the domains' streams (``interleaved``, ``decide_all``).

- Accounts (``generate_commands``): customers, merchants, payments, device locations; bursts of payments,
  payments over the credit limit, location mismatches, freezes, and (on request) malformed records.
- IoT telemetry (``generate_iot_commands``): devices across sites and sensor kinds reporting at a steady cadence,
  with deliberate cases for the telemetry detector and the device aggregate's rejections (see
  :class:`IotGeneratorConfig`).
- Web traffic (``generate_site_commands``): sites and their page views, some of them late, with a retired site
  and an unknown one for the site aggregate's rejections (see :class:`SiteGeneratorConfig`).

Event time of a run (``dated``): see ``event_store.account.generator``.
"""
from __future__ import annotations

from typing import Iterable

from event_store.account.generator import (MALFORMED_SAMPLES, REGIONS, GeneratorConfig, dated, generate_commands,
                                           newest_event_time, run_start)
from event_store.envelope import CommandEnvelope
from event_store.iot.generator import SENSOR_KINDS, IotGeneratorConfig, generate_iot_commands
from event_store.site.generator import SiteGeneratorConfig, generate_site_commands

__all__ = ["GeneratorConfig", "generate_commands", "MALFORMED_SAMPLES", "REGIONS", "dated", "run_start",
           "newest_event_time", "IotGeneratorConfig", "generate_iot_commands", "SENSOR_KINDS", "SiteGeneratorConfig",
           "generate_site_commands", "interleaved", "decide_all"]


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
