"""The IoT suites without Spark: each names only its table's columns (or its derived ones), passes on the table
the oracle folds from a scripted stream (as delta-rs would hand it to pandas: the model's Delta types via Arrow),
and fails, on the expectation meant to catch it, when a row is broken."""
import datetime as dt

import pandas as pd
import pytest

from expectations.checks import context
from expectations.iot import SUITES
from read_models.iot import MODELS
from read_models.sequence import sequence
from spark_apps.arrow_rows import arrow_schema
from tests.unit.test_iot_read_models import LOG

GE = context()


def test_every_iot_read_model_has_a_suite_and_they_are_registered():
    import expectations

    assert sorted(SUITES) == sorted(MODELS)
    assert all(expectations.SUITES[name] is module for name, module in SUITES.items())


def _frame(name: str, rows: list[dict] | None = None) -> pd.DataFrame:
    """The oracle's table of ``name`` (or ``rows``) as the check reads it: Arrow in the Delta schema, to pandas."""
    import pyarrow as pa

    model = MODELS[name]
    if rows is None:
        folded = model.python_fold(sequence(LOG).admitted)
        rows = []
        for key, row in folded.items():
            full = dict(zip(model.key, key)) | row
            if name == "device_minute_readings":
                full |= {"window_end": full["window_start"] + dt.timedelta(minutes=1),
                         "updated_at": full["window_start"]}
            rows.append(full)
    schema = arrow_schema(model.schema())
    utc = {c.name for c in schema if pa.types.is_timestamp(c.type)}
    rows = [{c: (v.replace(tzinfo=dt.timezone.utc) if c in utc and v is not None else v) for c, v in r.items()}
            for r in rows]
    return pa.Table.from_pylist(rows, schema=schema).to_pandas()


def _failed(name: str, frame: pd.DataFrame) -> list[str]:
    """The failed expectations of suite ``name`` on ``frame``: (type, column) as the check reports them."""
    module = SUITES[name]
    frame = frame.copy()
    if hasattr(module, "derived_columns"):
        module.derived_columns(frame)
    gx, ge_context = GE
    source = ge_context.data_sources.add_or_update_pandas(f"test-{name}")
    asset = source.add_dataframe_asset(name=f"{name}-{id(frame)}")
    batch = asset.add_batch_definition_whole_dataframe("t").get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(gx.ExpectationSuite(name=name, expectations=module.expectations(gx)))
    out = []
    for r in result.results:
        if not r.success:
            kwargs = r.expectation_config.kwargs
            out.append(f"{r.expectation_config.type}:{kwargs.get('column') or kwargs.get('column_list')}")
    return out


@pytest.mark.parametrize("name", sorted(SUITES))
def test_a_suite_names_only_columns_of_its_table_or_its_derived_columns(name):
    module = SUITES[name]
    frame = _frame(name)
    columns = set(frame.columns)
    if hasattr(module, "derived_columns"):
        module.derived_columns(frame)
    derived = set(frame.columns) - columns
    assert columns == set(MODELS[name].columns)
    for expectation in module.expectations(GE[0]):
        kwargs = expectation.configuration.kwargs
        named = {kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs} | set(
            kwargs.get("column_list") or ())
        assert not named - columns - derived, f"{name}: {type(expectation).__name__} names {named}"


@pytest.mark.parametrize("name", sorted(SUITES))
def test_the_oracles_table_passes_its_suite(name):
    assert len(_frame(name)) >= 2
    assert _failed(name, _frame(name)) == []


def _broken(name: str, **changes) -> pd.DataFrame:
    frame = _frame(name)
    for column, value in changes.items():
        frame.loc[0, column] = value
    return frame


def test_device_status_suite_catches_broken_rows():
    assert _failed("device_status", _broken("device_status", status="retired")) == \
        ["expect_column_values_to_be_in_set:status"]
    assert _failed("device_status", _broken("device_status", range_min_milli=50_000)) == \
        ["expect_column_values_to_be_between:range_width_milli"]
    assert _failed("device_status", _broken("device_status", readings_count=99)) == \
        ["expect_column_values_to_be_between:versions_beyond_counts"]
    frame = _frame("device_status")
    frame.loc[0, "last_seen_at"] = frame.loc[0, "last_reading_at"] - pd.Timedelta(seconds=1)
    assert _failed("device_status", frame) == ["expect_column_values_to_be_between:seen_after_last_reading_s"]
    frame = _frame("device_status")
    assert frame["readings_count"].iloc[0] > 0
    frame.loc[0, "last_reading_id"] = None
    assert _failed("device_status", frame) == ["expect_column_values_to_be_in_set:last_reading_iff_readings"]
    frame = _frame("device_status")
    assert _failed("device_status", pd.concat([frame, frame.iloc[:1]], ignore_index=True)) == \
        ["expect_column_values_to_be_unique:device_id"]


def test_device_minute_readings_suite_catches_broken_rows():
    frame = _frame("device_minute_readings")
    assert frame.loc[0, "readings"] > 1
    assert _failed("device_minute_readings", _broken("device_minute_readings", min_value_milli=10 ** 9)) == \
        ["expect_column_values_to_be_between:spread_milli", "expect_column_values_to_be_between:sum_above_floor"]
    assert _failed("device_minute_readings",
                   _broken("device_minute_readings", sum_value_milli=int(frame.loc[0, "max_value_milli"]) *
                           int(frame.loc[0, "readings"]) + 1)) == \
        ["expect_column_values_to_be_between:sum_below_ceiling"]
    frame.loc[0, "window_start"] += pd.Timedelta(seconds=5)
    assert _failed("device_minute_readings", frame) == \
        ["expect_column_values_to_be_in_set:window_seconds", "expect_column_values_to_be_in_set:window_start_second"]


def test_sum_bounds_are_exact_past_64_bits():
    # Ten million readings at the largest value: count x value passes 2^63, the sum column itself does not exist
    # at that size (the schema's bound), but the check must not wrap around on the way.
    frame = _frame("device_minute_readings")
    frame.loc[0, ["readings", "min_value_milli", "max_value_milli"]] = [10_000_000, 10 ** 12, 10 ** 12]
    frame.loc[0, "sum_value_milli"] = 2 ** 62
    SUITES["device_minute_readings"].derived_columns(frame)
    assert frame.loc[0, "sum_above_floor"] == 2 ** 62 - 10 ** 19 < 0


def test_telemetry_anomalies_suite_catches_a_repeated_finding():
    frame = _frame("telemetry_anomalies")
    assert _failed("telemetry_anomalies", pd.concat([frame, frame.iloc[:1]], ignore_index=True)) == \
        ["expect_compound_columns_to_be_unique:['device_id', 'rule', 'occurred_at']"]


def test_a_checks_lineage_run_carries_what_it_found_as_data_quality_facets(tmp_path):
    # The check's OpenLineage run (expectations.checks.verdict) completes with the table's rows and every
    # expectation of its suite, the one that failed with its column and what it found (docs/lineage.md).
    import pyarrow as pa
    from deltalake import write_deltalake

    from expectations.checks import verdict
    from lakehouse.lineage import events_file, read_events
    from lakehouse.settings import Settings
    from read_models.catalog import Catalog

    settings = Settings.load({}).replace(home=tmp_path / "home")
    frame = _broken("device_status", status="retired")
    where = Catalog(settings).current("device_status").table
    write_deltalake(str(where), pa.Table.from_pandas(frame, schema=arrow_schema(MODELS["device_status"].schema()),
                                                     preserve_index=False))
    found = verdict(settings, "device_status", ge=GE, data_docs=False)
    assert found.report.failures and found.report.rows == len(frame)

    events = [e for e in read_events(events_file(settings)) if e["job"]["name"] == "check.device_status"]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    [checked] = events[1]["inputs"]
    assert checked["inputFacets"]["dataQualityMetrics"]["rowCount"] == len(frame)
    assertions = checked["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert len(assertions) == found.report.evaluated == len(SUITES["device_status"].expectations(GE[0]))
    assert [(a["assertion"], a["column"]) for a in assertions if not a["success"]] == \
        [("expect_column_values_to_be_in_set", "status")]
    assert "1 row" in next(a["actual"] for a in assertions if not a["success"])
    assert "inputFacets" not in events[0]["inputs"][0] or not events[0]["inputs"][0]["inputFacets"]
