import json

from event_store.envelope import CommandEnvelope, InvalidRecord
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
