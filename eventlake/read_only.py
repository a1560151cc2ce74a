"""The read paths are read-only: a statement is run only when it reads.

The read models change only through their projections, ``eventlake rebuild`` and ``eventlake reprocess``;
SQL from a person or a BI tool must not change them, nor reach the table folders by path. Each engine's own
parser says what a statement is, and only reads pass:

- DuckDB (the embedded path): every statement must be a ``SELECT`` (DESCRIBE, SHOW, SUMMARIZE, FROM-first and
  VALUES are SELECTs to DuckDB) or an ``EXPLAIN``; the connection also runs with file access off (no
  ``COPY ... TO``, ``read_parquet('/path')``, ``ATTACH``, extensions) and its configuration locked.
- Spark SQL: the parsed plan must be built of query operators only (an allowlist: a node Spark adds later is
  refused until it is known to read), or be one of a few commands that only describe (EXPLAIN, DESCRIBE, SHOW);
  a table is named by its one-part name, so ``delta.`/path```, ``parquet.`/path``` and catalog-qualified names
  are refused, and so are file-reading table functions.
- Spark SQL, both paths (``eventlake query --engine spark`` and the Thrift server): no code runs from SQL, and
  string literals read as DuckDB reads them. That rule is the Thrift server's guard (``infra/sql_guard``:
  ``eventlake.sql.ReadOnlyExtension``): an allowlist of Spark's built-in function classes minus those that invoke
  code (``java_method``, ``reflect``, ``try_reflect``, every kind of user-defined function), and single-quoted
  literals rewritten so that a backslash is a character and ``''`` a quote. The query path loads the same class
  into its session's JVM (``SparkGuard``) and calls it on the statement before and after analysis.
"""
from __future__ import annotations
from lakehouse.errors import BadInput

__all__ = ["WriteRefused", "check_duckdb", "lock_duckdb", "check_spark", "SparkGuard", "spark_guard"]

WHY = ("every read path is read-only: the read models change only through their projections, "
       "`eventlake rebuild` and `eventlake reprocess`")


class WriteRefused(BadInput, ValueError):
    """A statement that is not a read, or reads past the catalog's tables; the message says which and why."""


# -- DuckDB ------------------------------------------------------------------------------------------------------

def check_duckdb(con, sql: str) -> None:
    """Raise ``WriteRefused`` unless every statement of ``sql`` is a SELECT or an EXPLAIN (DuckDB's parser
    decides). A statement DuckDB cannot parse is left to DuckDB, whose message says where."""
    import duckdb

    try:
        statements = con.extract_statements(sql)
    except duckdb.Error:
        return
    for statement in statements:
        kind = statement.type.name
        if kind not in ("SELECT", "EXPLAIN"):
            raise WriteRefused(f"{kind} is refused: {WHY}; run a SELECT")


def lock_duckdb(con) -> None:
    """No file access from SQL (the tables are registered before), and no SET to turn it back on."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# -- Spark SQL ---------------------------------------------------------------------------------------------------

# Logical plan nodes of a query as Spark's parser builds them (before analysis).
_QUERY_NODES = frozenset({
    "Project", "Filter", "Aggregate", "Sort", "GlobalLimit", "LocalLimit", "Offset", "Tail", "Distinct",
    "Deduplicate", "Union", "Intersect", "Except", "Join", "LateralJoin", "SubqueryAlias", "UnresolvedWith",
    "WithCTE", "CTERelationDef", "CTERelationRef", "UnresolvedRelation", "OneRowRelation", "LocalRelation",
    "UnresolvedInlineTable", "Window", "WithWindowDefinition", "UnresolvedHint", "Generate", "Pivot", "Unpivot",
    "Sample", "Repartition", "RepartitionByExpression", "RebalancePartitions", "UnresolvedTableValuedFunction",
    "UnresolvedSubqueryColumnAliases", "Range", "Expand", "UnresolvedHaving", "ResolvedHint",
})
# Commands that only describe: allowed at the root.
_DESCRIBING = frozenset({"ExplainCommand", "DescribeRelation", "DescribeColumn", "DescribeQueryCommand",
                         "ShowTables", "ShowViews", "ShowColumns", "ShowFunctions", "DescribeFunction",
                         "UnresolvedTableOrView", "CurrentNamespace$", "UnresolvedNamespace"})
# What a person calls the statement a node stands for.
_STATEMENTS = {
    "InsertIntoStatement": "INSERT", "InsertIntoDir": "INSERT OVERWRITE DIRECTORY", "DeleteFromTable": "DELETE",
    "UpdateTable": "UPDATE", "MergeIntoTable": "MERGE", "DropTable": "DROP TABLE", "DropView": "DROP VIEW",
    "CreateTable": "CREATE TABLE", "CreateTableAsSelect": "CREATE TABLE", "ReplaceTable": "REPLACE TABLE",
    "ReplaceTableAsSelect": "REPLACE TABLE", "CreateViewCommand": "CREATE VIEW", "CreateView": "CREATE VIEW",
    "TruncateTable": "TRUNCATE", "AddColumns": "ALTER TABLE", "DropColumns": "ALTER TABLE",
    "RenameTable": "ALTER TABLE", "SetTableProperties": "ALTER TABLE", "OptimizeTableCommand": "OPTIMIZE",
    "VacuumTableCommand": "VACUUM", "RestoreTableStatement": "RESTORE", "CacheTable": "CACHE TABLE",
    "CacheTableAsSelect": "CACHE TABLE", "SetCommand": "SET", "ResetCommand": "RESET",
    "AddJarsCommand": "ADD JAR", "LoadData": "LOAD DATA", "RepairTable": "MSCK REPAIR",
    "CreateFunction": "CREATE FUNCTION", "CreateFunctionCommand": "CREATE FUNCTION",
    "CreateUserDefinedFunction": "CREATE FUNCTION", "CreateSQLFunctionCommand": "CREATE FUNCTION",
    "DropFunction": "DROP FUNCTION", "DropFunctionCommand": "DROP FUNCTION", "RefreshFunction": "REFRESH FUNCTION",
}
_FILE_FUNCTIONS = ("read_",)  # table functions that read files by path (read_files and the like)


def check_spark(spark, sql: str) -> None:
    """Raise ``WriteRefused`` unless ``sql`` parses (Spark's own parser) to a query over one-part table names,
    or to a describing command. A statement Spark cannot parse is left to Spark, whose message says where."""
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(sql)
    except Exception:  # noqa: BLE001 -- a ParseException: running it gives Spark's own message
        return
    root = plan.getClass().getSimpleName()
    if root in _DESCRIBING:
        return
    logical = spark._jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.LogicalPlan")
    for node in _nodes(plan, logical):
        name = node.getClass().getSimpleName()
        if name not in _QUERY_NODES:
            raise WriteRefused(f"{_STATEMENTS.get(name, name)} is refused: {WHY}; run a SELECT")
        if name == "UnresolvedRelation":
            parts = [str(p) for p in _scala_list(node.multipartIdentifier())]
            if len(parts) > 1:
                raise WriteRefused(f"{'.'.join(parts)} is refused: a table is read by its name, through the "
                                   f"catalog, never by path (delta.`...`) or another catalog; {WHY}")
        if name == "UnresolvedTableValuedFunction":
            function = ".".join(str(p) for p in _scala_list(node.name()))
            if function.lower().startswith(_FILE_FUNCTIONS):
                raise WriteRefused(f"{function}(...) is refused: files are read through the catalog's tables "
                                   f"only; {WHY}")


def _nodes(plan, logical):
    """Every node of a parsed plan: its children and the plans inside its expressions (subqueries, CTEs)."""
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_scala_list(node.children()))
        stack.extend(p for p in _scala_list(node.innerChildren()) if logical.isInstance(p))


def _scala_list(seq) -> list:
    out = []
    it = seq.iterator()
    while it.hasNext():
        out.append(it.next())
    return out


# -- the Thrift server's guard, in the query path's session --------------------------------------------------------

_GUARD_CLASS = "eventlake.sql.ReadOnlyExtension"
_REFUSED_PREFIX = "eventlake: read-only: "


class SparkGuard:
    """The SQL server's guard class (``infra/sql_guard``) loaded into a running session's JVM: the session need
    not have been built with the extension (``eventlake query --engine spark`` uses the process's session), so
    the class is loaded from its jar by a class loader of its own, its parent Spark's, and called by reflection."""

    def __init__(self, spark, jar):
        jvm, gateway = spark._jvm, spark.sparkContext._gateway
        self._spark, self._gateway, self._jvm = spark, gateway, jvm
        urls = gateway.new_array(jvm.java.net.URL, 1)
        urls[0] = jvm.java.io.File(str(jar)).toURI().toURL()
        loader = jvm.java.net.URLClassLoader(urls, spark._jsparkSession.getClass().getClassLoader())
        guard = loader.loadClass(_GUARD_CLASS)
        self._methods = {m.getName(): m for m in guard.getMethods()}

    def _call(self, name: str, *args):
        from py4j.protocol import Py4JJavaError

        array = self._gateway.new_array(self._jvm.java.lang.Object, len(args))
        for i, arg in enumerate(args):
            array[i] = arg
        try:
            return self._methods[name].invoke(None, array)
        except Py4JJavaError as e:
            cause = e.java_exception.getCause()  # the InvocationTargetException's
            message = cause.getMessage() if cause is not None else None
            if message and message.startswith(_REFUSED_PREFIX):
                raise WriteRefused(message[len(_REFUSED_PREFIX):]) from None
            raise

    def standard_literals(self, sql: str) -> str:
        """``sql`` with its single-quoted literals as DuckDB reads them, in the form Spark's parser reads so."""
        return str(self._call("standardLiterals", sql))

    def check_parsed(self, sql: str) -> None:
        """Raise ``WriteRefused`` when the statement calls a function off the allowlist (or names a table by
        path); a statement Spark cannot parse is left to Spark."""
        try:
            plan = self._spark._jsparkSession.sessionState().sqlParser().parsePlan(sql)
        except Exception:  # noqa: BLE001 -- a ParseException: running it gives Spark's own message
            return
        self._call("refusePaths", plan)

    def check_analyzed(self, df) -> None:
        """Raise ``WriteRefused`` when the analyzed plan of ``df`` holds a command or a code-invoking expression
        (a UDF this process registered under a built-in's name)."""
        analyzed = df._jdf.queryExecution().analyzed()
        self._call("check", analyzed)
        self._call("refuseCode", analyzed)


def spark_guard(spark, settings) -> SparkGuard:
    """The guard of this session's JVM (loaded once per Spark context; its jar is compiled once per version of
    its source, by ``eventlake.sql_guard.guard_jar``)."""
    from eventlake.sql_guard import guard_jar

    jar = guard_jar(settings, log=lambda *_: None)
    context = spark.sparkContext
    guards = context.__dict__.setdefault("_eventlake_guards", {})
    if str(jar) not in guards:
        guards[str(jar)] = SparkGuard(spark, jar)
    return guards[str(jar)]
