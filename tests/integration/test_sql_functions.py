"""No code runs through SQL: every function Spark registers that invokes code named by its arguments (found in
Spark's own function registry, not listed here by name), user-defined functions of every kind, and the statements
that create or drop functions are refused by `eventlake query --engine spark` and by the Thrift server, with the
function and the reason, before anything runs (a System.setProperty through reflection leaves no property); the
server still answers afterwards; and ordinary queries with common built-in functions still run."""
import pytest

from eventlake.generator import GeneratorConfig
from eventlake.query import QueryError, query_duckdb, query_spark
from eventlake.read_only import spark_guard
from tests.domain_helpers import events_for
from tests.integration.sql_fixtures import running_server, server_settings, thrift_rows
from tests.integration.test_checks import write_folded

pytestmark = pytest.mark.slow

PROPERTY = "eventlake.test.reflected"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = server_settings(tmp_path_factory.mktemp("sql-functions-home"))
    write_folded(settings, events_for(GeneratorConfig(accounts=3, commands=30, seed=4, run_id="fn")))
    with running_server(settings):
        yield settings


def _class(spark, name):
    return spark._jvm.java.lang.Class.forName(name)


def code_invoking_functions(spark) -> set[str]:
    """The names in the session's function registry whose expression calls a method its arguments name or runs a
    user's code: its class is reflection or a user-defined expression, or the expression built from three
    string arguments holds one (a wrapper such as try_reflect)."""
    jvm = spark._jvm
    reflection = _class(spark, "org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection")
    user_defined = _class(spark, "org.apache.spark.sql.catalyst.expressions.UserDefinedExpression")
    replaceable = _class(spark, "org.apache.spark.sql.catalyst.expressions.RuntimeReplaceable")

    def invokes(cls) -> bool:
        return reflection.isAssignableFrom(cls) or user_defined.isAssignableFrom(cls)

    def holds(expression) -> bool:
        if invokes(expression.getClass()):
            return True
        inner = list(_seq(expression.children()))
        if replaceable.isInstance(expression):
            try:
                inner.append(expression.replacement())
            except Exception:  # noqa: BLE001 -- built for other arguments (from_avro's)
                pass
        return any(holds(e) for e in inner)

    registry = spark._jsparkSession.sessionState().functionRegistry()
    literal = jvm.org.apache.spark.sql.catalyst.expressions.Literal
    args = jvm.scala.jdk.javaapi.CollectionConverters.asScala(
        [literal.fromObject("java.lang.System"), literal.fromObject("getProperty"), literal.fromObject("user.home")]
    ).toList()
    found = set()
    for identifier in _seq(registry.listFunction()):
        info = registry.lookupFunction(identifier).get()
        cls = jvm.java.lang.Class.forName(info.getClassName(), False, reflection.getClassLoader())
        if invokes(cls):
            found.add(identifier.funcName())
        elif replaceable.isAssignableFrom(cls):
            try:
                built = registry.lookupFunction(identifier, args)
            except Exception:  # noqa: BLE001 -- takes other arguments: not a method-by-name function
                continue
            if holds(built):
                found.add(identifier.funcName())
    return found


def _seq(seq):
    it = seq.iterator()
    while it.hasNext():
        yield it.next()


def calls(name: str) -> list[str]:
    """Ways to call a function of the reflect family, each setting a system property if it ran."""
    call = f"{name}('java.lang.System', 'setProperty', '{PROPERTY}', 'ran')"
    return [f"SELECT {call}", f"SELECT {name.upper()}('java.lang.System', 'getProperty', 'user.home')",
            f"SELECT count(*) FROM payments WHERE payment_id = {call}",
            f"WITH t AS (SELECT {call} AS r) SELECT * FROM t",
            f"SELECT * FROM payments WHERE payment_id IN (SELECT {call})",
            f"SELECT transform(array('a'), x -> {call})",
            f"SELECT count(*) OVER w FROM payments WINDOW w AS (ORDER BY {call})",
            f"SELECT count(*) FILTER (WHERE {call} = 'x') FROM payments GROUP BY GROUPING SETS ((status), ({call}))",
            f"SELECT system.builtin.{call}",
            # Statements that only describe a query analyse it, and analysing a reflection call loads the class it
            # names (its static initializer runs): refused before analysis too.
            f"EXPLAIN SELECT {call}", f"EXPLAIN EXTENDED SELECT count(*) FROM payments WHERE payment_id = {call}",
            f"DESCRIBE QUERY SELECT {call}"]


def test_the_code_invoking_functions_are_found_in_sparks_registry(spark):
    found = code_invoking_functions(spark)
    # What Spark 4 registers today; a later Spark may add more, and each is then tested below too.
    assert {"java_method", "reflect", "try_reflect"} <= found, found


def test_query_refuses_every_code_invoking_function_and_nothing_runs(spark, server):
    for name in sorted(code_invoking_functions(spark)):
        for sql in calls(name):
            with pytest.raises(QueryError) as refused:
                query_spark(server, sql)
            message = str(refused.value)
            assert message.lower().startswith((f"read-only: function {name}",
                                               f"read-only: function system.builtin.{name}")), (sql, message)
            assert "is refused" in message and "Java method" in message, message
    assert spark._jvm.java.lang.System.getProperty(PROPERTY) is None


def test_query_refuses_user_defined_functions_and_creating_them(spark, server):
    spark.udf.register("plus_one_py", lambda x: x + 1, "int")
    refused = {
        "SELECT plus_one_py(1)": "function plus_one_py is refused: it is not one of Spark's built-in functions",
        "SELECT default.some_udf(1)": "function default.some_udf is refused",
        f"SELECT * FROM table_changes_by_path('{server.table_path('payments')}', 0)":
            "function table_changes_by_path is refused",
        "CREATE TEMPORARY FUNCTION ascii_udf AS 'org.apache.hadoop.hive.ql.udf.UDFAscii'": "CREATE FUNCTION is refused",
        "CREATE FUNCTION plus_one(x INT) RETURNS INT RETURN x + 1": "CREATE FUNCTION is refused",
        "CREATE TEMPORARY FUNCTION plus_two(x INT) RETURNS INT RETURN x + 2": "CREATE FUNCTION is refused",
        "DROP TEMPORARY FUNCTION plus_one_py": "DROP FUNCTION is refused",
        "DROP FUNCTION IF EXISTS default.some_udf": "DROP FUNCTION is refused",
        "SELECT IDENTIFIER('java_method')('java.lang.System', 'getProperty', 'user.home')":
            "function IDENTIFIER('java_method') is refused",
    }
    try:
        for sql, expected in refused.items():
            with pytest.raises(QueryError) as error:
                query_spark(server, sql)
            assert str(error.value).startswith("read-only: ") and expected in str(error.value), (sql, str(error.value))
    finally:
        spark.sql("DROP TEMPORARY FUNCTION IF EXISTS plus_one_py")
    assert spark.catalog.functionExists("plus_two") is False


def test_every_other_builtin_function_passes_the_guard(spark, server):
    """The allowlist holds every function Spark registers as built-in but the code-invoking ones."""
    guard = spark_guard(spark, server)
    invoking = code_invoking_functions(spark)
    builtin = spark._jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin()
    names = [i.funcName() for i in _seq(builtin.listFunction())]
    assert len(names) > 400
    for name in names:
        if name not in invoking:
            guard.check_parsed(f"SELECT `{name}`()")  # parsed, not run: the arguments do not matter


ORDINARY = [
    "SELECT upper(status) AS s, count(*) AS n, sum(amount_minor) AS total, coalesce(max(decline_reason), 'none') AS m "
    "FROM payments GROUP BY upper(status) ORDER BY s",
    "SELECT account_id, date_trunc('HOUR', updated_at) AS h, regexp_extract(account_id, '([0-9]+)$', 1) AS n, "
    "account_id rlike '^acc' AS a, concat_ws('/', account_id, cast(version AS string)) AS k, "
    "round(available_minor / 100.0, 2) AS amount, size(transform(array(1, 2), x -> x * 2)) AS t "
    "FROM account_summary ORDER BY account_id",
]


def test_the_thrift_server_refuses_every_code_invoking_function_and_stays_up(spark, server):
    from pyhive.exc import OperationalError

    for name in sorted(code_invoking_functions(spark)):
        for sql in calls(name):
            with pytest.raises(OperationalError) as refused:
                thrift_rows(server, sql)
            message = str(refused.value)
            assert f"eventlake: read-only: function {name}" in message.lower() or \
                f"eventlake: read-only: function system.builtin.{name}" in message.lower(), (sql, message[:600])
            assert "Java method" in message, message[:600]
    statements = {
        "SELECT plus_one_py(1)": "function plus_one_py is refused",
        "CREATE TEMPORARY FUNCTION ascii_udf AS 'org.apache.hadoop.hive.ql.udf.UDFAscii'": "CREATE FUNCTION is refused",
        "CREATE FUNCTION plus_one(x INT) RETURNS INT RETURN x + 1": "CREATE FUNCTION is refused",
        "CREATE TEMPORARY FUNCTION plus_two(x INT) RETURNS INT RETURN x + 2": "CREATE FUNCTION is refused",
        "DROP TEMPORARY FUNCTION IF EXISTS upper": "DROP FUNCTION is refused",
        "DROP FUNCTION IF EXISTS default.some_udf": "DROP FUNCTION is refused",
        "SELECT default.some_udf(1)": "function default.some_udf is refused",
        "SELECT IDENTIFIER('java_' || 'method')('java.lang.System', 'getProperty', 'user.home')":
            "function IDENTIFIER(",
    }
    for sql, expected in statements.items():
        with pytest.raises(OperationalError) as refused:
            thrift_rows(server, sql)
        assert f"eventlake: read-only: {expected}" in str(refused.value), (sql, str(refused.value)[:600])
    # Still up.
    count = "SELECT count(*) FROM payments"
    assert thrift_rows(server, count) == query_duckdb(server, count)[1]
    assert thrift_rows(server, "SELECT upper('still answering')") == [("STILL ANSWERING",)]


def test_ordinary_functions_still_run_on_both_spark_paths(server):
    for sql in ORDINARY:
        rows = [tuple(r) for r in query_spark(server, sql)[1]]
        assert rows, sql
        assert thrift_rows(server, sql) == rows, sql
    first = ORDINARY[0].replace("coalesce(max(decline_reason), 'none')", "coalesce(NULL, 'none')")
    assert [tuple(r) for r in query_spark(server, first)[1]] == query_duckdb(server, first)[1]
