package adaptive_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// A key starts optimistic, goes under the lock when it turns hot, stays there
// while it is hot, and goes back once it cools, though not at the first quiet
// call.
func TestModeFollowsConflicts(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	counters(t, db, "k")
	g := newGuard(t, db, adaptive.Config{Retry: bigBudget})
	ctx := t.Context()
	calls := 0

	// Cold: one caller never loses a race.
	for range 50 {
		require.NoError(t, g.Do(ctx, "k", increment(db, "k", 0)))
		require.Equal(t, adaptive.Optimistic, g.Mode("k"))
	}
	calls += 50

	// Hot: 16 callers at once, each read-modify-write long enough for the
	// others to race it.
	const hot = 16
	ops := make([]int, hot)
	workload.Each(t, hot, func(i int) error {
		for ; ops[i] < 100 && g.Mode("k") == adaptive.Optimistic; ops[i]++ {
			if err := g.Do(ctx, "k", increment(db, "k", time.Millisecond)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, n := range ops {
		calls += n
	}
	require.Equal(t, adaptive.Pessimistic, g.Mode("k"), "a hot key goes under the lock")

	// Still hot: the callers wait for the lock, which keeps the key there.
	workload.Each(t, hot, func(int) error {
		for range 10 {
			if err := g.Do(ctx, "k", increment(db, "k", time.Millisecond)); err != nil {
				return err
			}
		}
		return nil
	})
	calls += hot * 10
	require.Equal(t, adaptive.Pessimistic, g.Mode("k"), "a key that stays hot stays locked")

	// Cooled: one caller. A few quiet calls do not move it back…
	for range 5 {
		require.NoError(t, g.Do(ctx, "k", increment(db, "k", 0)))
		require.Equal(t, adaptive.Pessimistic, g.Mode("k"))
	}
	calls += 5
	// …a few windows of them do.
	n := 0
	for ; n < 20*adaptive.Window && g.Mode("k") == adaptive.Pessimistic; n++ {
		require.NoError(t, g.Do(ctx, "k", increment(db, "k", 0)))
	}
	calls += n
	require.Equal(t, adaptive.Optimistic, g.Mode("k"), "a cooled key goes back to optimistic")
	t.Logf("went locked after %d hot calls, back after %d quiet ones", sum(ops), n+5)

	c := counted(t, db, "k")
	require.EqualValues(t, calls, c.N, "lost updates across the switches")
	require.EqualValues(t, calls, c.Version)
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// fn's own refusal, such as "already claimed", matches contend.ErrConflict
// too, but it is an answer about the key's state, not a lost race: a key
// whose calls are refused without any contention stays optimistic.
func TestRefusalsAreNoConflicts(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	counters(t, db, "k")
	g := newGuard(t, db, adaptive.Config{})
	refused := fmt.Errorf("already claimed: %w", contend.ErrConflict)
	for range 10 * adaptive.Window {
		err := g.Do(t.Context(), "k", func(context.Context) error { return refused })
		require.Equal(t, refused, err, "fn's error comes back unchanged")
		require.Equal(t, adaptive.Optimistic, g.Mode("k"), "one caller, refused, lost no race")
	}
}

// A key with two callers at once stays locked: each call comes behind the
// other's, the race it would have lost without the lock, so the locked
// calls measure the key as the optimistic attempts did. Counted only by
// how long it waited (never more than the one hold ahead of it), the key
// would go back to optimistic, lose half its attempts there, and come
// back, over and over.
func TestTwoCallersKeepAKeyLocked(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	counters(t, db, "k")
	g := newGuard(t, db, adaptive.Config{Retry: bigBudget})
	ctx := t.Context()

	// Hot: 16 callers until the key goes under the lock.
	var calls atomic.Int64
	workload.Each(t, 16, func(int) error {
		for i := 0; i < 100 && g.Mode("k") == adaptive.Optimistic; i++ {
			if err := g.Do(ctx, "k", increment(db, "k", time.Millisecond)); err != nil {
				return err
			}
			calls.Add(1)
		}
		return nil
	})
	require.Equal(t, adaptive.Pessimistic, g.Mode("k"), "a hot key goes under the lock")

	// Two callers, each far more calls than a window.
	var optimistic atomic.Int64
	workload.Each(t, 2, func(int) error {
		for range 8 * adaptive.Window {
			if err := g.Do(ctx, "k", increment(db, "k", 2*time.Millisecond)); err != nil {
				return err
			}
			calls.Add(1)
			if g.Mode("k") == adaptive.Optimistic {
				optimistic.Add(1)
			}
		}
		return nil
	})
	require.Zero(t, optimistic.Load(), "calls after which two callers' key was optimistic")
	require.EqualValues(t, calls.Load(), counted(t, db, "k").N, "lost updates")
}

// A call whose key goes under the lock while it waits for a connection runs
// fn locked, once: it does not hold the connection through a run of fn that
// the lock's holders would make it lose. The locked path moves the version
// before fn runs, so fn reads it moved in its own transaction; an
// optimistic run would read it unmoved.
func TestKeyLockedWhileWaitingForAConnection(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	counters(t, db, "k")
	db.SetMaxOpenConns(1)
	g := newGuard(t, db, adaptive.Config{})
	ctx := t.Context()

	held, err := db.Conn(ctx) // the pool's one connection
	require.NoError(t, err)
	require.Equal(t, adaptive.Optimistic, g.Mode("k"))
	var runs, version atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- g.Do(ctx, "k", func(ctx context.Context) error {
			runs.Add(1)
			var v int64
			err := contend.Querier(ctx, db).QueryRowContext(ctx, `SELECT version FROM counters WHERE id = 'k'`).Scan(&v)
			version.Store(v)
			return err
		})
	}()
	// Do chose its mode before it asked for the connection.
	require.Eventually(t, func() bool { return db.Stats().WaitCount > 0 }, 10*time.Second, time.Millisecond)
	for n := 0; g.Mode("k") == adaptive.Optimistic; n++ {
		require.Less(t, n, 10*adaptive.Window, "the key never went under the lock")
		g.Record("k", 1, 1)
	}
	require.NoError(t, held.Close())
	require.NoError(t, <-done)
	require.EqualValues(t, 1, runs.Load(), "runs of fn")
	require.EqualValues(t, 1, version.Load(), "the version fn read: moved by the lock")
	require.EqualValues(t, 1, counted(t, db, "k").Version)
}

// A lost race counts as it is lost, not when the call's next attempt runs:
// Config.Retry's wait comes between them, and a connection to wait for.
// Nine callers read one version and write at once; eight lose, enough to
// send a key new to the Guard under the lock, and then wait up to an hour
// before their next attempt. The key goes under the lock while they wait.
func TestLossCountsBeforeTheRetryWait(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	counters(t, db, "k")
	g := newGuard(t, db, adaptive.Config{Retry: contend.Retry{MaxAttempts: 2, BaseDelay: time.Hour, MaxDelay: time.Hour}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	const callers = 9
	var read atomic.Int64
	allRead := make(chan struct{})
	done := make(chan error, callers)
	for range callers {
		go func() {
			first := true
			done <- g.Do(ctx, "k", func(ctx context.Context) error {
				if first {
					first = false
					if read.Add(1) == callers {
						close(allRead)
					}
					<-allRead // every caller read the version before any writes
				}
				return increment(db, "k", 0)(ctx)
			})
		}()
	}
	require.Eventually(t, func() bool { return g.Mode("k") == adaptive.Pessimistic }, 10*time.Second, time.Millisecond,
		"eight lost races, counted only after their wait")
	cancel()
	var won int
	for range callers {
		if err := <-done; err == nil {
			won++
		}
	}
	require.EqualValues(t, won, counted(t, db, "k").N, "lost updates")
}
