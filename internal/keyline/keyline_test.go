package keyline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// model is what the core must agree with, per key: how many calls are
// through, and who waits, oldest first.
type model struct {
	through map[string]int
	waiting map[string][]*waiter
	// let are waiters let through whose calls have not noticed yet: each
	// either goes on (and later exits) or gives up at that moment.
	let map[string][]*waiter
}

// TestCoreStateMachine runs generated sequences of joins, exits and
// give-ups on a few keys against the model, checking after each step that
// the core holds the line's invariants and lets waiters through in the
// order they came.
func TestCoreStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		depth := rapid.IntRange(1, 3).Draw(t, "depth")
		c := core{depth: depth, lines: map[string]line{}}
		m := model{through: map[string]int{}, waiting: map[string][]*waiter{}, let: map[string][]*waiter{}}
		keys := []string{"a", "b", "c"}
		key := rapid.SampledFrom(keys)
		t.Repeat(map[string]func(*rapid.T){
			"join": func(t *rapid.T) {
				k := key.Draw(t, "key")
				w, behind := c.join(k)
				require.Equal(t, m.through[k] > 0, behind, "a call comes behind another exactly while one is through")
				if m.through[k] < depth {
					require.Nil(t, w, "a call waits while the line has room")
					m.through[k]++
					return
				}
				require.NotNil(t, w, "a call is let through past the depth")
				m.waiting[k] = append(m.waiting[k], w)
			},
			"exit": func(t *rapid.T) {
				k := key.Draw(t, "key")
				// Only a call through that knows it is through exits.
				if m.through[k]-len(m.let[k]) == 0 {
					t.Skip("no call of the key is through")
				}
				c.exit(k)
				if ws := m.waiting[k]; len(ws) > 0 {
					w := ws[0]
					m.waiting[k] = ws[1:]
					m.let[k] = append(m.let[k], w)
					require.True(t, letThrough(w.ready), "the oldest waiter is let through")
					return
				}
				m.through[k]--
			},
			"notice": func(t *rapid.T) {
				// A waiter let through sees its turn and goes on.
				k := key.Draw(t, "key")
				if len(m.let[k]) == 0 {
					t.Skip("nobody was let through")
				}
				i := rapid.IntRange(0, len(m.let[k])-1).Draw(t, "i")
				m.let[k] = append(m.let[k][:i:i], m.let[k][i+1:]...)
			},
			"give up": func(t *rapid.T) {
				// A waiter's ctx ends: while it waits, or just as its
				// turn came.
				k := key.Draw(t, "key")
				n, l := len(m.waiting[k]), len(m.let[k])
				if n+l == 0 {
					t.Skip("nobody waits")
				}
				i := rapid.IntRange(0, n+l-1).Draw(t, "i")
				if i < n {
					w := m.waiting[k][i]
					require.False(t, c.leave(k, w), "a waiter still waiting is not through")
					m.waiting[k] = append(m.waiting[k][:i:i], m.waiting[k][i+1:]...)
					return
				}
				w := m.let[k][i-n]
				require.True(t, c.leave(k, w), "a waiter let through is told so")
				m.let[k] = append(m.let[k][:i-n:i-n], m.let[k][i-n+1:]...)
				// and exits, as Enter does
				c.exit(k)
				if ws := m.waiting[k]; len(ws) > 0 {
					m.waiting[k] = ws[1:]
					m.let[k] = append(m.let[k], ws[0])
					return
				}
				m.through[k]--
			},
			"": func(t *rapid.T) {
				for _, k := range keys {
					ln, ok := c.lines[k]
					require.Equal(t, m.through[k], ln.through, "calls through %q", k)
					require.Equal(t, m.through[k] > 0, ok, "an entry for %q exactly while a call is through", k)
					require.LessOrEqual(t, ln.through, depth)
					require.Equal(t, len(m.waiting[k]), len(ln.waiting), "waiters of %q", k)
					for i, w := range m.waiting[k] {
						require.Same(t, w, ln.waiting[i], "waiter %d of %q", i, k)
						require.False(t, letThrough(w.ready))
					}
					if len(ln.waiting) > 0 {
						require.Equal(t, depth, ln.through, "%q has waiters and room", k)
					}
				}
				require.LessOrEqual(t, len(c.lines), len(keys))
			},
		})
	})
}

// letThrough reports whether a waiter's turn was sent, without taking it.
func letThrough(c chan struct{}) bool { return len(c) == 1 }

// TestCoreRefusesBadTransitions: an exit without a call through, and a
// leave by a stranger, are bugs in the caller, not states.
func TestCoreRefusesBadTransitions(t *testing.T) {
	c := core{depth: 1, lines: map[string]line{}}
	require.Panics(t, func() { c.exit("a") })
	w, behind := c.join("a")
	require.Nil(t, w)
	require.False(t, behind)
	require.Panics(t, func() { c.leave("a", &waiter{ready: make(chan struct{}, 1)}) })
	c.exit("a")
	require.Panics(t, func() { c.exit("a") })
	require.Empty(t, c.lines)
	require.Panics(t, func() { New(0) })
}

// TestLines runs goroutines through one key's line, some giving up while
// they wait, and checks that never more than depth are through at once,
// that each that got through exits, and that the line is empty at the end.
func TestLines(t *testing.T) {
	const depth, goroutines, rounds = 2, 16, 200
	l := New(depth)
	var in, most atomic.Int64
	var gaveUp atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%5 == 0 {
					cancel() // gives up at once, or as its turn comes
				}
				err := l.Enter(ctx, "k")
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						errs <- err
						return
					}
					gaveUp.Add(1)
					continue
				}
				n := in.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				in.Add(-1)
				l.Exit("k")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, most.Load(), int64(depth))
	require.Empty(t, l.c.lines, "the line is empty once every call is over")
	t.Logf("at most %d through at once; %d gave up", most.Load(), gaveUp.Load())
}

// TestEnterGivesUpAtOnce: a waiter whose ctx ends leaves the line, with
// ctx's cause, while the calls through go on; the line then lets the next
// in.
func TestEnterGivesUpAtOnce(t *testing.T) {
	l := New(1)
	require.NoError(t, l.Enter(context.Background(), "k"))
	cause := errors.New("caller left")
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Enter(ctx, "k") }()
	cancel(cause)
	require.ErrorIs(t, <-done, cause)
	require.Empty(t, l.c.lines["k"].waiting)
	// The next one waits for the holder, not for the one that left.
	next := make(chan error, 1)
	go func() { next <- l.Enter(context.Background(), "k") }()
	l.Exit("k")
	require.NoError(t, <-next)
	l.Exit("k")
	require.Empty(t, l.c.lines)
}

// TestEnterAllocatesNothingUncontended: a key nobody waits for costs the
// line no allocation, on the path every call takes.
func TestEnterAllocatesNothingUncontended(t *testing.T) {
	l := New(2)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := l.Enter(ctx, "k"); err != nil {
			panic(err)
		}
		l.Exit("k")
	})
	require.Zero(t, allocs)
}
