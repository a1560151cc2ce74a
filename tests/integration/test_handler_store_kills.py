"""kill -9 of `eventlake handler` inside its state-store writes (issue 42): the handler SIGKILLs itself in the
middle of its N-th store write (after the puts, before the commit: ``EVENTLAKE_FAULT_KILL_AT_STORE_WRITE``), N
random at each start, so kills land in the writes after a commit, in the replay's flushes and around snapshots;
restarted each time, every command's answer and the events must be what the pure core decides (each command once,
resends and reused payment ids answered as duplicates)."""
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from event_store import kafka_log
from event_store.client import EventStore
from event_store.decider import execute, initial_state
from event_store.envelope import CommandEnvelope, CommandResult, EventEnvelope
from eventlake.generator import GeneratorConfig, generate_commands

pytestmark = pytest.mark.slow
EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def _commands() -> list[tuple[str, bytes]]:
    """~25 commands per account (under the 100-command window), then resends of a fifth of them (same command
    ids) and payments reusing an earlier payment id under a new command id."""
    first = list(generate_commands(GeneratorConfig(accounts=40, commands=1_000, seed=42, run_id="store-kill")))
    rng = random.Random(42)
    resent = rng.sample(first, 200)
    reused = []
    for key, raw in rng.sample([c for c in first if b'"AuthorizePayment"' in c[1]], 60):
        command = json.loads(raw)
        command["command_id"] = command["command_id"] + "-again"
        reused.append((key, json.dumps(command).encode()))
    return first + resent + reused


def _expected(records) -> tuple[dict, list]:
    """Per command id, the answer the pure core gives (the first one for a resend), and the events, in order."""
    states, answers, events = {}, {}, []
    for _, raw in records:
        command = CommandEnvelope.from_json(raw)
        if command.command_id in answers:
            continue
        key = (command.aggregate_type, command.aggregate_id)
        states[key], new, result = execute(states.get(key) or initial_state(command), command)
        answers[command.command_id] = (result.status, result.version, result.event_ids, result.error_type)
        events += new
    return answers, events


def test_kill_9_inside_state_store_writes_changes_no_answer_and_no_event(settings, tmp_path):
    commands = _commands()
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
           # Small batches (many store writes) and frequent snapshots (incremental ones, and their marks).
           "EVENTLAKE_SNAPSHOT_EVERY_EVENTS": "150", "EVENTLAKE_HANDLER_MAX_BATCH": "10"}
    log = open(tmp_path / "handler.log", "a")
    rng = random.Random(11)
    with EventStore(settings) as store:
        store.send_raw(commands)
    kills = []
    for _ in range(6):
        at = rng.randint(2, 15)
        handler = subprocess.Popen([EVENTLAKE, "handler"], env={**env, "EVENTLAKE_FAULT_KILL_AT_STORE_WRITE": str(at)},
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            kills.append((at, handler.wait(timeout=30), "by its hook"))
        except subprocess.TimeoutExpired:  # caught up before its N-th write: killed from here
            handler.send_signal(signal.SIGKILL)
            kills.append((at, handler.wait(), "from the test"))
    done = subprocess.run([EVENTLAKE, "handler", "--until-caught-up"], env=env, capture_output=True, text=True,
                          timeout=180)
    log.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert all(code == -signal.SIGKILL and how == "by its hook" for _, code, how in kills), kills

    answers, expected_events = _expected(commands)
    results = [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]
    firsts = {}
    for r in results:
        assert not (r.command_id in firsts and not r.duplicate), f"{r.command_id} answered twice"
        firsts.setdefault(r.command_id, r)
    answer = lambda r: (r.status, r.version, r.event_ids, r.error_type)  # noqa: E731
    assert {c: answer(r) for c, r in firsts.items()} == answers
    assert all(answer(r) == answer(firsts[r.command_id]) for r in results if r.duplicate)
    assert sum(1 for a in answers.values() if a[3] == "DuplicatePayment") >= 60
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    key = lambda e: (e.aggregate_id, e.aggregate_version, e.event_type, e.event_id, e.command_id)  # noqa: E731
    assert sorted(map(key, events)) == sorted(map(key, expected_events))
