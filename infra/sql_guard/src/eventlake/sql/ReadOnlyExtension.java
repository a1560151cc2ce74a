package eventlake.sql;

import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.AliasIdentifier;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.analysis.ExpressionWithUnresolvedIdentifier;
import org.apache.spark.sql.catalyst.analysis.FunctionRegistry;
import org.apache.spark.sql.catalyst.analysis.PlanWithUnresolvedIdentifier;
import org.apache.spark.sql.catalyst.analysis.SQLFunctionExpression;
import org.apache.spark.sql.catalyst.analysis.TableFunctionRegistry;
import org.apache.spark.sql.catalyst.analysis.UnresolvedFunction;
import org.apache.spark.sql.catalyst.analysis.UnresolvedGenerator;
import org.apache.spark.sql.catalyst.analysis.UnresolvedRelation;
import org.apache.spark.sql.catalyst.analysis.UnresolvedTableValuedFunction;
import org.apache.spark.sql.catalyst.expressions.ApplyFunctionExpression;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.PlanExpression;
import org.apache.spark.sql.catalyst.expressions.TryReflect;
import org.apache.spark.sql.catalyst.expressions.UserDefinedExpression;
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
 * CACHE, CREATE/DROP FUNCTION ...) is refused, except the few that only describe (EXPLAIN, DESCRIBE, SHOW); and every
 * table read must be reached through one of the server's views (the catalog's names): a parser around Spark's
 * refuses a table named by path or by another catalog (delta.`/path`, parquet.`/path`), and the check rule a
 * path-named table that reached the analyzer some other way. Enabled with
 * spark.sql.extensions=...,eventlake.sql.ReadOnlyExtension.
 *
 * <p><b>No code runs from SQL.</b> Reading can run code too: {@code java_method}, {@code reflect} and
 * {@code try_reflect} call any static Java method named in the query ({@code System.exit}), and a user-defined
 * function (Scala, Python, Hive, SQL, a catalog's) runs code that is not Spark's. Functions are checked against an
 * <i>allowlist</i> of expression classes: the classes of the functions Spark itself registers as built-in
 * ({@code FunctionRegistry.builtin}, {@code TableFunctionRegistry.builtin}), minus those that run code named by
 * their arguments or written by a user ({@link #codeInvoking}). The parser refuses every function call whose name is
 * not a built-in function with an allowed class (so a user-defined, a temporary, a catalog's or a Delta table
 * function such as {@code table_changes_by_path} is refused without being looked up), and CREATE/DROP FUNCTION are
 * refused commands. {@link #refuseCode} is a second look at an analyzed plan, for a session the statement's
 * caller may have registered UDFs in (the query path's); the check rule cannot take it, as Delta's own plans
 * (its log replay) use UDFs and pass the same rule.
 * An allowlist rather than a list of forbidden names: a function a later Spark (or an extension) adds is refused
 * until it is a built-in whose class is known, where a denylist lets a new {@code reflect}-like function through
 * the day it appears; the only names written here are the few classes that invoke code.
 *
 * <p><b>String literals as DuckDB reads them.</b> {@code eventlake query} answers with DuckDB by default, whose
 * single-quoted literals follow the SQL standard: a backslash is a character and {@code ''} a quote. Spark's parser
 * reads {@code \} as an escape ({@code '\b'} is a backspace), and its {@code escapedStringLiterals} mode keeps
 * {@code ''} as two quotes and cannot end a literal with a backslash; so the parser rewrites every standard
 * single-quoted literal into Spark's escaped form ({@link #standardLiterals}) before parsing: the same SQL gives
 * the same rows on both engines.
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
            Map.entry("AddColumns", "ALTER TABLE"), Map.entry("AlterTableAddColumnsCommand", "ALTER TABLE"),
            Map.entry("CreateFunctionCommand", "CREATE FUNCTION"), Map.entry("CreateFunction", "CREATE FUNCTION"),
            Map.entry("CreateSQLFunctionCommand", "CREATE FUNCTION"),
            Map.entry("CreateUserDefinedFunctionCommand", "CREATE FUNCTION"),
            Map.entry("CreateUserDefinedFunction", "CREATE FUNCTION"), Map.entry("DropFunction", "DROP FUNCTION"),
            Map.entry("DropFunctionCommand", "DROP FUNCTION"), Map.entry("RefreshFunctionCommand", "REFRESH FUNCTION"),
            Map.entry("RefreshFunction", "REFRESH FUNCTION"));

    static final String FUNCTIONS_WHY = "SQL here runs Spark's built-in functions only, none that runs code named "
            + "in the query or written by a user";

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
            return refusePaths(delegate.parsePlan(literals(sql)));
        }

        @Override
        public LogicalPlan parsePlanWithParameters(String sql, ParameterContext parameters) throws ParseException {
            return refusePaths(delegate.parsePlanWithParameters(literals(sql), parameters));
        }

        @Override
        public LogicalPlan parseQuery(String sql) throws ParseException {
            return refusePaths(delegate.parseQuery(literals(sql)));
        }

        /** A person's SQL with its literals as DuckDB reads them; the server's own SQL (trusted) as it is. */
        private static String literals(String sql) {
            return TRUSTED.get() ? sql : standardLiterals(sql);
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

    /**
     * Refuses (UnsupportedOperationException naming it) a parsed plan that names a table by path or another
     * catalog, or calls a function that is not one of Spark's allowed built-ins; returns the plan.
     */
    public static LogicalPlan refusePaths(LogicalPlan plan) {
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
        if (node instanceof UnresolvedTableValuedFunction) {
            refuseUnlessBuiltin(((UnresolvedTableValuedFunction) node).name(), true);
        }
        if (node instanceof PlanWithUnresolvedIdentifier) {
            throw refusedIdentifier(((PlanWithUnresolvedIdentifier) node).identifierExpr());
        }
        // Every field, not only expressions(): a WINDOW clause's definitions are a map it does not list. A plan
        // held in a field that is not a child (EXPLAIN's and DESCRIBE QUERY's query) is walked too: describing a
        // query analyses it, and analysing a reflection call loads the class it names.
        scala.collection.Iterator<Object> fields = node.productIterator();
        while (fields.hasNext()) {
            Object field = fields.next();
            if (field instanceof LogicalPlan) {
                if (!node.children().contains(field) && !node.innerChildren().contains(field)) {
                    refusePathsIn((LogicalPlan) field);
                }
            } else {
                refuseCallsInField(field);
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

    // -- functions ------------------------------------------------------------------------------------------------

    /**
     * Why expressions of this class run code that is not Spark's own, or null when they do not: reflection
     * (a method named by the arguments) and user-defined functions of every kind (Scala, Java, Python and Hive
     * UDFs, UDAFs and UDTFs, SQL functions, a catalog's functions).
     */
    public static String codeInvoking(Class<?> c) {
        if (CallMethodViaReflection.class.isAssignableFrom(c) || TryReflect.class.isAssignableFrom(c)) {
            return "it calls the Java method its arguments name (reflection), which runs any code the server can "
                    + "load, System.exit included";
        }
        if (UserDefinedExpression.class.isAssignableFrom(c) || SQLFunctionExpression.class.isAssignableFrom(c)
                || ApplyFunctionExpression.class.isAssignableFrom(c)) {
            return "it is a user-defined function, whose code is not Spark's";
        }
        return null;
    }

    private static volatile Set<String> allowedClasses;

    /** The allowlist: the expression classes of Spark's built-in functions and table functions that run no
     * code of their own choosing (computed once, from Spark's registries). */
    public static Set<String> allowedFunctionClasses() {
        Set<String> allowed = allowedClasses;
        if (allowed == null) {
            Set<String> classes = new java.util.HashSet<>();
            addAllowed(classes, FunctionRegistry.builtin().listFunction(), false);
            addAllowed(classes, TableFunctionRegistry.builtin().listFunction(), true);
            allowed = allowedClasses = java.util.Collections.unmodifiableSet(classes);
        }
        return allowed;
    }

    private static void addAllowed(Set<String> classes, scala.collection.Seq<FunctionIdentifier> ids, boolean table) {
        scala.collection.Iterator<FunctionIdentifier> it = ids.iterator();
        while (it.hasNext()) {
            String className = builtinClass(it.next(), table);
            if (className != null && refusal(className) == null) {
                classes.add(className);
            }
        }
    }

    private static String builtinClass(FunctionIdentifier id, boolean table) {
        scala.Option<ExpressionInfo> info = table ? TableFunctionRegistry.builtin().lookupFunction(id)
                : FunctionRegistry.builtin().lookupFunction(id);
        return info.isEmpty() ? null : info.get().getClassName();
    }

    /** Why a built-in function of this class is refused, or null. */
    private static String refusal(String className) {
        try {
            return codeInvoking(Class.forName(className, false, ReadOnlyExtension.class.getClassLoader()));
        } catch (ClassNotFoundException | LinkageError e) {
            return "its class " + className + " cannot be checked";
        }
    }

    /** The expressions in a plan's field, however held (a sequence, a map, an option, a tuple); plans in fields
     * are its children, walked as such. */
    private static void refuseCallsInField(Object field) {
        if (field instanceof Expression) {
            refuseCallsIn((Expression) field);
        } else if (field instanceof scala.collection.Map) {
            scala.collection.Iterator<?> entries = ((scala.collection.Map<?, ?>) field).iterator();
            while (entries.hasNext()) {
                refuseCallsInField(entries.next());
            }
        } else if (field instanceof scala.collection.Iterable) {
            scala.collection.Iterator<?> items = ((scala.collection.Iterable<?>) field).iterator();
            while (items.hasNext()) {
                refuseCallsInField(items.next());
            }
        } else if (field instanceof scala.Option) {
            scala.Option<?> option = (scala.Option<?>) field;
            if (option.isDefined()) {
                refuseCallsInField(option.get());
            }
        } else if (field instanceof scala.Product && field.getClass().getName().startsWith("scala.Tuple")) {
            scala.collection.Iterator<Object> items = ((scala.Product) field).productIterator();
            while (items.hasNext()) {
                refuseCallsInField(items.next());
            }
        }
    }

    private static void refuseCallsIn(Expression e) {
        if (e instanceof UnresolvedFunction) {
            refuseUnlessBuiltin(((UnresolvedFunction) e).nameParts(), false);
        } else if (e instanceof UnresolvedGenerator) {
            FunctionIdentifier id = ((UnresolvedGenerator) e).name();
            refuseUnlessBuiltin(id.nameParts(), false);
        } else if (e instanceof ExpressionWithUnresolvedIdentifier) {
            throw refusedIdentifier(((ExpressionWithUnresolvedIdentifier) e).identifierExpr());
        } else if (e instanceof PlanExpression) {
            Object plan = ((PlanExpression<?>) e).plan();
            if (plan instanceof LogicalPlan) {
                refusePathsIn((LogicalPlan) plan);
            }
        }
        scala.collection.Iterator<Expression> children = e.children().iterator();
        while (children.hasNext()) {
            refuseCallsIn(children.next());
        }
    }

    /** A call by these name parts is allowed when it names (unqualified, or as system.builtin.name) a built-in
     * function whose class is on the allowlist. */
    private static void refuseUnlessBuiltin(scala.collection.Seq<String> nameParts, boolean table) {
        String shown = nameParts.mkString(".");
        int n = nameParts.size();
        String name = nameParts.apply(n - 1);
        boolean builtinNamespace = n == 1 || (n == 2 && nameParts.apply(0).equalsIgnoreCase("builtin"))
                || (n == 3 && nameParts.apply(0).equalsIgnoreCase("system")
                        && nameParts.apply(1).equalsIgnoreCase("builtin"));
        String className = builtinNamespace ? builtinClass(new FunctionIdentifier(name), table) : null;
        if (className == null) {
            throw refused(shown, "it is not one of Spark's built-in " + (table ? "table " : "") + "functions (a "
                    + "user-defined, temporary or catalog function, whose code is not Spark's)");
        }
        if (!allowedFunctionClasses().contains(className)) {
            String why = refusal(className);
            throw refused(shown, why != null ? why : "its class " + className + " is not on the allowlist");
        }
    }

    /** IDENTIFIER(expr) names a function (or a table or column) that the analyzer works out after this check:
     * what it calls cannot be checked by name, so it is refused. */
    private static UnsupportedOperationException refusedIdentifier(Expression identifier) {
        return refused("IDENTIFIER(" + identifier.sql() + ")", "a name given through IDENTIFIER(...) is known only "
                + "after the guard checked the functions a statement calls; write the name itself");
    }

    private static UnsupportedOperationException refused(String function, String why) {
        return new UnsupportedOperationException("eventlake: read-only: function " + function + " is refused: "
                + why + "; " + FUNCTIONS_WHY);
    }

    /**
     * Refuses an analyzed plan of a person's statement holding a code-invoking expression outside the server's
     * views: a UDF a process registered under a built-in's name in its own session (``eventlake query --engine
     * spark`` runs in the caller's session). Not part of the check rule: that rule sees Spark's and Delta's own
     * plans too, and Delta's log replay runs UDFs of its own.
     */
    public static void refuseCode(LogicalPlan node) {
        if (node instanceof View) {
            return;
        }
        scala.collection.Iterator<Expression> expressions = node.expressions().iterator();
        while (expressions.hasNext()) {
            refuseCodeIn(expressions.next());
        }
        scala.collection.Iterator<LogicalPlan> children = node.children().iterator();
        while (children.hasNext()) {
            refuseCode(children.next());
        }
        scala.collection.Iterator<LogicalPlan> subqueries = node.subqueries().iterator();
        while (subqueries.hasNext()) {
            refuseCode(subqueries.next());
        }
    }

    /** A code-invoking expression anywhere in an analyzed expression (a wrapper that inherits its replacement's
     * analysis, such as try_reflect, has it as its child). */
    private static void refuseCodeIn(Expression e) {
        String why = codeInvoking(e.getClass());
        if (why != null) {
            String name = e instanceof UserDefinedExpression ? ((UserDefinedExpression) e).name() : e.prettyName();
            throw refused(name, why);
        }
        scala.collection.Iterator<Expression> children = e.children().iterator();
        while (children.hasNext()) {
            refuseCodeIn(children.next());
        }
    }

    // -- literals -------------------------------------------------------------------------------------------------

    /**
     * {@code sql} with each single-quoted string literal read as the SQL standard (and DuckDB) reads it, a
     * backslash a character and {@code ''} one quote, and written back in Spark's escaped form ({@code \\} and
     * {@code \'}): Spark then reads the value DuckDB reads. Comments, `identifiers`, "double-quoted" text and raw
     * literals (r'...') are left as they are; an unterminated literal too (Spark's parser says where).
     */
    public static String standardLiterals(String sql) {
        StringBuilder out = new StringBuilder(sql.length() + 16);
        int n = sql.length();
        int i = 0;
        while (i < n) {
            char c = sql.charAt(i);
            int end;
            if (c == '-' && sql.startsWith("--", i)) {
                end = sql.indexOf('\n', i);
                end = end < 0 ? n : end;
            } else if (c == '/' && sql.startsWith("/*", i)) {
                end = i;
                int depth = 0;
                while (end < n) {
                    if (sql.startsWith("/*", end)) {
                        depth++;
                        end += 2;
                    } else if (sql.startsWith("*/", end)) {
                        depth--;
                        end += 2;
                        if (depth == 0) {
                            break;
                        }
                    } else {
                        end++;
                    }
                }
            } else if (c == '`' || c == '"') {
                end = quotedEnd(sql, i, c == '"');
            } else if (Character.isLetterOrDigit(c) || c == '_') {
                end = i;
                while (end < n && (Character.isLetterOrDigit(sql.charAt(end)) || sql.charAt(end) == '_')) {
                    end++;
                }
                if (end - i == 1 && (c == 'r' || c == 'R') && end < n
                        && (sql.charAt(end) == '\'' || sql.charAt(end) == '"')) {
                    int close = sql.indexOf(sql.charAt(end), end + 1); // a raw literal: no escapes at all
                    end = close < 0 ? n : close + 1;
                }
            } else if (c == '\'') {
                StringBuilder value = new StringBuilder();
                int j = i + 1;
                boolean closed = false;
                while (j < n) {
                    char d = sql.charAt(j);
                    if (d == '\'') {
                        if (j + 1 < n && sql.charAt(j + 1) == '\'') {
                            value.append('\'');
                            j += 2;
                            continue;
                        }
                        closed = true;
                        j++;
                        break;
                    }
                    value.append(d);
                    j++;
                }
                if (!closed) {
                    out.append(sql, i, n);
                    break;
                }
                out.append('\'');
                for (int k = 0; k < value.length(); k++) {
                    char d = value.charAt(k);
                    if (d == '\\' || d == '\'') {
                        out.append('\\');
                    }
                    out.append(d);
                }
                out.append('\'');
                i = j;
                continue;
            } else {
                end = i + 1;
            }
            out.append(sql, i, end);
            i = end;
        }
        return out.toString();
    }

    /** The end of a `quoted identifier` (`` inside) or a "double-quoted" text (Spark's escapes inside). */
    private static int quotedEnd(String sql, int start, boolean backslashEscapes) {
        char quote = sql.charAt(start);
        int j = start + 1;
        while (j < sql.length()) {
            char d = sql.charAt(j);
            if (backslashEscapes && d == '\\') {
                j += 2;
            } else if (d == quote) {
                if (j + 1 < sql.length() && sql.charAt(j + 1) == quote) {
                    j += 2;
                } else {
                    return j + 1;
                }
            } else {
                j++;
            }
        }
        return sql.length();
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
