package txn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func setup(t *testing.T) *sqlx.DB {
	db := testserver.DB(t, "pgx")
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, n int NOT NULL); INSERT INTO t VALUES (1, 0)`)
	require.NoError(t, err)
	return db
}

func value(t *testing.T, db *sqlx.DB) int {
	var n int
	require.NoError(t, db.Get(&n, `SELECT n FROM t WHERE id = 1`))
	return n
}

func bump(ctx context.Context, tx contend.DBTX) error {
	_, err := tx.ExecContext(ctx, `UPDATE t SET n = n + 1 WHERE id = 1`)
	return err
}

func TestCommitsOnSuccess(t *testing.T) {
	t.Parallel()
	db := setup(t)
	n, err := txn.Run(t.Context(), db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
		require.Same(t, tx, contend.Querier(ctx, db), "fn reaches its transaction through ctx too")
		return bump(ctx, tx)
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, value(t, db))
}

func TestRollsBackOnErrorAndPanic(t *testing.T) {
	t.Parallel()
	db := setup(t)
	boom := errors.New("boom")
	_, err := txn.Run(t.Context(), db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
		require.NoError(t, bump(ctx, tx))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Panics(t, func() {
		_, _ = txn.Run(t.Context(), db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
			require.NoError(t, bump(ctx, tx))
			panic("boom")
		})
	})
	require.Equal(t, 0, value(t, db))
	// Nothing stays locked: a NOWAIT lock succeeds at once.
	_, err = db.Exec(`SELECT * FROM t WHERE id = 1 FOR UPDATE NOWAIT`)
	require.NoError(t, err)
}

type sqlState string

func (s sqlState) Error() string    { return "sqlstate " + string(s) }
func (s sqlState) SQLState() string { return string(s) }

func TestRetriesDeadlockVictimsFromTheStart(t *testing.T) {
	t.Parallel()
	db := setup(t)
	calls := 0
	n, err := txn.Run(t.Context(), db, txn.Options{Retry: contend.Retry{BaseDelay: time.Microsecond}},
		func(ctx context.Context, tx contend.DBTX) error {
			calls++
			if err := bump(ctx, tx); err != nil {
				return err
			}
			if calls < 3 {
				return sqlState("40P01") // as the server reports a deadlock victim
			}
			return nil
		})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 1, value(t, db), "the failed attempts were rolled back")

	_, err = txn.Run(t.Context(), db, txn.Options{Retry: contend.Retry{MaxAttempts: 2, BaseDelay: time.Microsecond}},
		func(context.Context, contend.DBTX) error { return sqlState("23505") })
	var state sqlState
	require.ErrorAs(t, err, &state)
	require.Equal(t, sqlState("23505"), state, "other errors are not retried")
}

func TestInsideCallersTransaction(t *testing.T) {
	t.Parallel()
	db := setup(t)
	tx, err := db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	n, err := txn.Run(t.Context(), tx, txn.Options{}, bump)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// Run neither committed nor rolled back: the caller's transaction goes on.
	require.NoError(t, bump(t.Context(), tx))
	require.NoError(t, tx.Rollback())
	require.Equal(t, 0, value(t, db))

	tx, err = db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = txn.Run(t.Context(), tx, txn.Options{}, func(context.Context, contend.DBTX) error { return sqlState("40P01") })
	var state sqlState
	require.ErrorAs(t, err, &state)
	require.Equal(t, sqlState("40P01"), state, "inside a caller's transaction the caller retries")
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	_, err := txn.Run(t.Context(), nil, txn.Options{}, bump)
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = txn.Run(t.Context(), setup(t), txn.Options{}, nil)
	require.ErrorIs(t, err, contend.ErrInvalid)
}

// A transaction whose ctx ends while fn runs is rolled back before Run
// returns, locks and all: the caller can take the lock again at once, on
// both drivers. (database/sql's own rollback of a cancelled transaction
// runs on a goroutine of its own and let Run return first.)
func TestCancelledTransactionLetsGoBeforeReturning(t *testing.T) {
	t.Parallel()
	for lock, driver := range []string{"pgx", "postgres"} {
		// Advisory locks are the whole database's: one per subtest.
		lock += 4200
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, n int NOT NULL); INSERT INTO t VALUES (1, 0)`)
			require.NoError(t, err)
			for i := range 50 {
				ctx, cancel := context.WithCancel(t.Context())
				_, err := txn.Run(ctx, db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
					if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lock); err != nil {
						return err
					}
					require.NoError(t, bump(ctx, tx))
					cancel()
					<-ctx.Done()
					return nil // fn succeeded, but its ctx ended: no commit
				})
				require.ErrorIs(t, err, context.Canceled)
				var free bool
				require.NoError(t, db.Get(&free, `SELECT pg_try_advisory_lock($1)`, lock))
				require.True(t, free, "round %d: the lock was still held after Run returned", i)
				_, err = db.Exec(`SELECT pg_advisory_unlock_all()`)
				require.NoError(t, err)
			}
			require.Zero(t, value(t, db), "a transaction whose ctx ended committed")
		})
	}
}
