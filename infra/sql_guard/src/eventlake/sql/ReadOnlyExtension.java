package eventlake.sql;

import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.AliasIdentifier;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.analysis.UnresolvedRelation;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.SubqueryAlias;
import org.apache.spark.sql.catalyst.plans.logical.View;
import org.apache.spark.sql.execution.command.SetCommand;

import scala.Function1;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;
import scala.runtime.BoxedUnit;

/**
 * eventlake's SQL server only reads. A check rule on every analyzed plan (it runs before a command executes):
 * a plan holding a command (INSERT, UPDATE, DELETE, MERGE, CREATE, DROP, ALTER, OPTIMIZE, VACUUM, SET key=value,
 * CACHE ...) is refused, except the few that only describe (EXPLAIN, DESCRIBE, SHOW); and every table read must
 * be reached through one of the server's views (the catalog's names): a parser around Spark's refuses a table
 * named by path or by another catalog (delta.`/path`, parquet.`/path`), and the check rule a path-named table
 * that reached the analyzer some other way. Enabled with
 * spark.sql.extensions=...,eventlake.sql.ReadOnlyExtension.
 */
public final class ReadOnlyExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {

    static final String WHY = "every read path is read-only: the read models change only through their "
            + "projections, `eventlake rebuild` and `eventlake reprocess`";

    private static final Set<String> DESCRIBING = Set.of(
            "ExplainCommand", "DescribeTableCommand", "DescribeRelation", "DescribeColumnCommand", "DescribeColumn",
            "DescribeQueryCommand", "ShowTablesCommand", "ShowTables", "ShowViewsCommand", "ShowViews",
            "ShowColumnsCommand", "ShowColumns", "ShowFunctionsCommand", "ShowFunctions", "DescribeFunctionCommand",
            "DescribeFunction", "ShowNamespaces", "ShowNamespacesCommand", "DescribeNamespace", "ShowCatalogs",
            "ShowCatalogsCommand", "ShowCurrentNamespaceCommand", "ShowCurrentNamespace", "DescribeDeltaDetailCommand",
            "DescribeDeltaHistoryCommand", "DescribeDeltaHistory",
            // USE: the session's current namespace (clients such as PyHive send `USE default` on connect)
            "SetCatalogAndNamespace", "SetNamespaceCommand");

    private static final Map<String, String> STATEMENTS = Map.ofEntries(
            Map.entry("InsertIntoHadoopFsRelationCommand", "INSERT"), Map.entry("AppendData", "INSERT"),
            Map.entry("OverwriteByExpression", "INSERT OVERWRITE"), Map.entry("InsertIntoDataSourceCommand", "INSERT"),
            Map.entry("InsertIntoDataSourceDirCommand", "INSERT OVERWRITE DIRECTORY"),
            Map.entry("WriteIntoDeltaCommand", "INSERT"), Map.entry("DeleteCommand", "DELETE"),
            Map.entry("DeleteFromTable", "DELETE"), Map.entry("UpdateCommand", "UPDATE"),
            Map.entry("UpdateTable", "UPDATE"), Map.entry("MergeIntoCommand", "MERGE"),
            Map.entry("MergeIntoTable", "MERGE"), Map.entry("DropTable", "DROP TABLE"),
            Map.entry("DropTableCommand", "DROP TABLE"), Map.entry("DropView", "DROP VIEW"),
            Map.entry("DropTempViewCommand", "DROP VIEW"), Map.entry("CreateTable", "CREATE TABLE"),
            Map.entry("CreateTableAsSelect", "CREATE TABLE"), Map.entry("CreateDeltaTableCommand", "CREATE TABLE"),
            Map.entry("CreateViewCommand", "CREATE VIEW"), Map.entry("CreateView", "CREATE VIEW"),
            Map.entry("TruncateTableCommand", "TRUNCATE"), Map.entry("TruncateTable", "TRUNCATE"),
            Map.entry("OptimizeTableCommand", "OPTIMIZE"), Map.entry("VacuumTableCommand", "VACUUM"),
            Map.entry("RestoreTableCommand", "RESTORE"), Map.entry("SetCommand", "SET"),
            Map.entry("ResetCommand", "RESET"), Map.entry("CacheTableCommand", "CACHE TABLE"),
            Map.entry("CacheTable", "CACHE TABLE"), Map.entry("AddJarsCommand", "ADD JAR"),
            Map.entry("AddColumns", "ALTER TABLE"), Map.entry("AlterTableAddColumnsCommand", "ALTER TABLE"));

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectCheckRule(new AbstractFunction1<SparkSession, Function1<LogicalPlan, BoxedUnit>>() {
            @Override
            public Function1<LogicalPlan, BoxedUnit> apply(SparkSession session) {
                return new AbstractFunction1<LogicalPlan, BoxedUnit>() {
                    @Override
                    public BoxedUnit apply(LogicalPlan plan) {
                        check(plan);
                        return BoxedUnit.UNIT;
                    }
                };
            }
        });
        extensions.injectParser(new AbstractFunction2<SparkSession, ParserInterface, ParserInterface>() {
            @Override
            public ParserInterface apply(SparkSession session, ParserInterface delegate) {
                return new PathRefusingParser(delegate);
            }
        });
        return BoxedUnit.UNIT;
    }

    /** Spark's parser, refusing a statement that names a table by path or by another catalog (delta.`/path`). */
    static final class PathRefusingParser implements ParserInterface {
        private final ParserInterface delegate;

        PathRefusingParser(ParserInterface delegate) {
            this.delegate = delegate;
        }

        @Override
        public LogicalPlan parsePlan(String sql) throws ParseException {
            return refusePaths(delegate.parsePlan(sql));
        }

        @Override
        public LogicalPlan parsePlanWithParameters(String sql, ParameterContext parameters) throws ParseException {
            return refusePaths(delegate.parsePlanWithParameters(sql, parameters));
        }

        @Override
        public LogicalPlan parseQuery(String sql) throws ParseException {
            return refusePaths(delegate.parseQuery(sql));
        }

        @Override
        public Expression parseExpression(String sql) throws ParseException {
            return delegate.parseExpression(sql);
        }

        @Override
        public TableIdentifier parseTableIdentifier(String sql) throws ParseException {
            return delegate.parseTableIdentifier(sql);
        }

        @Override
        public FunctionIdentifier parseFunctionIdentifier(String sql) throws ParseException {
            return delegate.parseFunctionIdentifier(sql);
        }

        @Override
        public scala.collection.immutable.Seq<String> parseMultipartIdentifier(String sql) throws ParseException {
            return delegate.parseMultipartIdentifier(sql);
        }

        @Override
        public StructType parseRoutineParam(String sql) throws ParseException {
            return delegate.parseRoutineParam(sql);
        }

        @Override
        public StructType parseTableSchema(String sql) throws ParseException {
            return delegate.parseTableSchema(sql);
        }

        @Override
        public DataType parseDataType(String sql) throws ParseException {
            return delegate.parseDataType(sql);
        }
    }

    static LogicalPlan refusePaths(LogicalPlan plan) {
        if (!TRUSTED.get()) {
            refusePathsIn(plan);
        }
        return plan;
    }

    private static void refusePathsIn(LogicalPlan node) {
        if (node instanceof UnresolvedRelation) {
            scala.collection.immutable.Seq<String> parts = ((UnresolvedRelation) node).multipartIdentifier();
            if (parts.size() > 1) {
                throw new UnsupportedOperationException("eventlake: read-only: " + parts.mkString(".") + " is "
                        + "refused: tables are read by their names, through the catalog, never by path; " + WHY);
            }
        }
        scala.collection.Iterator<LogicalPlan> children = node.children().iterator();
        while (children.hasNext()) {
            refusePathsIn(children.next());
        }
        scala.collection.Iterator<?> inner = node.innerChildren().iterator();
        while (inner.hasNext()) {
            Object child = inner.next();
            if (child instanceof LogicalPlan) {
                refusePathsIn((LogicalPlan) child);
            }
        }
    }

    private static final ThreadLocal<Boolean> TRUSTED = ThreadLocal.withInitial(() -> Boolean.FALSE);

    /**
     * The server's own thread registers the views (a command over table paths): it trusts itself while it
     * does. Every other thread (the JDBC sessions') stays checked.
     */
    public static void trustThisThread(boolean trusted) {
        TRUSTED.set(trusted);
    }

    /** Throws UnsupportedOperationException naming the statement, unless the plan only reads. */
    public static void check(LogicalPlan plan) {
        if (TRUSTED.get()) {
            return;
        }
        String root = plan.getClass().getSimpleName();
        if (DESCRIBING.contains(root)) {
            return;
        }
        if (plan instanceof SetCommand) {
            scala.Option<scala.Tuple2<String, scala.Option<String>>> kv = ((SetCommand) plan).kv();
            if (kv.isEmpty() || kv.get()._2().isEmpty()) {
                return; // SET or SET key: shows settings, changes nothing
            }
        }
        // Inside the resolution of a view (the server's own: a person cannot create one), its definition reads
        // its table by path: that is how a name resolves to the current generation's folder.
        walk(plan, resolvingAView());
    }

    private static void walk(LogicalPlan node, boolean inView) {
        String name = node.getClass().getSimpleName();
        if (node instanceof Command) {
            throw new UnsupportedOperationException("eventlake: read-only: " + STATEMENTS.getOrDefault(name, name)
                    + " is refused: " + WHY + "; run a SELECT");
        }
        boolean underView = inView || node instanceof View;
        if (!underView && node instanceof SubqueryAlias) {
            // A table named by path (delta.`/path`, parquet.`/path`): the analyzer keeps the name it was read by.
            // Spark's and Delta's own reads (DataFrames over the log's files) carry no such name.
            AliasIdentifier id = ((SubqueryAlias) node).identifier();
            String qualified = id.qualifier().mkString(".") + "." + id.name();
            if (qualified.contains("/")) {
                throw new UnsupportedOperationException("eventlake: read-only: " + id.name() + " is refused: tables "
                        + "are read by their names, through the catalog, never by path; " + WHY);
            }
        }
        scala.collection.Iterator<LogicalPlan> children = node.children().iterator();
        while (children.hasNext()) {
            walk(children.next(), underView);
        }
        scala.collection.Iterator<LogicalPlan> subqueries = node.subqueries().iterator();
        while (subqueries.hasNext()) {
            walk(subqueries.next(), underView);
        }
    }

    /** Whether this check is of a view's definition, made while the analyzer resolves the view. */
    private static boolean resolvingAView() {
        return StackWalker.getInstance().walk(frames -> frames.anyMatch(
                frame -> frame.getClassName().startsWith("org.apache.spark.sql.catalyst.analysis.ViewResolution")));
    }

}
