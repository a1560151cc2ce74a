import json

from event_store.envelope import CommandEnvelope
from event_store.errors import InvalidRecord
from eventlake.generator import GeneratorConfig, generate_commands


def test_generator_is_deterministic_and_opens_accounts_first():
    cfg = GeneratorConfig(accounts=20, commands=300, seed=1, run_id="g")
    a, b = list(generate_commands(cfg)), list(generate_commands(cfg))
    assert [k for k, _ in a] == [k for k, _ in b]
    assert [json.loads(v)["payload"] for _, v in a] == [json.loads(v)["payload"] for _, v in b]
    assert len(a) >= 300
    assert all(json.loads(v)["command_type"] == "OpenAccount" for _, v in a[:20])


def test_generator_injects_bad_records_when_asked():
    cfg = GeneratorConfig(accounts=10, commands=2000, seed=2, invalid_rate=0.05, malformed_rate=0.05)
    bad = 0
    for _, raw in generate_commands(cfg):
        try:
            CommandEnvelope.from_json(raw)
        except InvalidRecord:
            bad += 1
    assert 100 < bad < 400


def _event_times(records):
    from event_store.envelope import parse_time

    out = []
    for _, raw in records:
        payload = json.loads(raw)["payload"]
        if "occurred_at" in payload:
            out.append(parse_time(payload["occurred_at"], "occurred_at"))
    return out


def test_a_dated_run_ends_now_and_starts_after_the_newest_event_of_the_log():
    from datetime import datetime, timedelta, timezone

    from eventlake.generator import dated, run_start

    now = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    base = GeneratorConfig(accounts=20, commands=600, seed=3, run_id="d", late_rate=0.0)
    # An empty log: the run spans its nominal length (one mean interval per command) up to now.
    first = dated(base, now=now)
    assert (first.start, first.end) == (now - timedelta(seconds=580), now)
    times = _event_times(generate_commands(first))
    assert first.start <= min(times) and max(times) <= now
    # The log's newest event 2 minutes ago: the next run is squeezed in after it, never ahead of the clock.
    newest = now - timedelta(minutes=2)
    second = GeneratorConfig(**{**base.__dict__, "start": run_start(base, now, newest), "end": now})
    times = _event_times(generate_commands(second))
    assert newest <= min(times) and max(times) <= now
    # An outlier in the log (dated 9998) does not date the run.
    assert run_start(base, now, datetime(9998, 12, 31, tzinfo=timezone.utc)) == first.start
