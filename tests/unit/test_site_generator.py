"""The web traffic generator: deterministic per seed, valid commands, and each deliberate case where its config
says, checked by running the stream through the site aggregate (the generic decider)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from event_store.decider import execute, initial_state
from event_store.envelope import CommandEnvelope, parse_time
from eventlake.generator import SiteGeneratorConfig, generate_site_commands

CFG = SiteGeneratorConfig(sites=3, pages=6, visitors=20, views=300, minutes=10, seed=7, run_id="t")


def _run(cfg):
    states, outcomes, events = {}, [], []
    for _, raw in generate_site_commands(cfg):
        command = CommandEnvelope.from_json(raw)
        key = (command.aggregate_type, command.aggregate_id)
        states[key], new, result = execute(states.get(key) or initial_state(command), command,
                                           recorded_at="2026-02-01T00:00:00.000Z")
        outcomes.append((command, result))
        events += new
    return states, outcomes, events


def test_the_stream_is_deterministic_per_seed_and_differs_between_seeds():
    assert list(generate_site_commands(CFG)) == list(generate_site_commands(CFG))
    assert list(generate_site_commands(CFG)) != list(generate_site_commands(replace(CFG, seed=8)))


def test_every_view_is_counted_but_the_deliberate_rejections_with_their_reasons():
    states, outcomes, events = _run(CFG)
    rejected = Counter(r.error_type for _, r in outcomes if r.status == "rejected")
    assert rejected == {"SiteNotFound": CFG.unknown_site_views, "SiteNotActive": 1}
    views = [e for e in events if e.event_type == "PageViewed"]
    assert len(views) == CFG.views
    assert len({e.payload["page"] for e in views}) == CFG.pages
    assert {e.aggregate_id for e in events if e.event_type == "SiteRetired"} == {"web-t-02"}
    # Views arrive in issued_at order; a late one was viewed before a view that arrived earlier.
    times = [parse_time(e.occurred_at, "occurred_at") for e in views]
    assert any(later < earlier for earlier, later in zip(times, times[1:]))
    assert all(s.version >= 1 for (kind, _), s in states.items() if kind == "site" and "unknown" not in _)


def test_bad_configs_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="sites, pages, visitors and minutes must be at least 1"):
        list(generate_site_commands(replace(CFG, pages=0)))
