"""Every read model has an expectation suite, and every suite names only columns its table has."""
import great_expectations as gx
import pandas as pd
import pytest

import read_models
from expectations import SUITES


def test_every_read_model_has_a_suite():
    assert sorted(SUITES) == sorted(read_models.REGISTRY), "a read model is one module plus one expectation suite"


# An empty frame typed as the table is read (its derived columns may use .dt on timestamps, arithmetic on numbers).
_PANDAS_TYPES = {"timestamp": "datetime64[ns, UTC]", "long": "int64", "integer": "int64", "double": "float64",
                 "boolean": "bool", "string": "object"}


def _columns_named(expectation) -> set[str]:
    kwargs = expectation.configuration.kwargs
    named = {kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs}
    return named | set(kwargs.get("column_list") or ())


@pytest.mark.parametrize("name", sorted(SUITES))
def test_a_suite_names_only_columns_of_its_table_or_its_derived_columns(name):
    module = SUITES[name]
    columns = set(read_models.get(name).columns)
    derived = set()
    if hasattr(module, "derived_columns"):
        frame = pd.DataFrame({f.name: pd.Series(dtype=_PANDAS_TYPES.get(f.dataType.typeName(), "object"))
                              for f in read_models.get(name).schema().fields})
        module.derived_columns(frame)
        derived = set(frame.columns) - columns
    for expectation in module.expectations(gx):
        unknown = _columns_named(expectation) - columns - derived
        assert not unknown, f"{name}: {type(expectation).__name__} names {unknown}, not columns of {name}"
