package atomic_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// A claim inside a row lock's fn, on the locked row, joins the lock's
// transaction. On a connection of its own, the claim's UPDATE would wait for
// the row lock its own goroutine holds, invisible to the server's deadlock
// detector, until ctx ends.
func TestClaimInsideARowLockJoinsItsTransaction(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			bots(t, db, "b")
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "bots"})
			require.NoError(t, err)
			c := claimer(t, h, leased)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()

			ran := false
			err = l.Do(ctx, "b", func(ctx context.Context) error {
				return c.Do(ctx, "b", func(ctx context.Context) error {
					ran = true
					return nil
				})
			})
			require.NoError(t, err)
			require.True(t, ran)
			require.Nil(t, ownerOf(t, db, "b"), "released")
		})
	}
}

// A nil fn is refused before anything is claimed.
func TestDoRefusesNilFn(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	bots(t, db, "b")
	c := claimer(t, db, plain)
	var err error
	require.NotPanics(t, func() { err = c.Do(t.Context(), "b", nil) })
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.Nil(t, ownerOf(t, db, "b"), "nothing claimed")
}

// A typed nil pool is refused, not a panic.
func TestTypedNilDBIsRefused(t *testing.T) {
	t.Parallel()
	var db *sql.DB
	require.NotPanics(t, func() {
		_, err := atomic.Update(t.Context(), db, decrement, "p")
		require.ErrorIs(t, err, contend.ErrInvalid)
		_, err = atomic.UpdateReturning(t.Context(), db, nil, decrement, "p")
		require.ErrorIs(t, err, contend.ErrInvalid)
		_, err = atomic.NewClaimer(db, plain)
		require.ErrorIs(t, err, contend.ErrInvalid)
	})
}
