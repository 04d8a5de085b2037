package optimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
)

// An optimistic guard inside a row lock's fn, on the locked row, joins the
// lock's transaction. On a connection of its own, its version check would
// wait for the row lock its own goroutine holds: two connections waiting on
// each other, which the server cannot see as a deadlock, until ctx ends.
func TestGuardInsideARowLockJoinsItsTransaction(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			accounts(t, db, "a")
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "accounts"})
			require.NoError(t, err)
			g, err := optimistic.NewGuard(h, accountsConfig)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()

			err = l.Do(ctx, "a", func(ctx context.Context) error {
				return g.Do(ctx, "a", func(ctx context.Context) error {
					_, err := testserver.Querier(ctx, h).Exec(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 'a'`)
					return err
				})
			})
			require.NoError(t, err)
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 90, Version: 1}, rowOf(t, db, "a"))
		})
	}
}

// Store.Update inside a transaction it does not own makes one attempt: a
// lost race is returned at once for the owner to run its transaction again,
// instead of sleeping between retries while holding the owner's locks.
func TestUpdateInsideACallersTransactionDoesNotRetry(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	var o observed
	s := accountStore(t, db, optimistic.Config{Table: "accounts", Retry: bigBudget, Observer: &o})
	ctx := t.Context()

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	runs := 0
	_, err = s.Update(contend.WithQuerier(ctx, tx), "a", func(a *account) error {
		runs++
		if runs == 1 {
			// Another writer commits while this one decides.
			_, err := db.Exec(`UPDATE accounts SET balance = 50, version = version + 1 WHERE id = 'a'`)
			require.NoError(t, err)
		}
		a.Balance -= 10
		return nil
	})
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, 1, runs, "no retry inside a caller's transaction")
	require.Equal(t, 1, o.last())
}

// A handle the guard cannot tell for a pool or a transaction is refused.
// Taken for a caller's transaction, fn's writes would commit as they ran,
// before the version check failed.
func TestWrappedHandleIsRefused(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	w := txntest.Wrapped{DBTX: db}

	g, err := optimistic.NewGuard(w, optimistic.Config{Table: "accounts", Retry: contend.Retry{MaxAttempts: 1}})
	if err == nil {
		err := g.Do(t.Context(), "a", func(ctx context.Context) error {
			if _, err := contend.Querier(ctx, w).ExecContext(ctx, `UPDATE accounts SET owner = 'fn' WHERE id = 'a'`); err != nil {
				return err
			}
			// Another writer moves the version: this attempt must not commit.
			_, err := db.Exec(`UPDATE accounts SET version = version + 1 WHERE id = 'a'`)
			return err
		})
		require.ErrorIs(t, err, contend.ErrConflict)
		require.Equal(t, "ann", rowOf(t, db, "a").Owner, "fn's write committed although Do reported a conflict")
	}
	require.ErrorIs(t, err, contend.ErrInvalid)

	_, err = optimistic.NewStore[account](w, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = optimistic.NewGuard(db, optimistic.Config{Table: "accounts", FinishTimeout: -time.Second})
	require.ErrorIs(t, err, contend.ErrInvalid, "negative finish timeout")
}
