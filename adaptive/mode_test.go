package adaptive_test

import (
	"context"
	"fmt"
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
