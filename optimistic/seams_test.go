package optimistic_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
)

// The optimistic guard's fn locks its own row and, inside, takes a Locker
// lock on the other call's row: the server breaks the deadlock by rolling
// one transaction back (InnoDB: the whole of it). The caller ignores the
// nested ErrConflict and goes on writing; the guard must still answer nil
// only when all of fn's writes are committed, and commit none otherwise.
func TestCarelessNestedLockTellsTheTruth(t *testing.T) {
	for _, driver := range []string{testserver.MariaDBDriver, "pgx"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			nested, _ := guardtest.CarelessNesting(t, guardSuite(driver), 20, lockerOnCounters)
			require.Positive(t, nested, "no nested lock failed: the calls never crossed")
		})
	}
}

// A Store built on one connection, one server session, is refused as every
// SQL guard refuses one, with an error that says to pass the pool.
func TestStoreRefusesOneSession(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx", testserver.PgxNative, testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			h := testserver.Handle(t, driver, testserver.URL(t, driver))
			_, err := optimistic.NewStore[account](testserver.Session(t, h), optimistic.Config{Table: "accounts"})
			require.ErrorIs(t, err, contend.ErrInvalid)
			require.ErrorContains(t, err, "pass the pool")
		})
	}
}

// On a server with innodb_rollback_on_timeout, a lock wait that times out
// (1205) inside the guard's fn rolls the whole transaction back, version
// bump included. The caller ignores the failed lock, nested Locker or plain
// statement, and goes on writing: the guard must not answer nil for writes
// the rollback undid, nor commit the writes made after it. It runs fn again
// (a lock wait timeout is worth another attempt), which finds the row free
// and commits all of its own writes.
func TestTimedOutLockTellsTheTruthWhenItRollsBack(t *testing.T) {
	t.Parallel()
	server := testserver.OwnMariaDB(t, "--innodb-rollback-on-timeout=ON", "--innodb-lock-wait-timeout=1")
	for name, nest := range map[string]func(testing.TB, guardtest.Env) contend.Guard{"nested": lockerOnCounters, "plain": nil} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, url, err := testserver.CreateDatabase(t.Context(), server.URL())
			require.NoError(t, err)
			failed := guardtest.TimedOutLock(t, guardSuite(testserver.MariaDBDriver), url, 3, nest)
			require.Zero(t, failed, "the guard did not run fn again after the timeout")
		})
	}
}
