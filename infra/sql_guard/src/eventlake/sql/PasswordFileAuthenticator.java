package eventlake.sql;

import java.io.IOException;

import javax.security.sasl.AuthenticationException;

import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The Thrift server's login check (hive.server2.authentication=CUSTOM, hive.server2.custom.authentication.class
 * set to this class): the user must be in the password file ({@link SqlUsers}) and the password must hash to its
 * entry. A refused login is logged with the user name and the reason; an accepted one with the user name.
 * Hive makes a new instance for every login.
 */
public final class PasswordFileAuthenticator implements PasswdAuthenticationProvider {

    // An unknown user costs the same hashing as a known one: the time taken does not tell which names exist.
    private static final SqlUsers.User NOBODY = new SqlUsers.User("", 210_000, new byte[16], new byte[64], null);

    @Override
    public void Authenticate(String user, String password) throws AuthenticationException {
        SqlUsers.User entry;
        try {
            entry = SqlUsers.current().get(user);
        } catch (IOException | RuntimeException e) {
            SqlUsers.log("login refused for user " + SqlUsers.quoted(user) + ": the password file "
                    + SqlUsers.file() + " cannot be read (" + e + ")");
            ServerCounts.login(false);
            throw new AuthenticationException("login refused for user " + user);
        }
        boolean known = entry != null;
        boolean right = SqlUsers.matches(known ? entry : NOBODY, password == null ? "" : password) && known;
        if (!right) {
            SqlUsers.log("login refused for user " + SqlUsers.quoted(user) + ": "
                    + (known ? "wrong password" : "no such user in " + SqlUsers.file()));
            ServerCounts.login(false);
            throw new AuthenticationException("login refused for user " + user);
        }
        SqlUsers.log("login accepted for user " + SqlUsers.quoted(user));
        ServerCounts.login(true);
    }
}
