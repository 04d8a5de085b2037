package pessimistic_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/pessimistic"
)

// lockerOnCounters is a Locker on the conformance suite's counter rows.
func lockerOnCounters(t testing.TB, env guardtest.Env) contend.Guard {
	l, err := pessimistic.NewLocker(env.Handle, pessimistic.LockerConfig{Table: "guardtest_counters", KeyColumn: "key"})
	require.NoError(t, err)
	return l
}

// Two Locker calls each lock their own row and, inside, a Locker lock on
// the other's: the server breaks the deadlock by rolling one transaction
// back (InnoDB: the whole of it, the outer lock included). The caller
// ignores the nested ErrConflict and goes on writing; the outer call must
// still answer nil only when all of its writes are committed, and commit
// none of them otherwise.
func TestCarelessNestedLockTellsTheTruth(t *testing.T) {
	for _, driver := range []string{testserver.MariaDBDriver, "postgres", testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			s := guardtest.Suite{
				Driver: driver,
				Setup: func(t testing.TB, env guardtest.Env, keys []string) {
					if driver == testserver.MariaDBDriver {
						mariaRows(t, env.DB, "locks", keys...)
						return
					}
					lockRows(t, env, keys)
				},
				NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
					return pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "locks"})
				},
			}
			nested, _ := guardtest.CarelessNesting(t, s, 20, lockerOnCounters)
			require.Positive(t, nested, "no nested lock failed: the calls never crossed")
		})
	}
}

// A Locker on one database nested in the fn of a Locker on another cannot
// join the outer transaction, which runs on the other database: it is
// refused, and takes no lock in the wrong place.
func TestNestedOnAnotherDatabaseIsRefused(t *testing.T) {
	for _, driver := range []string{testserver.MariaDBDriver, "postgres", testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			open := func() contend.Guard {
				u := testserver.URL(t, driver)
				db := testserver.Open(t, driver, u)
				if driver == testserver.MariaDBDriver {
					mariaRows(t, db, "locks", "k")
				} else {
					lockRows(t, guardtest.Env{DB: db}, []string{"k"})
				}
				l, err := pessimistic.NewLocker(testserver.Handle(t, driver, u), pessimistic.LockerConfig{Table: "locks"})
				require.NoError(t, err)
				return l
			}
			outer, other := open(), open()
			ran := false
			err := outer.Do(t.Context(), "k", func(ctx context.Context) error {
				return other.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
			})
			require.ErrorIs(t, err, contend.ErrInvalid)
			require.False(t, ran, "the nested fn ran in a transaction of another database")
		})
	}
}

// A Locker on a caller's transaction whose lock the server answers with a
// deadlock, rolling the caller's whole transaction back (InnoDB), answers
// ErrConflict as for any lost race, and leaves the transaction dead: the
// caller's later statements and its COMMIT fail, rather than run alone in
// autocommit and report success for writes the rollback undid.
func TestDeadTransactionStaysDeadOnMariaDB(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testserver.Open(t, testserver.MariaDBDriver, testserver.MariaDB(t))
	db.SetMaxOpenConns(3) // the other transaction's, the caller's, and the test's
	mariaRows(t, db, "locks", "a", "b")
	_, err := db.Exec("CREATE TABLE ballast (n int)")
	require.NoError(t, err)

	// The other transaction holds b and has written more than the
	// caller's, so that InnoDB picks the caller's as the deadlock's victim.
	other, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer other.Rollback()
	_, err = other.Exec("UPDATE locks SET n = n + 1 WHERE id = 'b'")
	require.NoError(t, err)
	_, err = other.Exec("INSERT INTO ballast (n) SELECT seq FROM seq_1_to_100")
	require.NoError(t, err)
	var otherID int64
	require.NoError(t, other.Get(&otherID, "SELECT CONNECTION_ID()"))

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec("UPDATE locks SET n = n + 1 WHERE id = 'a'")
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() {
		_, err := other.Exec("UPDATE locks SET n = n + 1 WHERE id = 'a'")
		waiting <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		// The server's other tests wait for their own locks: only this
		// session's wait counts.
		return db.Get(&n, "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = ?", otherID) == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the other transaction never waited for a")

	l, err := pessimistic.NewLocker(mysqldb.Wrap(tx), pessimistic.LockerConfig{Table: "locks", LockTimeout: 3 * time.Second})
	require.NoError(t, err)
	ran := false
	err = l.Do(ctx, "b", func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, contend.ErrConflict)
	require.False(t, ran)
	require.NoError(t, <-waiting, "the other transaction won")
	require.NoError(t, other.Commit())

	_, err = contend.Querier(ctx, tx).ExecContext(ctx, "UPDATE locks SET n = n + 10 WHERE id = 'a'")
	require.ErrorIs(t, err, sql.ErrTxDone, "a statement after the rollback ran outside any transaction")
	require.ErrorIs(t, tx.Commit(), sql.ErrTxDone, "the rolled-back transaction committed")
	var a int
	require.NoError(t, db.Get(&a, "SELECT n FROM locks WHERE id = 'a'"))
	require.Equal(t, 1, a, "only the other transaction's write to a stays")

	// The lock timeout, a setting of the session, was put back on the
	// caller's connection although its transaction died.
	for range 3 {
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		defer c.Close()
		var timeout int
		require.NoError(t, c.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&timeout))
		require.Equal(t, 50, timeout, "a connection went back to the pool with the locker's lock timeout")
	}
}
