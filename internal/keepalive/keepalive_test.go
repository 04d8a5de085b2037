package keepalive_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keepalive"
	"github.com/contend/contend/internal/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every test runs in a synctest bubble: its clock moves only when all its
// goroutines wait, so a timer fires at its due instant in the bubble's
// time however loaded the machine is, and the tests check the instants.

// heldTTL is the lease of a hold that a test needs kept: refreshed every
// 50ms, each refresh with 100ms to spare. A refresh that returns after the
// lease's validity loses it, as it must.
const heldTTL = 150 * time.Millisecond

// awaitRefreshes waits until enough is closed, failing at once if h is lost
// meanwhile rather than waiting for refreshes that will not come, and with
// msg if they do not come at all.
func awaitRefreshes(t *testing.T, h *keepalive.Hold, enough <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-enough:
	case <-h.Context().Done():
		t.Fatalf("lost before it was refreshed enough: %v", context.Cause(h.Context()))
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
	}
}

// waitIdle waits until no refresh of timers is under way: every refresh
// call the test made has returned (the test released any stuck one), so the
// goroutines that ran them must end at once.
func waitIdle(t *testing.T, timers *keepalive.Timers) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), lateTimer)
	defer cancel()
	require.NoError(t, timers.Wait(ctx), "a refresh goroutine did not end after its call returned")
}

// lateTimer is how long past its due time a test waits for a timer before
// it calls it broken: a timer that never fires fails the test rather than
// hanging it.
const lateTimer = time.Second

// awaitLost waits until h is lost, which must be by valid, its lease's
// validity: the timer keeps that deadline whatever its refreshes do. It fails
// with msg if h is still not lost lateTimer after it.
func awaitLost(t *testing.T, h *keepalive.Hold, valid time.Time, msg string) {
	t.Helper()
	waitfor.Recv(t, h.Context().Done(), time.Until(valid)+lateTimer, msg)
}

func TestRefreshesWhileHeld(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		refresh, enough := refreshed(3)
		h := timers.Start(t.Context(), time.Now(), heldTTL, refresh)
		awaitRefreshes(t, h, enough, "not refreshed")
		require.NoError(t, h.Context().Err(), "a refreshed lease is not lost")
		require.NoError(t, h.Stop())
		require.ErrorIs(t, h.Context().Err(), context.Canceled, "the work's ctx ends with the hold")
	})
}

func TestLostWhenTheTokenIsGone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		const ttl = 30 * time.Millisecond
		start := time.Now()
		h := timers.Start(t.Context(), start, ttl, func(context.Context) (bool, error) {
			return false, nil
		})
		awaitLost(t, h, start.Add(ttl), "a refresh found the lease gone, and the hold went on")
		require.ErrorIs(t, context.Cause(h.Context()), contend.ErrLockLost)
		require.ErrorIs(t, h.Stop(), contend.ErrLockLost)
	})
}

// A backend that stops answering loses the lease once its validity has passed,
// not before and not never.
func TestLostWhenRefreshesFailPastValidity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		down := errors.New("backend down")
		const ttl = 60 * time.Millisecond
		start := time.Now()
		h := timers.Start(t.Context(), start, ttl, func(context.Context) (bool, error) { return false, down })
		awaitLost(t, h, start.Add(ttl), "every refresh failed, and the hold outlived its lease")
		require.GreaterOrEqual(t, time.Since(start), ttl, "lost before the lease could have expired")
		err := h.Stop()
		require.ErrorIs(t, err, contend.ErrLockLost)
		require.ErrorContains(t, err, down.Error())
	})
}

func TestStopsWithTheCaller(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		ctx, cancel := context.WithCancel(t.Context())
		h := timers.Start(ctx, time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
		cancel()
		// The work's ctx is the caller's child: it ends with it, at once.
		waitfor.Recv(t, h.Context().Done(), lateTimer, "the caller gave up, and the work's ctx went on")
		require.NoError(t, h.Stop(), "the caller giving up is not a lost lease")
	})
}

// Stop takes the hold off the queue, so that no refresh begins after it: the
// caller releases right after Stop. A refresh already under way goes on (Stop
// does not wait for it; Wait does), and what it returns changes nothing.
func TestNoRefreshAfterStop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		stuck := newStuck(t)
		// Valid for 300ms, refreshed from 100ms: Stop comes while it is valid.
		start := time.Now()
		h := timers.Start(t.Context(), start, 300*time.Millisecond, stuck.refresh)
		stuck.await(t, h, start.Add(300*time.Millisecond)) // a refresh is under way
		require.NoError(t, h.Stop())
		stuck.release()
		waitIdle(t, &timers)
		require.Zero(t, timers.Queued(), "the refresh under way queued the hold again")
		require.EqualValues(t, 1, stuck.calls.Load())
		require.ErrorIs(t, context.Cause(h.Context()), context.Canceled)
	})
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
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		long := timers.Start(t.Context(), time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
		refresh, enough := refreshed(3)
		short := timers.Start(t.Context(), time.Now(), heldTTL, refresh)
		awaitRefreshes(t, short, enough, "the short lease was not refreshed: the timer stayed set for the long one")
		require.NoError(t, short.Context().Err())
		require.NoError(t, short.Stop())
		require.NoError(t, long.Stop())
	})
}

// Stopping the hold the timer was set for leaves the others refreshed.
func TestStoppingTheFirstHoldKeepsTheNext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		first := timers.Start(t.Context(), time.Now(), heldTTL, func(context.Context) (bool, error) { return true, nil })
		time.Sleep(time.Millisecond) // the next is due a little later than the first
		refresh, enough := refreshed(3)
		next := timers.Start(t.Context(), time.Now(), heldTTL, refresh)
		require.NoError(t, first.Stop())
		awaitRefreshes(t, next, enough, "the next hold was not refreshed after the first one stopped")
		require.NoError(t, next.Stop())
	})
}

// A refresh that hangs on its backend delays no other hold's, not even
// one that fell due at the same moment; its own hold is lost when its
// validity passes.
func TestSlowRefreshDelaysNoOther(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		slowRefresh := newStuck(t) // past its own deadline, as a backend that ignores it would
		now := time.Now()
		slow := timers.Start(t.Context(), now, heldTTL, slowRefresh.refresh)
		refresh, enough := refreshed(3)
		other := timers.Start(t.Context(), now, heldTTL, refresh)
		awaitRefreshes(t, other, enough, "a hanging refresh held up another hold's")
		require.NoError(t, other.Stop())
		awaitLost(t, slow, now.Add(heldTTL), "the hold whose refresh hangs was not lost when its lease's validity passed")
		require.ErrorIs(t, slow.Stop(), contend.ErrLockLost)
		slowRefresh.release()
		waitIdle(t, &timers)
	})
}

// Many holds started and stopped at once on one Timers each get their
// refreshes, and none is left to be refreshed once all are stopped.
func TestManyHoldsShareTimers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		const holds = 64
		errs := make(chan error, 2*holds) // up to two from each hold
		var wg sync.WaitGroup
		for range holds {
			wg.Go(func() {
				var calls atomic.Int32
				enough := make(chan struct{})
				h := timers.Start(t.Context(), time.Now(), heldTTL, func(context.Context) (bool, error) {
					if calls.Add(1) == 2 {
						close(enough)
					}
					return true, nil
				})
				select {
				case <-enough:
				case <-h.Context().Done(): // lost: Stop reports it
				case <-time.After(10 * time.Second):
					errs <- errors.New("a hold was not refreshed twice")
				}
				errs <- h.Stop()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		waitIdle(t, &timers)
		require.Zero(t, timers.Queued(), "a stopped hold stayed queued")
	})
}

// A stopped hold leaves the queue at once, rather than when it would have
// been due: at a hundred thousand guarded calls a second and a 10s lease,
// that would be a third of a million dead holds kept.
func TestStoppedHoldsLeaveTheQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
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
	})
}

// stuckRefresh is a refresh whose backend call does not return until the test
// releases it. It stands for a call the client will not abandon: go-redis with
// its default options (ContextTimeoutEnabled false) ignores ctx's deadline and
// sends again after a read timeout, so against a blackholed network its call
// returns seconds after the lease is gone. That network cannot be made inside
// this package; to a Hold, a call blocked on a channel is the same thing.
type stuckRefresh struct {
	began    chan struct{} // a value per call that began, while there is room
	unblock  chan struct{} // closed by release: every call returns held, nil
	release  func()
	calls    atomic.Int32
	returned atomic.Int32
}

// newStuck returns a stuckRefresh that the test releases at the latest when
// it ends, so that a failing test leaves no call blocked.
func newStuck(t *testing.T) *stuckRefresh {
	s := &stuckRefresh{began: make(chan struct{}, 16), unblock: make(chan struct{})}
	s.release = sync.OnceFunc(func() { close(s.unblock) })
	t.Cleanup(s.release)
	return s
}

// await waits until a refresh of h began, failing at once if h is lost
// first (a runner so loaded that its timer fired only past the validity),
// and if neither has happened by valid, h's lease's validity: by then the
// timer must have started a refresh or lost the hold.
func (s *stuckRefresh) await(t *testing.T, h *keepalive.Hold, valid time.Time) {
	t.Helper()
	select {
	case <-s.began:
	case <-h.Context().Done():
		t.Fatalf("lost before a refresh began: %v", context.Cause(h.Context()))
	case <-time.After(time.Until(valid) + lateTimer):
		t.Fatalf("no refresh began, and the hold was not lost, %v after its lease's validity: the timer never fired", lateTimer)
	}
}

func (s *stuckRefresh) refresh(context.Context) (bool, error) {
	s.calls.Add(1)
	select {
	case s.began <- struct{}{}:
	default:
	}
	<-s.unblock
	s.returned.Add(1)
	return true, nil
}

// The loss is told when the lease's validity passes, by the timer, not when a
// refresh stuck on its backend returns.
//
// In the bubble's clock the loss comes at the lease's validity, to the
// instant: neither before it nor after.
func TestLostAtValidityWhileRefreshIsStuck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		stuck := newStuck(t)
		const ttl = 60 * time.Millisecond
		obtained := time.Now()
		valid := obtained.Add(ttl)
		h := timers.Start(t.Context(), obtained, ttl, stuck.refresh)
		stuck.await(t, h, valid) // the first refresh, due at ttl/3, is stuck
		require.NoError(t, h.Context().Err(), "lost while the lease was still valid")
		select {
		case <-h.Context().Done():
		case <-time.After(time.Until(valid) + time.Second):
			t.Fatal("not lost while a refresh was stuck past the lease's validity")
		}
		lag := time.Since(valid)
		t.Logf("lost %v after the lease's validity, with the refresh stuck", lag)
		require.Zero(t, lag, "lost before or after the lease's validity passed")
		require.ErrorIs(t, context.Cause(h.Context()), contend.ErrLockLost)
		t.Logf("cause: %v", context.Cause(h.Context()))
		require.Zero(t, stuck.returned.Load(), "the loss waited for the refresh to return")
		require.EqualValues(t, 1, stuck.calls.Load(), "a second refresh began while one was stuck")
		require.ErrorIs(t, h.Stop(), contend.ErrLockLost)
		stuck.release()
		waitIdle(t, &timers)
	})
}

// Stop returns at once while a refresh is stuck, and what that refresh
// returns afterwards changes nothing; Wait is what waits for it.
func TestStopDoesNotWaitForAStuckRefresh(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		idle, cancelIdle := context.WithTimeout(t.Context(), lateTimer)
		defer cancelIdle()
		require.NoError(t, timers.Wait(idle), "nothing to wait for before any hold")
		stuck := newStuck(t)
		// Valid for 300ms, refreshed from 100ms: Stop comes while it is valid.
		start := time.Now()
		h := timers.Start(t.Context(), start, 300*time.Millisecond, stuck.refresh)
		stuck.await(t, h, start.Add(300*time.Millisecond))

		// On a goroutine, so that a Stop that waits fails the test instead of
		// hanging it.
		stopped := make(chan error, 1)
		began := time.Now()
		go func() { stopped <- h.Stop() }()
		select {
		case err := <-stopped:
			took := time.Since(began)
			t.Logf("Stop took %v with a refresh stuck", took)
			require.Zero(t, took, "Stop waited in the bubble's clock")
			require.NoError(t, err, "stopped while the lease was valid")
		case <-time.After(time.Second):
			t.Fatal("Stop waited for the stuck refresh")
		}
		require.ErrorIs(t, context.Cause(h.Context()), context.Canceled)

		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, timers.Wait(ctx), context.DeadlineExceeded, "Wait returned while a refresh was stuck")
		require.Zero(t, stuck.returned.Load())

		stuck.release()
		waitIdle(t, &timers)
		require.EqualValues(t, 1, stuck.returned.Load(), "Wait returned before the refresh did")
		require.Zero(t, timers.Queued(), "a refresh that returned after Stop queued the hold again")
		require.ErrorIs(t, context.Cause(h.Context()), context.Canceled, "a refresh that returned after Stop changed the hold")
	})
}

// A refresh that succeeds only after the lease's validity passed does not
// revive the hold: by then the work was told it had lost the lease, and
// another holder may have taken it.
func TestLateSuccessDoesNotRevive(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		stuck := newStuck(t)
		const ttl = 90 * time.Millisecond
		obtained := time.Now()
		h := timers.Start(t.Context(), obtained, ttl, stuck.refresh)
		stuck.await(t, h, obtained.Add(ttl))
		select {
		case <-h.Context().Done():
		case <-time.After(time.Until(obtained.Add(ttl)) + time.Second):
			// Not lost in time: go on, to show the late success as well.
		}
		stuck.release() // it succeeds now, too late
		waitIdle(t, &timers)
		require.ErrorIs(t, context.Cause(h.Context()), contend.ErrLockLost, "a late success revived the hold")
		require.ErrorIs(t, h.Stop(), contend.ErrLockLost)
		require.Zero(t, timers.Queued(), "a lost hold stayed queued")
		require.EqualValues(t, 1, stuck.calls.Load(), "a lost hold was refreshed again")
	})
}

// A hold started late in its lease (the obtain took most of a third of it,
// on a slow link) is refreshed at once, not a third of a lease after Start,
// when its validity would already have passed.
func TestHoldStartedLateIsRefreshedAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var timers keepalive.Timers
		// 2/3 of the lease gone at Start: a refresh a third of a lease later
		// would come 100ms after its validity passed. The 100ms left is room
		// for a loaded runner, where a refresh comes tens of milliseconds late.
		const ttl = 300 * time.Millisecond
		refresh, enough := refreshed(3)
		h := timers.Start(t.Context(), time.Now().Add(-2*ttl/3), ttl, refresh)
		awaitRefreshes(t, h, enough, "not refreshed")
		require.NoError(t, h.Stop(), "lost before its first refresh")
	})
}
