package eventlake.sql;

import java.util.concurrent.atomic.AtomicLong;

/**
 * What the SQL server has done since it started, for its Prometheus metrics (read by ``eventlake sql-server serve``
 * through py4j at each scrape): statements received, statements refused by eventlake's guards (read-only, grants:
 * their messages start "eventlake: "), statements failed otherwise, logins accepted and refused.
 */
public final class ServerCounts {

    private static final AtomicLong QUERIES = new AtomicLong();
    private static final AtomicLong REFUSED = new AtomicLong();
    private static final AtomicLong FAILED = new AtomicLong();
    private static final AtomicLong LOGINS_ACCEPTED = new AtomicLong();
    private static final AtomicLong LOGINS_REFUSED = new AtomicLong();

    private ServerCounts() {
    }

    static void query() {
        QUERIES.incrementAndGet();
    }

    /** A statement that ended in an error: refused by a guard when its message says so, else failed. */
    static void error(String message) {
        (message != null && message.contains("eventlake: ") ? REFUSED : FAILED).incrementAndGet();
    }

    static void login(boolean accepted) {
        (accepted ? LOGINS_ACCEPTED : LOGINS_REFUSED).incrementAndGet();
    }

    /** [queries, refused, failed, logins accepted, logins refused]. */
    public static long[] counts() {
        return new long[] {QUERIES.get(), REFUSED.get(), FAILED.get(), LOGINS_ACCEPTED.get(), LOGINS_REFUSED.get()};
    }
}
