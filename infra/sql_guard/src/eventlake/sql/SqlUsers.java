package eventlake.sql;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.spec.InvalidKeySpecException;
import java.time.Instant;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.Map;
import java.util.Set;

import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;

/**
 * The SQL server's users: the password file ``eventlake sql-server users`` writes (one user a line:
 * {@code name:pbkdf2-sha512:iterations:salt:hash:tables}, salt and hash in base64, tables "*" or a comma list of
 * the read models the user may read). Its path is the system property {@value #FILE_PROPERTY}. The file is read
 * again whenever it changes, so a user added or removed counts from the next login, with no restart.
 */
public final class SqlUsers {

    public static final String FILE_PROPERTY = "eventlake.sql.users.file";
    public static final String AUDIT_PROPERTY = "eventlake.sql.audit.log";
    static final String SCHEME = "pbkdf2-sha512";

    /** One line of the file. {@code tables} is null when the user may read every table. */
    static final class User {
        final String name;
        final int iterations;
        final byte[] salt;
        final byte[] hash;
        final Set<String> tables;

        User(String name, int iterations, byte[] salt, byte[] hash, Set<String> tables) {
            this.name = name;
            this.iterations = iterations;
            this.salt = salt;
            this.hash = hash;
            this.tables = tables;
        }
    }

    private static Map<String, User> users = Collections.emptyMap();
    private static Object stamp = null;

    private SqlUsers() {
    }

    static Path file() {
        String path = System.getProperty(FILE_PROPERTY);
        return path == null || path.isEmpty() ? null : Paths.get(path);
    }

    /** The users as the file says now (an empty map when there is no file). */
    static synchronized Map<String, User> current() throws IOException {
        Path path = file();
        if (path == null || !Files.exists(path)) {
            users = Collections.emptyMap();
            stamp = null;
            return users;
        }
        BasicFileAttributes attributes = Files.readAttributes(path, BasicFileAttributes.class);
        String now = attributes.lastModifiedTime().toMillis() + "/" + attributes.size() + "/"
                + attributes.fileKey();
        if (!now.equals(stamp)) {
            users = parse(path);
            stamp = now;
        }
        return users;
    }

    private static Map<String, User> parse(Path path) throws IOException {
        Map<String, User> parsed = new HashMap<>();
        int number = 0;
        for (String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
            number++;
            line = line.strip();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String[] f = line.split(":", -1);
            if (f.length != 6 || !SCHEME.equals(f[1])) {
                log("ignoring line " + number + " of " + path + ": not name:" + SCHEME
                        + ":iterations:salt:hash:tables");
                continue;
            }
            try {
                Set<String> tables = null;
                if (!"*".equals(f[5])) {
                    tables = new LinkedHashSet<>();
                    for (String table : f[5].split(",")) {
                        if (!table.isBlank()) {
                            tables.add(table.strip().toLowerCase());
                        }
                    }
                }
                Base64.Decoder b64 = Base64.getDecoder();
                parsed.put(f[0], new User(f[0], Integer.parseInt(f[2]), b64.decode(f[3]), b64.decode(f[4]),
                        tables));
            } catch (IllegalArgumentException e) {
                log("ignoring line " + number + " of " + path + ": " + e.getMessage());
            }
        }
        return parsed;
    }

    /** PBKDF2-HMAC-SHA512 of the password: what Python's hashlib.pbkdf2_hmac("sha512", ...) gives. */
    static byte[] derive(String password, byte[] salt, int iterations, int bytes) {
        try {
            PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, iterations, bytes * 8);
            try {
                return SecretKeyFactory.getInstance("PBKDF2WithHmacSHA512").generateSecret(spec).getEncoded();
            } finally {
                spec.clearPassword();
            }
        } catch (NoSuchAlgorithmException | InvalidKeySpecException e) {
            throw new IllegalStateException("PBKDF2WithHmacSHA512 is not available in this JVM", e);
        }
    }

    static boolean matches(User user, String password) {
        return MessageDigest.isEqual(derive(password, user.salt, user.iterations, user.hash.length), user.hash);
    }

    /**
     * One line in the server's audit log (the file named by the system property {@value #AUDIT_PROPERTY}) and
     * on stderr (the server's JVM log).
     */
    static synchronized void log(String message) {
        String line = Instant.now() + " eventlake-sql: " + message;
        System.err.println(line);
        System.err.flush();
        String audit = System.getProperty(AUDIT_PROPERTY);
        if (audit != null && !audit.isEmpty()) {
            try {
                Files.writeString(Paths.get(audit), line + "\n", StandardCharsets.UTF_8, StandardOpenOption.CREATE,
                        StandardOpenOption.APPEND, StandardOpenOption.WRITE);
            } catch (IOException e) {
                System.err.println(Instant.now() + " eventlake-sql: cannot write the audit log " + audit + ": " + e);
            }
        }
    }

    /** A user name or statement on one log line, quoted. */
    static String quoted(String text) {
        return text == null ? "(none)" : "'" + text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
                .replace("'", "\\'") + "'";
    }
}
