"""spark_lineage=all: OpenLineage's Spark listener in a streaming app's session (the Spark projection, as `eventlake
project --engine spark` runs it), its application's run a child of our projection's run, its queries naming the
tables the batches wrote."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventlake.generator import GeneratorConfig
from lakehouse.lineage import events_file, read_events, spark_events_file, table
from read_models.catalog import Catalog
from tests.domain_helpers import events_for
from tests.projecting import publish_events

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
MODEL = "account_summary"


def test_with_spark_lineage_all_the_projections_spark_runs_are_children_of_its_run(settings):
    events = events_for(GeneratorConfig(accounts=3, commands=20, seed=5, run_id="lineage"))
    publish_events(settings, events)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, EVENTLAKE_HOME=str(settings.home),
               EVENTLAKE_TOPIC_PREFIX=settings.topic_prefix, EVENTLAKE_SPARK_SHUFFLE_PARTITIONS="2",
               EVENTLAKE_SPARK_LINEAGE="all")
    run = subprocess.run([EVENTLAKE, "project", MODEL, "--engine", "spark", "--until-caught-up"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

    job = f"projection.{MODEL}"
    [ours] = [e for e in read_events(events_file(settings)) if e["eventType"] == "START" and e["job"]["name"] == job]
    spark_runs = read_events(spark_events_file(settings, "eventlake-projection"))
    assert spark_runs, "the listener wrote no event"
    parents = {(e["run"]["facets"]["parent"]["job"]["name"], e["run"]["facets"]["parent"]["run"]["runId"])
               for e in spark_runs if "parent" in e["run"].get("facets", {})}
    assert (job, ours["run"]["runId"]) in parents, (ours["run"]["runId"], parents)
    written = {(o["namespace"], o["name"]) for e in spark_runs for o in e.get("outputs", [])}
    model_table = table(Catalog(settings).current(MODEL).table)
    assert (model_table.namespace, model_table.name) in written, written
