package optimistic_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
)

func kinds(events []contend.Event) []contend.EventKind {
	k := make([]contend.EventKind, len(events))
	for i, e := range events {
		k[i] = e.Kind
	}
	return k
}

// requireEvents checks that events are of the kinds wanted, all of strategy
// "optimistic" and key, and returns them.
func requireEvents(t *testing.T, events []contend.Event, key string, want ...contend.EventKind) []contend.Event {
	t.Helper()
	require.Equal(t, want, kinds(events))
	for _, e := range events {
		require.Equal(t, contend.StrategyOptimistic, e.Strategy)
		require.Equal(t, key, e.Key)
	}
	return events
}

func TestStoreObserver(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			accounts(t, db, "a")
			var obs observed
			s := accountStore(t, db, optimistic.Config{Table: "accounts", Retry: contend.Retry{MaxAttempts: 2, BaseDelay: time.Microsecond}, Observer: &obs})
			other := accountStore(t, db, accountsConfig)
			ctx := t.Context()
			interfere := func(a *account) error {
				// Another writer commits between this attempt's read and write.
				_, err := other.Update(ctx, "a", func(a *account) error { a.Balance--; return nil })
				return err
			}

			// Uncontended: one attempt, committed.
			_, err := s.Update(ctx, "a", func(a *account) error { a.Balance -= 10; return nil })
			require.NoError(t, err)
			e := requireEvents(t, obs.take(), "a", contend.EventReleased)[0]
			require.Equal(t, 1, e.Attempts)
			require.NoError(t, e.Err)
			require.Positive(t, e.Hold)

			// A race lost, then won on the second attempt.
			runs := 0
			_, err = s.Update(ctx, "a", func(a *account) error {
				if runs++; runs == 1 {
					return interfere(a)
				}
				return nil
			})
			require.NoError(t, err)
			events := requireEvents(t, obs.take(), "a", contend.EventRetry, contend.EventReleased)
			require.Equal(t, 1, events[0].Attempts)
			require.ErrorIs(t, events[0].Err, contend.ErrConflict)
			require.Equal(t, 2, events[1].Attempts)
			require.Positive(t, events[1].Wait, "the first attempt is the second's wait")
			require.Positive(t, events[1].Hold)

			// Every attempt lost: the call gives up.
			_, err = s.Update(ctx, "a", interfere)
			require.ErrorIs(t, err, contend.ErrConflict)
			events = requireEvents(t, obs.take(), "a", contend.EventRetry, contend.EventGaveUp)
			require.Equal(t, 2, events[1].Attempts)
			require.Equal(t, err, events[1].Err)

			// In a transaction it does not own, a lost race is a conflict
			// for the owner to retry.
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()
			_, err = s.Update(contend.WithQuerier(ctx, tx), "a", interfere)
			require.ErrorIs(t, err, contend.ErrConflict)
			e = requireEvents(t, obs.take(), "a", contend.EventConflict)[0]
			require.Equal(t, 1, e.Attempts)
			require.Equal(t, err, e.Err)
			require.NoError(t, tx.Rollback())

			// fn's own error ends the call; nothing was written.
			boom := errors.New("boom")
			_, err = s.Update(ctx, "a", func(*account) error { return boom })
			require.Equal(t, boom, err)
			e = requireEvents(t, obs.take(), "a", contend.EventReleased)[0]
			require.Equal(t, boom, e.Err)
		})
	}
}

func TestGuardObserver(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			accounts(t, db, "a")
			var obs observed
			g := guard(t, db, optimistic.Config{Table: "accounts", Observer: &obs})
			ctx := t.Context()
			// bump is a writer that commits while fn runs: fn's transaction
			// has read the version but locked nothing.
			bump := func(ctx context.Context) error {
				_, err := db.ExecContext(ctx, `UPDATE accounts SET version = version + 1 WHERE id = 'a'`)
				return err
			}

			require.NoError(t, g.Do(ctx, "a", withdraw(db, "a", 10)))
			e := requireEvents(t, obs.take(), "a", contend.EventReleased)[0]
			require.Equal(t, 1, e.Attempts)
			require.NoError(t, e.Err)
			require.Positive(t, e.Hold)

			runs := 0
			require.NoError(t, g.Do(ctx, "a", func(ctx context.Context) error {
				if runs++; runs == 1 {
					return bump(ctx)
				}
				return nil
			}))
			events := requireEvents(t, obs.take(), "a", contend.EventRetry, contend.EventReleased)
			require.Equal(t, 1, events[0].Attempts)
			require.ErrorIs(t, events[0].Err, contend.ErrConflict)
			require.Equal(t, 2, events[1].Attempts)
			require.Positive(t, events[1].Wait)
			require.Positive(t, events[1].Hold)

			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()
			err = g.Do(contend.WithQuerier(ctx, tx), "a", bump)
			require.ErrorIs(t, err, contend.ErrConflict)
			e = requireEvents(t, obs.take(), "a", contend.EventConflict)[0]
			require.Equal(t, 1, e.Attempts)
			require.Equal(t, err, e.Err)
		})
	}
}
