package eventlake.sql;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerEvent;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationClosed;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationError;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationFinish;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationStart;

/**
 * The SQL server's query log: one line per JDBC statement with its user (the Thrift server's own events on
 * Spark's listener bus), and one per statement that failed or was refused, with the user and the first line of
 * the reason. Registered by ``eventlake sql-server serve`` with SparkContext.addSparkListener.
 */
public final class QueryLog extends SparkListener {

    private final Map<String, String> users = new HashMap<>();

    @Override
    public void onOtherEvent(SparkListenerEvent event) {
        if (event instanceof SparkListenerThriftServerOperationStart) {
            SparkListenerThriftServerOperationStart start = (SparkListenerThriftServerOperationStart) event;
            users.put(start.id(), start.userName());
            ServerCounts.query();
            SqlUsers.log("query by user " + SqlUsers.quoted(start.userName()) + ": "
                    + SqlUsers.quoted(start.statement()));
        } else if (event instanceof SparkListenerThriftServerOperationError) {
            SparkListenerThriftServerOperationError error = (SparkListenerThriftServerOperationError) event;
            String message = error.errorMsg() == null ? "" : error.errorMsg().strip();
            ServerCounts.error(message);
            int end = message.indexOf('\n');
            SqlUsers.log("query by user " + SqlUsers.quoted(users.remove(error.id())) + " failed: "
                    + SqlUsers.quoted(end < 0 ? message : message.substring(0, end)));
        } else if (event instanceof SparkListenerThriftServerOperationFinish) {
            users.remove(((SparkListenerThriftServerOperationFinish) event).id());
        } else if (event instanceof SparkListenerThriftServerOperationClosed) {
            users.remove(((SparkListenerThriftServerOperationClosed) event).id());
        }
    }
}
