"""Exactly-once effect under crashes: `eventlake handler` is killed with SIGKILL at random moments while
10,000 account and ~1,000 device commands stream in, restarted each time, and the log must hold each accepted
command's events exactly once, with every aggregate's versions running 1..n."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from event_store import kafka_log
from event_store.client import EventStore
from event_store.envelope import CommandResult, EventEnvelope
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, generate_commands, generate_iot_commands
from tests.domain_helpers import events_of, interleaved

pytestmark = pytest.mark.slow
EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def test_kill_9_at_random_moments_leaves_each_accepted_commands_events_exactly_once(settings, tmp_path):
    cfg = GeneratorConfig(accounts=200, commands=10_000, seed=2024, run_id="crash", invalid_rate=0.01)
    # Devices' commands among the accounts' (with the IoT generator's deliberate rejections): one handler, one log.
    commands = interleaved(generate_commands(cfg),
                           generate_iot_commands(IotGeneratorConfig(devices=20, minutes=15, seed=2024, run_id="crash")))
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
           # Small transactions and frequent snapshots, so kills land before, inside and after both.
           "EVENTLAKE_SNAPSHOT_EVERY_EVENTS": "700", "EVENTLAKE_HANDLER_MAX_BATCH": "300"}
    log = open(tmp_path / "handler.log", "a")

    def start():
        return subprocess.Popen([EVENTLAKE, "handler"], env=env, stdout=log, stderr=subprocess.STDOUT)

    with EventStore(settings) as store:
        def stream():  # ~10 s of commands, in small chunks
            for i in range(0, len(commands), 250):
                store.send_raw(commands[i:i + 250])
                time.sleep(0.25)

        sender = threading.Thread(target=stream)
        sender.start()
        rng = random.Random(7)
        kills = 0
        handler = start()
        try:
            while sender.is_alive() or kills < 5:
                time.sleep(rng.uniform(1.5, 4.0))  # the handler takes ~1.5 s to start
                handler.send_signal(signal.SIGKILL)
                handler.wait()
                kills += 1
                handler = start()
        finally:
            sender.join()
            handler.send_signal(signal.SIGKILL)
            handler.wait()
    try:
        done = subprocess.run([EVENTLAKE, "handler", "--until-caught-up"], env=env, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the restarted handler did not catch up: {(e.stdout or b'')[-3000:]!r}")
    log.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert kills >= 5

    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    # Exactly the events the pure core decides for these commands: none lost, none twice.
    key = lambda e: (e.aggregate_id, e.aggregate_version, e.event_type, e.event_id, e.command_id)  # noqa: E731
    assert sorted(map(key, events)) == sorted(map(key, events_of(commands)))
    assert {e.aggregate_type for e in events} == {"account", "device"}
    by_account = defaultdict(list)
    for e in events:  # log order within the account's partition
        by_account[e.aggregate_id].append(e.aggregate_version)
    for account, versions in by_account.items():
        assert versions == list(range(1, len(versions) + 1)), account
    # One committed result per command: nothing answered twice, nothing unanswered.
    results = [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]
    counts = Counter(r.command_id for r in results)
    sent_ids = {json.loads(v)["command_id"] for _, v in commands}
    assert set(counts) == sent_ids and set(counts.values()) == {1}
