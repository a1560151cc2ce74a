"""Which folds the rebuild can do in DuckDB, and the Delta types it writes (no JVM, no tables)."""
import pyarrow as pa
import pytest
from pyspark.sql import types as T

import read_models
from spark_apps.archive_fold import supports
from spark_apps.arrow_rows import arrow_schema


def test_every_read_model_folds_in_duckdb_on_local_paths_and_falls_back_to_spark_with_the_reason():
    models = read_models.select(None)
    assert supports(models, ["/data/warehouse/payments", "file:///data/warehouse/x"]) == ""
    no_sql = read_models.get("payments").__class__(**{**read_models.get("payments").__dict__, "name": "clicks",
                                                       "fold_sql": ""})
    assert supports([*models, no_sql], []) == "no fold_sql for clicks"
    assert supports(models, ["/data/a", "s3a://bucket/warehouse/payments"]) == \
        "not a local path: s3a://bucket/warehouse/payments"


def test_arrow_schema_keeps_each_columns_delta_type_and_nullability():
    schema = arrow_schema(read_models.get("account_summary").schema())
    assert schema.field("account_id") == pa.field("account_id", pa.string(), nullable=False)
    assert schema.field("version").type == pa.int64()
    assert schema.field("updated_at").type == pa.timestamp("us", tz="UTC")  # Delta "timestamp", not timestamp_ntz
    assert arrow_schema(T.StructType([T.StructField("n", T.IntegerType()), T.StructField("d", T.DecimalType(18, 2)),
                                      T.StructField("b", T.BooleanType())])) == \
        pa.schema([("n", pa.int32()), ("d", pa.decimal128(18, 2)), ("b", pa.bool_())])
    with pytest.raises(TypeError, match="no Arrow type for the Spark type map<string,string>"):
        arrow_schema(T.StructType([T.StructField("m", T.MapType(T.StringType(), T.StringType()))]))
