package keepalive_test

import (
	"context"
	"errors"
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
	var calls atomic.Int32
	enough := make(chan struct{})
	h := keepalive.Start(t.Context(), time.Now(), 30*time.Millisecond, func(context.Context) (bool, error) {
		if calls.Add(1) == 3 {
			close(enough)
		}
		return true, nil
	})
	<-enough
	require.NoError(t, h.Context().Err(), "a refreshed lease is not lost")
	require.NoError(t, h.Stop())
	require.ErrorIs(t, h.Context().Err(), context.Canceled, "the work's ctx ends with the hold")
}

func TestLostWhenTheTokenIsGone(t *testing.T) {
	t.Parallel()
	h := keepalive.Start(t.Context(), time.Now(), 30*time.Millisecond, func(context.Context) (bool, error) {
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
	down := errors.New("backend down")
	const ttl = 60 * time.Millisecond
	start := time.Now()
	h := keepalive.Start(t.Context(), start, ttl, func(context.Context) (bool, error) { return false, down })
	<-h.Context().Done()
	require.GreaterOrEqual(t, time.Since(start), ttl, "lost before the lease could have expired")
	err := h.Stop()
	require.ErrorIs(t, err, contend.ErrLockLost)
	require.ErrorContains(t, err, down.Error())
}

func TestStopsWithTheCaller(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	h := keepalive.Start(ctx, time.Now(), time.Hour, func(context.Context) (bool, error) { return true, nil })
	cancel()
	<-h.Context().Done()
	require.NoError(t, h.Stop(), "the caller giving up is not a lost lease")
}

// Stop waits for a refresh under way, and none starts after it returns: the
// caller releases right after Stop, and a late refresh must not extend what
// it released.
func TestNoRefreshAfterStop(t *testing.T) {
	t.Parallel()
	var inside, after atomic.Int32
	var stopped atomic.Bool
	refreshing := make(chan struct{}, 1)
	h := keepalive.Start(t.Context(), time.Now(), 3*time.Millisecond, func(context.Context) (bool, error) {
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
