package pessimistic_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// A wait for a held lock that ctx ends is a lost race and the caller's own
// giving up, both: the error matches contend.ErrConflict and ctx's error,
// deadline or cancel, as distlock's waits do, on every driver, for row and
// advisory locks alike.
func TestWaitEndedByCtxIsConflictAndCtxError(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			products(t, db, 1, "p")
			_, pid := hold(t, db, "p")
			l := newLocker(t, h, pessimistic.LockerConfig{})
			key := testserver.RandomName("wait:")
			a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
			require.NoError(t, err)
			holder, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{})
			require.NoError(t, err)
			fnRan := errors.New("fn ran")
			// warm leaves a connection of h's idle in its pool, so that a
			// timed call spends its deadline waiting for the lock, not
			// dialing: a loaded machine has taken over 500ms to connect.
			warm := func() {
				require.NoError(t, a.Do(t.Context(), key+":warm", func(context.Context) error { return nil }))
			}

			warm()
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			err = l.Do(ctx, "p", func(context.Context) error { return fnRan })
			require.ErrorIs(t, err, contend.ErrConflict)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.NotErrorIs(t, err, fnRan)

			// The first wait's session leaves the line once the server has
			// the driver's cancel request, which may still be on its way:
			// the session seen waiting next must be this call's, not one
			// still connecting while that one lingers.
			waitBlocked(t, db, pid, 0)
			ctx, cancel = context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() { errc <- l.Do(ctx, "p", func(context.Context) error { return fnRan }) }()
			waitBlocked(t, db, pid, 1)
			cancel()
			err = <-errc
			require.ErrorIs(t, err, contend.ErrConflict)
			require.ErrorIs(t, err, context.Canceled)

			// pgx closes a connection whose statement ctx cut short, and a
			// ctx that ends while the pool dials ends before any wait (the
			// last case below): warm the pool first.
			require.NoError(t, holder.Do(t.Context(), key, func(context.Context) error {
				warm()
				ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
				defer cancel()
				err := a.Do(ctx, key, func(context.Context) error { return fnRan })
				require.ErrorIs(t, err, contend.ErrConflict)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				return nil
			}))

			// A ctx that ended before the call is the caller's error only:
			// nothing was waited for.
			done, cancel := context.WithCancel(t.Context())
			cancel()
			err = l.Do(done, "p", func(context.Context) error { return fnRan })
			require.ErrorIs(t, err, context.Canceled)
			require.NotErrorIs(t, err, contend.ErrConflict)
		})
	}
}
