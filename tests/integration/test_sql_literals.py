"""The same SQL gives the same rows on the three read paths: DuckDB (`eventlake query`), Spark SQL (`eventlake
query --engine spark`) and the Thrift server, for string literals written as SQL (and DuckDB) reads them: a
backslash is a character, a quote is doubled. Spark's parser reads a backslash as an escape; the guard rewrites
each literal so that it reads the value DuckDB reads (infra/sql_guard, ReadOnlyExtension.standardLiterals)."""
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb, query_spark
from tests.domain_helpers import events_for
from tests.integration.sql_fixtures import running_server, server_settings, thrift_rows
from tests.integration.test_checks import write_folded

pytestmark = pytest.mark.slow

# Account ids as stored; each is looked up by a literal spelling it the SQL way.
IDS = [
    'acc-"dq"\\bs-1',          # the issue's: double quotes and a backslash before b (not a backspace)
    "acc-o'brien",             # a quote, doubled in the literal
    "acc-''-two",              # two quotes, four in the literal
    "acc-ends\\",              # a backslash last: Spark's parser cannot end a literal so by itself
    "acc-\\\\two-\\'",         # two backslashes; a backslash before a quote
    "acc-\\u0041-\\t-\\n-\\0",  # what Spark would read as escapes (A, tab, newline, NUL), as plain text
    "acc-%\\_",                # LIKE's wildcards after a backslash
    "acc-é-中-ß",              # Unicode in the Basic Multilingual Plane
    "acc-😀-𝄞",                # astral characters (surrogate pairs in UTF-16, 4 bytes in UTF-8)
    "acc-tab\there-line\nbreak",  # a real tab and a real newline inside the literal
    "acc-nul\x00inside",       # a NUL character: both engines take it in a literal
]


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = server_settings(tmp_path_factory.mktemp("sql-literals-home"))
    write_folded(settings, events_for(GeneratorConfig(accounts=3, commands=30, seed=4, run_id="lit")))
    path = str(settings.table_path("account_summary"))
    table = DeltaTable(path)
    first = table.to_pyarrow_table().slice(0, 1)
    rows = pa.concat_tables([first] * len(IDS))
    rows = rows.set_column(rows.schema.get_field_index("account_id"), rows.schema.field("account_id"),
                           pa.array(IDS, rows.schema.field("account_id").type))
    write_deltalake(path, rows.cast(pa.schema(table.schema().to_arrow())), mode="append")
    with running_server(settings):
        yield settings


def three_paths(settings, sql: str) -> tuple[list, list, list]:
    return (query_duckdb(settings, sql)[1], [tuple(r) for r in query_spark(settings, sql)[1]],
            thrift_rows(settings, sql))


def test_each_literal_finds_its_row_on_all_three_paths(server):
    sql = f"SELECT account_id FROM account_summary WHERE account_id IN ({', '.join(map(literal, IDS))})"
    duckdb, spark, thrift = (sorted(rows) for rows in three_paths(server, sql))
    assert duckdb == sorted((v,) for v in IDS), duckdb
    assert spark == duckdb and thrift == duckdb, (spark, thrift)


def test_each_literal_reads_as_the_same_value_on_all_three_paths(server):
    sql = "SELECT " + ", ".join(f"{literal(v)} AS v{i}" for i, v in enumerate(IDS))
    duckdb, spark, thrift = three_paths(server, sql)
    assert duckdb == spark == thrift == [tuple(IDS)]


def test_comments_identifiers_and_other_literals_are_left_as_they_are(server):
    """The rewrite touches single-quoted literals only: a quote in a comment or a backquoted identifier, and
    typed and hex literals, read as before."""
    sql = ("SELECT count(*) AS `it's`, -- a comment's quote\n"
           "/* and 'another' one's */ DATE '2026-01-02' AS d, X'41' AS x, length('a''b\\c') AS n "
           "FROM account_summary WHERE account_id IN ('acc-o''brien', 'acc-ends\\')")
    duckdb, spark, thrift = three_paths(server, sql)
    assert [r[0] for r in duckdb] == [r[0] for r in spark] == [r[0] for r in thrift] == [2]
    assert [r[3] for r in duckdb] == [r[3] for r in spark] == [r[3] for r in thrift] == [5]
    assert str(spark[0][1]) == str(thrift[0][1]) == "2026-01-02" and bytes(spark[0][2]) == b"A"
