package pessimistic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// recorder is an Observer that keeps every event, for the test to read.
type recorder struct {
	mu     sync.Mutex
	events []contend.Event // protected by mu
}

func (r *recorder) Observe(_ context.Context, e contend.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// take returns the events reported since the last take, after checking
// that they are of the kinds wanted, all of strategy "pessimistic" and key.
func (r *recorder) take(t *testing.T, key string, want ...contend.EventKind) []contend.Event {
	t.Helper()
	r.mu.Lock()
	events := r.events
	r.events = nil
	r.mu.Unlock()
	got := make([]contend.EventKind, len(events))
	for i, e := range events {
		got[i] = e.Kind
		require.Equal(t, contend.StrategyPessimistic, e.Strategy)
		require.Equal(t, key, e.Key)
	}
	require.Equal(t, want, got)
	return events
}

// serializationFailure is what a driver returns for SQLSTATE 40001.
type serializationFailure struct{}

func (serializationFailure) Error() string    { return "could not serialize access" }
func (serializationFailure) SQLState() string { return "40001" }

func TestLockerObserver(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			products(t, db, 10, "p")
			var rec recorder
			l := newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait, Observer: &rec, Retry: contend.Retry{BaseDelay: time.Microsecond}})
			ctx := t.Context()

			// The lock had, then the transaction's end.
			require.NoError(t, l.Do(ctx, "p", func(ctx context.Context) error { return sell(ctx, contend.Querier(ctx, nil), "p") }))
			events := rec.take(t, "p", contend.EventObtained, contend.EventReleased)
			require.Equal(t, 1, events[0].Attempts)
			require.Positive(t, events[0].Wait)
			require.Equal(t, events[0].Wait, events[1].Wait)
			require.Positive(t, events[1].Hold)
			require.NoError(t, events[1].Err)

			// A serialization failure runs the transaction again.
			runs := 0
			require.NoError(t, l.Do(ctx, "p", func(context.Context) error {
				if runs++; runs == 1 {
					return serializationFailure{}
				}
				return nil
			}))
			events = rec.take(t, "p", contend.EventObtained, contend.EventReleased,
				contend.EventRetry, contend.EventObtained, contend.EventReleased)
			require.ErrorIs(t, events[1].Err, serializationFailure{})
			require.Equal(t, 1, events[2].Attempts)
			require.ErrorIs(t, events[2].Err, serializationFailure{})
			require.Equal(t, 2, events[3].Attempts)
			require.Equal(t, 2, events[4].Attempts)
			require.NoError(t, events[4].Err)

			// A race lost: NOWAIT finds the row held.
			holder, _ := hold(t, db, "p")
			err := l.Do(ctx, "p", func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrConflict)
			e := rec.take(t, "p", contend.EventConflict)[0]
			require.Equal(t, err, e.Err)

			// A wait that the lock timeout ends.
			waiter := newLocker(t, db, pessimistic.LockerConfig{LockTimeout: 20 * time.Millisecond, Observer: &rec})
			err = waiter.Do(ctx, "p", func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrConflict)
			e = rec.take(t, "p", contend.EventGaveUp)[0]
			require.Equal(t, err, e.Err)
			require.GreaterOrEqual(t, e.Wait, 20*time.Millisecond)
			require.NoError(t, holder.Rollback())

			// A missing row is no race.
			err = l.Do(ctx, "ghost", func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
			rec.take(t, "ghost", contend.EventFailed)
		})
	}
}

func TestAdvisoryObserver(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	var rec recorder
	a := advisory(t, db, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait, Observer: &rec})
	ctx := t.Context()

	require.NoError(t, a.Do(ctx, "k", func(context.Context) error { return nil }))
	rec.take(t, "k", contend.EventObtained, contend.EventReleased)

	holder, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	_, err = holder.Exec(`SELECT pg_advisory_xact_lock(hashtextextended('k', 0))`)
	require.NoError(t, err)
	err = a.Do(ctx, "k", func(context.Context) error { return nil })
	require.ErrorIs(t, err, contend.ErrConflict)
	e := rec.take(t, "k", contend.EventConflict)[0]
	require.Equal(t, err, e.Err)
}
