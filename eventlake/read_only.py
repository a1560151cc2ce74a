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
"""
from __future__ import annotations

__all__ = ["WriteRefused", "check_duckdb", "lock_duckdb", "check_spark"]

WHY = ("every read path is read-only: the read models change only through their projections, "
       "`eventlake rebuild` and `eventlake reprocess`")


class WriteRefused(ValueError):
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
