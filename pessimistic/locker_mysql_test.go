package pessimistic_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/pessimistic"
)

// The tests of this file run the row Locker's lock timeout and retries on
// MariaDB.

// mariaHold locks key's row of table in a transaction of the test's own, as
// another process would, until t ends or the test rolls it back.
func mariaHold(t testing.TB, db *sqlx.DB, table, key string) *sqlx.Tx {
	t.Helper()
	tx, err := db.Beginx()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var one int
	require.NoError(t, tx.Get(&one, "SELECT 1 FROM "+table+" WHERE id = ? FOR UPDATE", key))
	return tx
}

// withParam returns rawURL with a session variable its connections set.
func withParam(t testing.TB, rawURL, name, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// A wait that outlasts LockerConfig.LockTimeout ends with MariaDB's lock wait
// timeout (1205): a lost race, not the caller's ctx, in a transaction of
// the locker's and in the caller's alike.
func TestLockTimeoutOnMariaDB(t *testing.T) {
	t.Parallel()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	mariaRows(t, h.DB, "jobs", "a")
	mariaHold(t, h.DB, "jobs", "a")
	cfg := pessimistic.LockerConfig{Table: "jobs", LockTimeout: 300 * time.Millisecond}
	l, err := pessimistic.NewLocker(h, cfg)
	require.NoError(t, err)
	fnRan := errors.New("fn ran")

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = l.Do(ctx, "a", func(context.Context) error { return fnRan })
	require.ErrorIs(t, err, contend.ErrConflict)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, fnRan)
	require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err))
	require.ErrorContains(t, err, "lock timeout of 1s", "MySQL counts the timeout in whole seconds, rounded up")

	tx, err := h.DB.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	inTx, err := pessimistic.NewLocker(mysqldb.Wrap(tx), cfg)
	require.NoError(t, err)
	err = inTx.Do(ctx, "a", func(context.Context) error { return fnRan })
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err))
	var timeout int
	require.NoError(t, tx.Get(&timeout, "SELECT @@SESSION.innodb_lock_wait_timeout"))
	require.Equal(t, 50, timeout, "the caller's setting is put back")
}

// innodb_lock_wait_timeout belongs to the session, which goes back to the
// pool with the connection: the locker puts the pool's own setting back
// after every lock, had, timed out, given up by ctx, or held under NOWAIT,
// and leaves no variable of its own behind.
func TestLockTimeoutLeavesThePoolAsItWasOnMariaDB(t *testing.T) {
	t.Parallel()
	rawURL := testserver.MariaDB(t)
	// The pool's sessions start with a setting of their own, which a
	// restore to the server's default would lose.
	h := testserver.Handle(t, testserver.MariaDBDriver, withParam(t, rawURL, "innodb_lock_wait_timeout", "7")).(testserver.MariaDBHandle)
	h.DB.SetMaxOpenConns(1)
	other := testserver.Open(t, testserver.MariaDBDriver, rawURL)
	mariaRows(t, other, "jobs", "free", "held")
	mariaHold(t, other, "jobs", "held")
	wait, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "jobs", LockTimeout: time.Second})
	require.NoError(t, err)
	nowait, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "jobs", OnHeld: pessimistic.NoWait, LockTimeout: time.Second})
	require.NoError(t, err)
	noop := func(context.Context) error { return nil }

	cases := []struct {
		name string
		call func(ctx context.Context) error
		want error
	}{
		{"had", func(ctx context.Context) error { return wait.Do(ctx, "free", noop) }, nil},
		{"timed out", func(ctx context.Context) error { return wait.Do(ctx, "held", noop) }, contend.ErrConflict},
		{"nowait", func(ctx context.Context) error { return nowait.Do(ctx, "held", noop) }, contend.ErrConflict},
		{"ctx ended", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			return wait.Do(ctx, "held", noop)
		}, context.DeadlineExceeded},
		{"fn failed", func(ctx context.Context) error {
			return wait.Do(ctx, "free", func(context.Context) error { return errors.New("fn failed") })
		}, nil},
	}
	for _, c := range cases {
		err := c.call(t.Context())
		if c.want != nil {
			require.ErrorIs(t, err, c.want, c.name)
		} else if c.name == "had" {
			require.NoError(t, err, c.name)
		}
		var (
			timeout int
			saved   *int
		)
		require.NoError(t, h.DB.QueryRow("SELECT @@SESSION.innodb_lock_wait_timeout, @contend_lock_wait_timeout").Scan(&timeout, &saved), c.name)
		require.Equal(t, 7, timeout, "%s: the pooled session kept the locker's lock timeout", c.name)
		require.Nil(t, saved, "%s: the locker left its variable behind", c.name)
	}
}

// Two callers lock rows a and b in opposite orders with nested locks: a
// certain deadlock, which MariaDB breaks by failing one of them (1213). The
// locker owns the transaction, so it rolls the victim back and runs it
// again: both finish, and each row is changed once per caller.
func TestOppositeOrderDeadlockIsRetriedOnMariaDB(t *testing.T) {
	t.Parallel()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	mariaRows(t, h.DB, "pair", "a", "b")
	l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "pair"})
	require.NoError(t, err)
	runs := transferBothWays(t, l, func(ctx context.Context, tx contend.DBTX, key string) error {
		_, err := tx.ExecContext(ctx, "UPDATE pair SET n = n + 1 WHERE id = ?", key)
		return err
	})
	require.GreaterOrEqual(t, runs, int32(3), "no deadlock victim ran again")
	var n []int
	require.NoError(t, h.DB.Select(&n, "SELECT n FROM pair ORDER BY id"))
	require.Equal(t, []int{2, 2}, n, "the victim's first run left nothing behind")
}

// Inside a caller's transaction the locker cannot run the victim again:
// the deadlock comes back as a lost race, MariaDB's error reachable.
func TestDeadlockInACallersTransactionIsReturnedOnMariaDB(t *testing.T) {
	t.Parallel()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	mariaRows(t, h.DB, "pair", "a", "b")
	first := deadlockInCallersTx(t, h.DB, func(tx *sqlx.Tx) (*pessimistic.Locker, error) {
		return pessimistic.NewLocker(mysqldb.Wrap(tx), pessimistic.LockerConfig{Table: "pair"})
	})
	require.ErrorIs(t, first, contend.ErrConflict)
	require.Equal(t, sqlerr.DeadlockDetected, sqlerr.Code(first))
	n, ok := sqlerr.MySQLNumber(first)
	require.True(t, ok)
	require.EqualValues(t, sqlerr.MySQLDeadlock, n)
}

func TestRowLockUnderFaultsOnMariaDB(t *testing.T) {
	t.Parallel()
	txntest.RunOnMariaDB(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		l, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: txntest.Table, FinishTimeout: finish})
		require.NoError(t, err)
		return guardOp(l, db)
	}})
}
