package atomic_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
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

// take returns the events reported since the last take.
func (r *recorder) take() []contend.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := r.events
	r.events = nil
	return events
}

func kinds(events []contend.Event) []contend.EventKind {
	k := make([]contend.EventKind, len(events))
	for i, e := range events {
		k[i] = e.Kind
	}
	return k
}

func TestClaimerObserver(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			bots(t, db, "bot-1")
			var rec recorder
			cfg := leased
			cfg.Observer = &rec
			c := claimer(t, db, cfg)
			ctx := t.Context()

			// A Do that wins: the claim, then its end, with fn's error.
			boom := errors.New("boom")
			require.ErrorIs(t, c.Do(ctx, "bot-1", func(context.Context) error { return boom }), boom)
			events := rec.take()
			require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventReleased}, kinds(events))
			for _, e := range events {
				require.Equal(t, contend.StrategyAtomic, e.Strategy)
				require.Equal(t, "bot-1", e.Key)
				require.Equal(t, 1, e.Attempts)
				require.Positive(t, e.Wait)
			}
			require.NoError(t, events[0].Err)
			require.Equal(t, events[0].Wait, events[1].Wait, "the end of a hold carries the wait that began it")
			require.Positive(t, events[1].Hold)
			require.ErrorIs(t, events[1].Err, boom)

			// A race lost: the key is claimed, so Do fails fast.
			token, err := c.Claim(ctx, "bot-1")
			require.NoError(t, err)
			err = c.Do(ctx, "bot-1", func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrConflict)
			events = rec.take()
			require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventConflict}, kinds(events))
			require.Equal(t, err, events[1].Err, "a conflict carries the error Do returns")

			released, err := c.Release(ctx, "bot-1", token)
			require.NoError(t, err)
			require.True(t, released)
			events = rec.take()
			require.Equal(t, []contend.EventKind{contend.EventReleased}, kinds(events))
			require.Positive(t, events[0].Hold, "Release knows when Claim made the claim")
			require.NoError(t, events[0].Err)

			// A claim the caller gave up on before it was made.
			gone, cancel := context.WithCancel(ctx)
			cancel()
			_, err = c.Claim(gone, "bot-1")
			require.ErrorIs(t, err, context.Canceled)
			events = rec.take()
			require.Equal(t, []contend.EventKind{contend.EventGaveUp}, kinds(events))
			require.Equal(t, err, events[0].Err)

			// A claim taken over while fn ran: Do's release finds it gone.
			err = c.Do(ctx, "bot-1", func(ctx context.Context) error {
				_, err := db.ExecContext(ctx, `UPDATE bots SET engine_id = 'intruder' WHERE id = 'bot-1'`)
				return err
			})
			require.ErrorIs(t, err, contend.ErrLockLost)
			events = rec.take()
			require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventLost}, kinds(events))
			require.ErrorIs(t, events[1].Err, contend.ErrLockLost)
			require.Positive(t, events[1].Hold)
		})
	}
}
