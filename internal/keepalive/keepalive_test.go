package keepalive_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keepalive"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRefreshesWhileHeld(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	refresh, enough := refreshed(3)
	h := timers.Start(t.Context(), time.Now(), 30*time.Millisecond, refresh)
	<-enough
	require.NoError(t, h.Context().Err(), "a refreshed lease is not lost")
	require.NoError(t, h.Stop())
	require.ErrorIs(t, h.Context().Err(), context.Canceled, "the work's ctx ends with the hold")
}

func TestLostWhenTheTokenIsGone(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	h := timers.Start(t.Context(), time.Now(), 30*time.Millisecond, func(context.Context) (bool, error) {
		return false, nil
	})
	<-h.Context().Done()
	require.ErrorIs(t, context.Cause(h.Context()), contend.ErrLockLost)
	require.ErrorIs(t, h.Stop(), contend.ErrLockLost)
}

// A backend that stops answering loses the lease once its validity has passed,
// not before and not never.
func TestLostWhenRefreshesFailPastValidity(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	down := errors.New("backend down")
	const ttl = 60 * time.Millisecond
	start := time.Now()
	h := timers.Start(t.Context(), start, ttl, func(context.Context) (bool, error) { return false, down })
	<-h.Context().Done()
	require.GreaterOrEqual(t, time.Since(start), ttl, "lost before the lease could have expired")
	err := h.Stop()
	require.ErrorIs(t, err, contend.ErrLockLost)
	require.ErrorContains(t, err, down.Error())
}

func TestStopsWithTheCaller(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	ctx, cancel := context.WithCancel(t.Context())
	h := timers.Start(ctx, time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
	cancel()
	<-h.Context().Done()
	require.NoError(t, h.Stop(), "the caller giving up is not a lost lease")
}

// Stop waits for a refresh under way, and none starts after it returns: the
// caller releases right after Stop, and a late refresh must not extend what
// it released.
func TestNoRefreshAfterStop(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	var inside, after atomic.Int32
	var stopped atomic.Bool
	refreshing := make(chan struct{}, 1)
	h := timers.Start(t.Context(), time.Now(), 3*time.Millisecond, func(context.Context) (bool, error) {
		inside.Add(1)
		defer inside.Add(-1)
		if stopped.Load() {
			after.Add(1)
		}
		select {
		case refreshing <- struct{}{}:
		default:
		}
		time.Sleep(5 * time.Millisecond)
		return true, nil
	})
	<-refreshing // a refresh is under way
	require.NoError(t, h.Stop())
	stopped.Store(true)
	require.Zero(t, inside.Load(), "Stop returned while a refresh ran")
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, after.Load(), "a refresh started after Stop returned")
}

// refreshed returns a Refresh that counts its calls and closes the returned
// channel at the n-th.
func refreshed(n int32) (keepalive.Refresh, <-chan struct{}) {
	var calls atomic.Int32
	enough := make(chan struct{})
	return func(context.Context) (bool, error) {
		if calls.Add(1) == n {
			close(enough)
		}
		return true, nil
	}, enough
}

// A hold due sooner than every other one moves the shared timer forward:
// a short lease started after a long one is still refreshed in time.
func TestSoonerHoldMovesTheTimer(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	long := timers.Start(t.Context(), time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
	refresh, enough := refreshed(3)
	short := timers.Start(t.Context(), time.Now(), 30*time.Millisecond, refresh)
	select {
	case <-enough:
	case <-time.After(5 * time.Second):
		t.Fatal("the short lease was not refreshed: the timer stayed set for the long one")
	}
	require.NoError(t, short.Context().Err())
	require.NoError(t, short.Stop())
	require.NoError(t, long.Stop())
}

// Stopping the hold the timer was set for leaves the others refreshed.
func TestStoppingTheFirstHoldKeepsTheNext(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	first := timers.Start(t.Context(), time.Now(), 30*time.Millisecond, func(context.Context) (bool, error) { return true, nil })
	time.Sleep(time.Millisecond) // the next is due a little later than the first
	refresh, enough := refreshed(3)
	next := timers.Start(t.Context(), time.Now(), 30*time.Millisecond, refresh)
	require.NoError(t, first.Stop())
	select {
	case <-enough:
	case <-time.After(5 * time.Second):
		t.Fatal("the next hold was not refreshed after the first one stopped")
	}
	require.NoError(t, next.Stop())
}

// A refresh that hangs on its backend delays no other hold's, not even
// one that fell due at the same moment.
func TestSlowRefreshDelaysNoOther(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	unblock := make(chan struct{})
	now := time.Now()
	slow := timers.Start(t.Context(), now, 30*time.Millisecond, func(context.Context) (bool, error) {
		<-unblock // past its own deadline, as a backend that ignores it would
		return true, nil
	})
	refresh, enough := refreshed(3)
	other := timers.Start(t.Context(), now, 30*time.Millisecond, refresh)
	select {
	case <-enough:
	case <-time.After(5 * time.Second):
		t.Fatal("a hanging refresh held up another hold's")
	}
	close(unblock)
	require.NoError(t, other.Stop())
	require.NoError(t, slow.Stop())
}

// Many holds started and stopped at once on one Timers each get their
// refreshes, and none is refreshed after its Stop returned.
func TestManyHoldsShareTimers(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	const holds = 64
	errs := make(chan error, 3*holds) // up to three from each hold
	var wg sync.WaitGroup
	for range holds {
		wg.Go(func() {
			var stopped atomic.Bool
			var late atomic.Int32
			var calls atomic.Int32
			enough := make(chan struct{})
			h := timers.Start(t.Context(), time.Now(), 6*time.Millisecond, func(context.Context) (bool, error) {
				if stopped.Load() {
					late.Add(1)
				}
				if calls.Add(1) == 2 {
					close(enough)
				}
				return true, nil
			})
			select {
			case <-enough:
			case <-time.After(10 * time.Second):
				errs <- errors.New("a hold was not refreshed twice")
			}
			errs <- h.Stop()
			stopped.Store(true)
			time.Sleep(10 * time.Millisecond)
			if late.Load() > 0 {
				errs <- errors.New("a hold was refreshed after its Stop returned")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// A stopped hold leaves the queue at once, rather than when it would have
// been due: at a hundred thousand guarded calls a second and a 10s lease,
// that would be a third of a million dead holds kept.
func TestStoppedHoldsLeaveTheQueue(t *testing.T) {
	t.Parallel()
	var timers keepalive.Timers
	holds := make([]*keepalive.Hold, 100)
	for i := range holds {
		holds[i] = timers.Start(t.Context(), time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
	}
	require.Equal(t, 100, timers.Queued())
	for _, h := range holds {
		require.NoError(t, h.Stop())
	}
	require.Zero(t, timers.Queued())
}
