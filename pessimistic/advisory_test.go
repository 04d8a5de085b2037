package pessimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

func advisory(t testing.TB, db contend.DBTX, cfg pessimistic.AdvisoryConfig) *pessimistic.Advisory {
	t.Helper()
	a, err := pessimistic.NewAdvisory(db, cfg)
	require.NoError(t, err)
	return a
}

// The lock id is the server's hashtextextended(key, 0), so a client in any
// language that uses the same expression excludes and is excluded by the
// guard: this test plays that other client in plain SQL.
func TestAdvisoryAgreesWithPlainSQL(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			try := advisory(t, db, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait})
			ctx := t.Context()
			key := testserver.RandomName("report:2024-06:")
			plainTry := func() bool {
				tx, err := db.Beginx()
				require.NoError(t, err)
				defer tx.Rollback()
				var got bool
				require.NoError(t, tx.Get(&got, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, key))
				return got
			}

			require.NoError(t, try.Do(ctx, key, func(context.Context) error {
				require.False(t, plainTry(), "the guard holds the id plain SQL computes")
				return nil
			}))
			require.True(t, plainTry(), "released at commit")

			tx, err := db.Beginx()
			require.NoError(t, err)
			defer tx.Rollback()
			_, err = tx.Exec(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key)
			require.NoError(t, err)
			err = try.Do(ctx, key, func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrConflict)
			require.ErrorContains(t, err, key)
			require.NoError(t, try.Do(ctx, key+"-other", func(context.Context) error { return nil }), "other keys are free")
			require.NoError(t, tx.Rollback())
			require.NoError(t, try.Do(ctx, key, func(context.Context) error { return nil }))
		})
	}
}

// A waiting advisory guard honours the lock timeout and ctx like a row
// locker, and its fn runs in the transaction that holds the lock.
func TestAdvisoryWaits(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	_, err := db.Exec(`CREATE TABLE runs (period text)`)
	require.NoError(t, err)
	a := advisory(t, db, pessimistic.AdvisoryConfig{LockTimeout: 100 * time.Millisecond})
	ctx := t.Context()
	key := testserver.RandomName("report:")

	require.NoError(t, a.Do(ctx, key, func(ctx context.Context) error {
		err := a.Do(t.Context(), key, func(context.Context) error { return nil })
		require.ErrorIs(t, err, contend.ErrConflict, "the lock timeout ends the wait")
		require.ErrorContains(t, err, "lock timeout")

		// Long enough that a loaded machine reaches the wait before the
		// deadline: a ctx that ends sooner (in BEGIN, say) is only ctx's
		// error, no conflict.
		short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		err = advisory(t, db, pessimistic.AdvisoryConfig{}).Do(short, key, func(context.Context) error { return nil })
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, contend.ErrConflict)

		// Reentrant within the transaction: a nested call joins it.
		require.NoError(t, a.Do(ctx, key, func(ctx context.Context) error {
			_, err := contend.Querier(ctx, db).ExecContext(ctx, `INSERT INTO runs VALUES ('2024-06')`)
			return err
		}))
		return nil
	}))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, n)
}

// The advisory lock dies with its connection too.
func TestAdvisoryKilledHolderReleases(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	a := advisory(t, db, pessimistic.AdvisoryConfig{})
	try := advisory(t, db, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait})
	ctx := t.Context()
	key := testserver.RandomName("k:")
	holding, release := make(chan int, 1), make(chan struct{})
	holderErr := make(chan error, 1)
	go func() {
		holderErr <- a.Do(ctx, key, func(ctx context.Context) error {
			tx := contend.Querier(ctx, nil)
			var pid int
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			holding <- pid
			<-release
			_, err := tx.ExecContext(ctx, `SELECT 1`)
			return err
		})
	}()
	var pid int
	select {
	case pid = <-holding:
	case err := <-holderErr:
		t.Fatalf("holder did not get in: %v", err)
	}
	require.ErrorIs(t, try.Do(ctx, key, func(context.Context) error { return nil }), contend.ErrConflict)
	_, err := db.Exec(`SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	// pg_terminate_backend returns before the backend is gone; its locks go
	// with it, at once.
	require.Eventually(t, func() bool {
		return try.Do(ctx, key, func(context.Context) error { return nil }) == nil
	}, 5*time.Second, 5*time.Millisecond)
	close(release)
	require.Error(t, <-holderErr)
}
