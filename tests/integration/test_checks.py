"""`eventlake check` and the check_read_models DAG: the suites pass on what the folds produce and name what
is wrong in a broken table. Tables are written with delta-rs (no Spark needed to make them)."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from deltalake import write_deltalake

import read_models
from eventlake.generator import GeneratorConfig, IotGeneratorConfig
from expectations.checks import TableMissing, check_table, check_tables
from lakehouse.settings import Settings
from tests import site_events
from tests.domain_helpers import events_for, iot_events_for
from tests.merchant_history import reference

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def write_folded(settings: Settings, events) -> None:
    """Each read model's table as the plain-Python fold of ``events`` (what the projection must produce)."""
    import pyarrow as pa

    from spark_apps.arrow_rows import arrow_schema

    dimension = reference(events)  # the merchants joined as of each payment's time (some unknown: nulls)
    for model in read_models.REGISTRY.values():
        rows = [{**dict(zip(model.key, key)), **row} for key, row in model.expected_rows(events, dimension).items()]
        if not rows:  # another domain's table: empty, typed as the projection creates it
            empty = pa.Table.from_pylist([], arrow_schema(model.schema()))
            write_deltalake(str(settings.table_path(model.name)), empty, mode="overwrite")
            continue
        frame = pd.DataFrame(rows, columns=model.columns)
        if "window_end" in frame:  # the windowed fold gives the sums per key; the projection adds the bounds
            frame["window_end"] = frame["window_start"] + pd.Timedelta(minutes=1)
            frame["updated_at"] = pd.Timestamp("2026-02-01", tz="UTC")
        write_deltalake(str(settings.table_path(model.name)), frame, mode="overwrite")


@pytest.fixture(scope="module")
def folded_events():
    """Every registered domain's events: accounts, devices and a site's page views."""
    site = [site_events.registered("site-chk")] + [
        site_events.viewed("site-chk", v, f"view-{v}", f"/page/{v % 3}", f"visitor-{v % 5}", f"12:0{v % 4}:{v:02d}")
        for v in range(2, 30)]
    return (events_for(GeneratorConfig(accounts=30, commands=900, seed=4, run_id="chk"), flag_every=7)
            + iot_events_for(IotGeneratorConfig(devices=12, minutes=10, seed=4, run_id="chk"), flag_every=9) + site)


def test_the_suites_pass_on_the_folded_tables(tmp_path, folded_events):
    settings = Settings(home=tmp_path)
    write_folded(settings, folded_events)
    # The suites alone: publishing Data Docs (a third of this test's time) is test_dags'
    # test_check_read_models_publishes_data_docs_naming_each_suite.
    reports = check_tables(settings, data_docs=False)
    assert [r.table for r in reports] == list(read_models.REGISTRY)
    for report in reports:
        assert report.rows > 0, report.table
        assert report.success, "\n".join(report.lines())


def test_a_broken_table_fails_naming_the_expectation_the_rows_and_a_value(tmp_path, folded_events):
    settings = Settings(home=tmp_path)
    write_folded(settings, folded_events)
    path = str(settings.table_path("account_summary"))
    from deltalake import DeltaTable
    rows = DeltaTable(path).to_pandas()
    broken = pd.concat([rows, rows.iloc[[0]]], ignore_index=True)  # one account twice
    broken.loc[broken.index[1], "status"] = "closed"
    broken.loc[broken.index[2], "available_minor"] += 1
    write_deltalake(path, broken, mode="overwrite")
    report = check_table(settings, "account_summary")
    assert not report.success
    failed = {f.expectation: f for f in report.failures}
    assert set(failed) == {"expect_column_values_to_be_unique", "expect_column_values_to_be_in_set",
                           "expect_column_pair_values_to_be_equal"}, report.lines()
    assert failed["expect_column_values_to_be_unique"].unexpected == 2
    assert failed["expect_column_values_to_be_in_set"].examples == ("closed",)
    assert report.delta_version == 1 and report.rows == len(rows) + 1
    assert report.lines()[0].startswith("account_summary: FAILED 3 of 12 expectations")


def test_a_missing_table_says_what_to_run(tmp_path):
    with pytest.raises(TableMissing, match="run the projection first"):
        check_table(Settings(home=tmp_path), "payments")


def _env(home: Path) -> dict:
    env = dict(os.environ)
    env["EVENTLAKE_HOME"] = str(home)
    return env


@pytest.fixture
def pushgateway(tmp_path):
    """A real Pushgateway where Debian's package is installed (the DAG's tasks push their outcome to it), else
    None: the DAG runs without one, as it does where none is configured."""
    from tests.integration.prometheus_server import PUSHGATEWAY, PushgatewayServer

    if PUSHGATEWAY is None:
        yield None
        return
    server = PushgatewayServer(tmp_path / "pushgateway")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.slow
def test_the_cli_and_the_dag_fail_on_a_broken_table_and_pass_on_a_good_one(tmp_path, folded_events, pushgateway):
    settings = Settings(home=tmp_path)
    write_folded(settings, folded_events)
    env = {**_env(tmp_path), **({"EVENTLAKE_PUSHGATEWAY_URL": pushgateway.url} if pushgateway else {})}
    good = subprocess.run([EVENTLAKE, "check"], env=env, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("check: all passed")

    dag = subprocess.run([EVENTLAKE, "airflow", "dags", "test", "check_read_models"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert dag.returncode == 0, dag.stdout[-4000:] + dag.stderr[-4000:]
    for name in read_models.REGISTRY:
        assert f"{name}: passed all" in dag.stdout + dag.stderr
    if pushgateway:  # each table's task pushed its verdict, under its own group
        success = pushgateway.series("eventlake_check_success")
        assert {dict(k)["table"]: v for k, v in success.items()} == {name: 1.0 for name in read_models.REGISTRY}

    path = str(settings.table_path("payments"))
    from deltalake import DeltaTable
    rows = DeltaTable(path).to_pandas()
    rows.loc[rows.index[0], "amount_minor"] = -5
    write_deltalake(path, rows, mode="overwrite")
    bad = subprocess.run([EVENTLAKE, "check", "payments"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1
    assert "payments: FAILED 1 of" in bad.stdout and "expect_column_values_to_be_between(column='amount_minor'" \
        in bad.stdout and "e.g. -5" in bad.stdout, bad.stdout

    dag = subprocess.run([EVENTLAKE, "airflow", "dags", "test", "check_read_models"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert dag.returncode != 0
    assert "payments: FAILED 1 of" in dag.stdout + dag.stderr
    if pushgateway:  # the failed table's verdict replaced its own group only; what failed is counted
        success = {dict(k)["table"]: v for k, v in pushgateway.series("eventlake_check_success").items()}
        assert success == {name: float(name != "payments") for name in read_models.REGISTRY}
        failed = pushgateway.series("eventlake_check_expectations")
        assert {dict(k)["table"]: v for k, v in failed.items() if dict(k)["result"] == "failed"}["payments"] == 1
