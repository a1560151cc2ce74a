"""payments_match_account_summary on tables the projection wrote: the models agree; a row tampered with in one
of them (a delta-rs write, no projection batch) makes `eventlake check` fail naming the account."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from eventlake.generator import GeneratorConfig
from expectations import check_agreement
from read_models.account.account_summary import MODEL as ACCOUNT_SUMMARY
from read_models.account.payments import MODEL as PAYMENTS
from tests.domain_helpers import events_for
from tests.integration.test_projection import publish
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
ROOT = str(Path(__file__).resolve().parents[2])
CHECK = "payments_match_account_summary"


def check(settings) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVENTLAKE_HOME": str(settings.home), "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix,
           "PYTHONPATH": ROOT}  # this checkout's code, not the one the venv's console script was installed from
    env.pop("EVENTLAKE_CONFIG", None)
    return subprocess.run([EVENTLAKE, "check", "account_summary", "payments"], env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_check_passes_when_the_models_agree_and_fails_naming_the_account_when_they_do_not(spark, settings):
    events = events_for(GeneratorConfig(accounts=6, commands=120, seed=11, run_id="xmc"))
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])
    project_in_python(spark, settings, [ACCOUNT_SUMMARY, PAYMENTS])  # the check is the subject (tests/projecting.py)

    agreement = check_agreement(settings, CHECK)
    assert agreement.success and agreement.keys == 6, agreement.lines()
    assert agreement.position.startswith("each at batch "), agreement.position
    good = check(settings)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"{CHECK}: agree on all 6 accounts" in good.stdout and good.stdout.strip().endswith("check: all passed")

    # One authorized payment's amount changed by hand: still a valid payments row, but no longer what
    # account_summary folded.
    path = str(settings.table_path("payments"))
    rows = DeltaTable(path).to_pandas()
    tampered = rows.index[rows["status"] == "authorized"][0]
    account = rows.loc[tampered, "account_id"]
    rows.loc[tampered, "amount_minor"] += 1
    write_deltalake(path, rows, mode="overwrite")

    agreement = check_agreement(settings, CHECK)
    assert agreement.failed and agreement.disagreements == 1, agreement.lines()
    assert agreement.examples[0].startswith(f"{account}: account_summary has ")
    bad = check(settings)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"{CHECK}: DISAGREE on 1 of 6 accounts" in bad.stdout and f"  {account}: " in bad.stdout, bad.stdout
    assert "1 cross-model check(s) disagree" in bad.stdout and "Traceback" not in bad.stdout + bad.stderr
