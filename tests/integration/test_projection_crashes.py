"""kill -9 the projection at random moments, restart it, and the tables of every domain still equal the oracle."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import read_models
from event_store import kafka_log
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from spark_apps.projection import Projection
from tests.domain_helpers import events_for, events_of, interleaved, iot_events_for
from tests.oracle import assert_matches_oracle

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def committed_batches(settings) -> int:
    commits = settings.checkpoints / ("projection-" + "+".join(read_models.REGISTRY)) / "commits"
    return len([p for p in commits.glob("*") if p.name.isdigit()]) if commits.is_dir() else 0


def test_kill_9_at_random_points_then_restart_gives_the_oracle_tables(spark, settings):
    # Every built-in domain's events in one log: accounts, devices (with anomalies flagged) and page views.
    events = interleaved(
        events_for(GeneratorConfig(accounts=40, commands=500, seed=9, run_id="kill", late_rate=0.03), flag_every=7),
        iot_events_for(IotGeneratorConfig(devices=10, minutes=10, seed=9, run_id="kill"), flag_every=11),
        events_of(generate_site_commands(SiteGeneratorConfig(sites=2, views=200, minutes=10, seed=9, run_id="kill"))))
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    records = [(e.aggregate_id, e.to_json()) for e in events]
    kafka_log.produce_all(producer, settings.events_topic, records + random.Random(2).sample(records, 100))
    producer.close()

    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
               EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_MAX_OFFSETS_PER_TRIGGER="250",
               EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2")
    rng = random.Random(4)
    progress = []
    # Two kills: the second run restarts from a killed run's checkpoint and is killed in turn (each run costs a
    # JVM, the tables' set-up and a first batch: about a minute here; a third run proved nothing more).
    for run in range(2):
        before = committed_batches(settings)
        output = settings.home.parent / f"project-{run}.log"
        with output.open("wb") as sink:
            proc = subprocess.Popen([EVENTLAKE, "project", "--engine", "spark", "--until-caught-up"], env=env,
                                    start_new_session=True, stdout=sink, stderr=subprocess.STDOUT)
        # Wait for a batch past the last one, then kill somewhere inside the following ones.
        deadline = time.monotonic() + 600  # a first batch of every domain's models on a busy host
        while committed_batches(settings) <= before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(rng.uniform(0.5, 6.0))
        assert proc.poll() is None, f"exit {proc.returncode} before the kill:\n{output.read_text()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)  # the Python driver and its JVM, without any chance to clean up
        proc.wait()
        progress.append(committed_batches(settings))
    assert progress[0] >= 1 and progress[-1] > progress[0], progress

    Projection(spark, settings, log=lambda *_: None).run_until_caught_up()
    assert_matches_oracle(spark, settings, events)
