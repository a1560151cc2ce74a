package eventlake.sql;

import java.io.IOException;
import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.CurrentUserContext;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.View;

import scala.Function1;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Per-table grants on the SQL server: a user whose line in the password file ({@link SqlUsers}) lists tables may
 * read only those. A check rule on every analyzed plan of a JDBC statement (the Thrift server sets the statement's
 * user in {@code CurrentUserContext}) refuses a plan that reads any other of the server's views; the name of a
 * view cannot be forged by an alias (it is the view's own, not the query's). Statements without a user (the
 * service's own thread registering the views) and users with "*" are not limited; with logins by password file, a
 * user no longer in the file (removed while a session stayed open) is refused every statement. Enabled with
 * spark.sql.extensions=...,eventlake.sql.GrantsExtension and the users file's system property.
 */
public final class GrantsExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {

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
        return BoxedUnit.UNIT;
    }

    /** Throws UnsupportedOperationException naming the user and the table, unless the user may read it all. */
    public static void check(LogicalPlan plan) {
        String user = CurrentUserContext.CURRENT_USER().get();
        if (user == null || SqlUsers.file() == null) {
            return;
        }
        SqlUsers.User entry;
        try {
            entry = SqlUsers.current().get(user);
        } catch (IOException e) {
            throw new UnsupportedOperationException("eventlake: the grants of user " + user + " cannot be read from "
                    + SqlUsers.file() + ": " + e.getMessage());
        }
        if (entry == null) {
            if ("CUSTOM".equalsIgnoreCase(System.getProperty("hive.server2.authentication"))) {
                // Logins by password file: a user no longer in it (removed while their session stayed open) reads
                // nothing more.
                throw new UnsupportedOperationException("eventlake: user " + user + " is no longer a user of the SQL "
                        + "server (" + SqlUsers.file() + "): statement refused");
            }
            return; // a user who logged in some other way (LDAP) and has no grant in the file: every table
        }
        if (entry.tables == null) {
            return; // every table
        }
        walk(plan, user, entry.tables);
    }

    private static void walk(LogicalPlan node, String user, Set<String> granted) {
        if (node instanceof View) {
            String table = ((View) node).desc().identifier().table().toLowerCase();
            if (!granted.contains(table)) {
                throw new UnsupportedOperationException("eventlake: user " + user + " may not read " + table
                        + ": their grant is " + (granted.isEmpty() ? "no table" : String.join(", ", granted))
                        + " (`eventlake sql-server users add " + user + " --tables ...` changes it)");
            }
            return; // a view's own definition reads its table's files: nothing more to check inside it
        }
        scala.collection.Iterator<LogicalPlan> children = node.children().iterator();
        while (children.hasNext()) {
            walk(children.next(), user, granted);
        }
        scala.collection.Iterator<LogicalPlan> subqueries = node.subqueries().iterator();
        while (subqueries.hasNext()) {
            walk(subqueries.next(), user, granted);
        }
        scala.collection.Iterator<?> inner = node.innerChildren().iterator();
        while (inner.hasNext()) {
            Object child = inner.next();
            if (child instanceof LogicalPlan) {
                walk((LogicalPlan) child, user, granted);
            }
        }
    }
}
