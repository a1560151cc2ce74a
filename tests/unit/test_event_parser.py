"""Every reader's event parser (``EventEnvelope.from_json``: compiled msgspec decoders for the ordinary valid event,
the reference path for anything else) gives exactly what the reference path gives: the same events, the same
rejections word for word."""
import json
import random

import pytest

from event_store.envelope import EventEnvelope, _load_json, _plain_event
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from tests.domain_helpers import events_for, events_of, iot_events_for
from tests.unit.test_handler_core import outcome


def reference_event(raw):
    """EventEnvelope.from_json as it was: the standard library's JSON, then from_dict."""
    return EventEnvelope.from_dict(_load_json(raw, "event"))


def sample_events():
    return [*events_for(GeneratorConfig(accounts=10, commands=200, seed=4, run_id="ep"), flag_every=3),
            *iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=4, run_id="ep"), flag_every=4),
            *events_of(generate_site_commands(SiteGeneratorConfig(sites=1, views=40, minutes=10, seed=4,
                                                                  run_id="ep")))]


def test_every_generated_event_of_every_domain_takes_the_fast_path_and_reads_the_same():
    events = sample_events()
    assert len({e.event_type for e in events}) >= 8
    for e in events:
        raw = e.to_json()
        fast = _plain_event(EventEnvelope, raw)
        assert fast is not None, raw  # the ordinary event is not left to the slow path
        assert fast == reference_event(raw) == e


ODD_VALUES = [None, True, False, 0, -1, 1, 1.0, 1.5, 10**25, -10**30, "", " ", "\u2003", "x", "US-NYC\n", "USD",
              "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z\n", "2026-01-01T00:00:00", "2026-02-30T00:00:00Z",
              "0001-01-01T00:00:00Z", "1899-12-31T23:59:59Z", "9999-06-01T00:00:00+00:00", "2026-01-01T00:00:00+25:00",
              [], {}, ["x"], {"rule": 5}]


def test_randomly_damaged_events_get_the_same_verdict_on_both_paths():
    rng = random.Random(12)
    for e in sample_events():
        obj = json.loads(e.to_json())
        for _ in range(4):
            damaged = json.loads(e.to_json())
            target = damaged["payload"] if rng.random() < 0.6 else damaged
            name = rng.choice(sorted(target) + ["surplus", "rule", "payment_id"])
            target[name] = rng.choice(ODD_VALUES + [obj.get(name)])
            raw = json.dumps(damaged).encode()
            assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw), raw


@pytest.mark.parametrize("raw", [b"{nope", b"[1]", b"", b"null", b'{"a": NaN}', b'{"event_id": "\\ud800"}',
                                 b'\xef\xbb\xbf{"event_id": "e"}', b'{"a": 1e400}', "{\"event_id\": \"e\"}"])
def test_unreadable_records_get_the_reference_reason(raw):
    assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw)
    assert outcome(EventEnvelope.from_json, raw).startswith("InvalidRecord")


def test_a_repeated_key_counts_once_with_its_last_value_on_both_paths():
    e = sample_events()[0]
    raw = e.to_json().replace(b'"aggregate_version":1', b'"aggregate_version":1,"aggregate_version":0')
    assert raw != e.to_json()
    assert outcome(EventEnvelope.from_json, raw) == outcome(reference_event, raw)
    assert outcome(EventEnvelope.from_json, raw).startswith("InvalidRecord")


def test_an_older_schema_version_is_upcast_on_the_reference_path():
    from tests.unit.test_upcasting import v1_payment_authorized

    raw = json.dumps(v1_payment_authorized()).encode()
    assert _plain_event(EventEnvelope, raw) is None
    assert EventEnvelope.from_json(raw) == reference_event(raw)
    assert EventEnvelope.from_json(raw).schema_version == 2
