"""The site suite without Spark: it names only its table's columns (or its derived ones), passes on the table the
oracle folds from the scripted stream (as delta-rs would hand it to pandas: the model's Delta types via Arrow),
and fails, on the expectation meant to catch it, when a row is broken."""
import datetime as dt

import pandas as pd
import pytest

from expectations.checks import context
from expectations.site import SUITES
from read_models.site import MODELS
from spark_apps.arrow_rows import arrow_schema
from tests.unit.test_site_read_models import ADMITTED

GE = context()
NAME = "page_minute_clicks"


def test_every_site_read_model_has_a_suite_and_it_is_registered():
    import expectations

    assert sorted(SUITES) == sorted(MODELS)
    assert all(expectations.SUITES[name] is module for name, module in SUITES.items())


def _frame() -> pd.DataFrame:
    """The oracle's table as the check reads it: Arrow in the Delta schema, to pandas."""
    import pyarrow as pa

    model = MODELS[NAME]
    rows = []
    for key, row in model.python_fold(ADMITTED).items():
        full = dict(zip(model.key, key)) | row
        full |= {"window_end": full["window_start"] + dt.timedelta(minutes=1), "updated_at": full["window_start"]}
        rows.append({c: (v.replace(tzinfo=dt.timezone.utc) if isinstance(v, dt.datetime) else v)
                     for c, v in full.items()})
    return pa.Table.from_pylist(rows, schema=arrow_schema(model.schema())).to_pandas()


def _failed(frame: pd.DataFrame) -> list[str]:
    """The failed expectations of the suite on ``frame``: (type, column) as the check reports them."""
    module = SUITES[NAME]
    frame = frame.copy()
    module.derived_columns(frame)
    gx, ge_context = GE
    source = ge_context.data_sources.add_or_update_pandas(f"test-{NAME}")
    asset = source.add_dataframe_asset(name=f"{NAME}-{id(frame)}")
    batch = asset.add_batch_definition_whole_dataframe("t").get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(gx.ExpectationSuite(name=NAME, expectations=module.expectations(gx)))
    out = []
    for r in result.results:
        if not r.success:
            kwargs = r.expectation_config.kwargs
            out.append(f"{r.expectation_config.type}:{kwargs.get('column') or kwargs.get('column_list')}")
    return out


def test_the_suite_names_only_columns_of_its_table_or_its_derived_columns():
    module = SUITES[NAME]
    frame = _frame()
    columns = set(frame.columns)
    module.derived_columns(frame)
    derived = set(frame.columns) - columns
    assert columns == set(MODELS[NAME].columns)
    for expectation in module.expectations(GE[0]):
        kwargs = expectation.configuration.kwargs
        named = {kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs} | set(
            kwargs.get("column_list") or ())
        assert not named - columns - derived, f"{type(expectation).__name__} names {named}"


def test_the_oracles_table_passes_its_suite():
    assert len(_frame()) >= 2
    assert _failed(_frame()) == []


def _broken(**changes) -> pd.DataFrame:
    frame = _frame()
    for column, value in changes.items():
        frame.loc[0, column] = value
    return frame


@pytest.mark.parametrize("page", ["pricing", "/a b", "/search?q=1"])
def test_the_suite_catches_a_page_that_is_not_a_path(page):
    assert _failed(_broken(page=page)) == ["expect_column_values_to_match_regex:page"]


def test_the_suite_catches_broken_rows():
    assert _failed(_broken(views=0)) == ["expect_column_values_to_be_between:views"]
    frame = _frame()
    frame.loc[0, "window_start"] += pd.Timedelta(seconds=5)
    assert _failed(frame) == ["expect_column_values_to_be_in_set:window_seconds",
                              "expect_column_values_to_be_in_set:window_start_second"]
    frame = _frame()
    assert _failed(pd.concat([frame, frame.iloc[:1]], ignore_index=True)) == \
        ["expect_compound_columns_to_be_unique:['site_id', 'page', 'window_start']"]
