package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
)

// The key is taken with a fence that fn receives, the answer recorded and
// replayed; another request is refused; a transient error frees the key at
// once.
func TestExternalOnceThenReplay(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		var fences []int64
		charge := func(_ context.Context, fence int64) ([]byte, error) {
			fences = append(fences, fence)
			return fmt.Appendf(nil, "charged with fence %d", fence), nil
		}
		first, replayed, err := s.DoExternal(ctx, "pay-1", "fp", charge)
		require.NoError(t, err)
		require.False(t, replayed)
		again, replayed, err := s.DoExternal(ctx, "pay-1", "fp", charge)
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, first, again)
		require.Len(t, fences, 1)
		require.Positive(t, fences[0])
		_, _, err = s.DoExternal(ctx, "pay-1", "other", charge)
		require.ErrorIs(t, err, idempotency.ErrMismatch)
		require.Len(t, fences, 1)

		_, _, err = s.DoExternal(ctx, "pay-2", "fp", func(context.Context, int64) ([]byte, error) {
			return nil, idempotency.Transient(errors.New("provider unreachable"))
		})
		require.Error(t, err)
		require.Zero(t, e.records(t, "pay-2"), "a transient error frees the key")
		_, replayed, err = s.DoExternal(ctx, "pay-2", "fp", charge)
		require.NoError(t, err)
		require.False(t, replayed)
	})
}

// A duplicate waits for the call in flight and replays its answer; under
// NoWait it is refused at once.
func TestExternalDuplicateWaits(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		started, release := make(chan struct{}), make(chan struct{})
		type result struct {
			answer []byte
			err    error
		}
		first := make(chan result, 1)
		go func() {
			a, _, err := s.DoExternal(ctx, "k", "fp", func(context.Context, int64) ([]byte, error) {
				close(started)
				<-release
				return []byte("first"), nil
			})
			first <- result{a, err}
		}()
		<-started
		nw := e.store(t, idempotency.Config{NoWait: true})
		_, _, err := nw.DoExternal(ctx, "k", "fp", func(context.Context, int64) ([]byte, error) {
			t.Error("fn ran under NoWait with the key in flight")
			return nil, nil
		})
		require.ErrorIs(t, err, idempotency.ErrInFlight)
		second := make(chan result, 1)
		go func() {
			a, replayed, err := s.DoExternal(ctx, "k", "fp", func(context.Context, int64) ([]byte, error) {
				return []byte("second"), nil
			})
			if err == nil && !replayed {
				err = errors.New("the duplicate ran fn")
			}
			second <- result{a, err}
		}()
		select {
		case r := <-second:
			t.Fatalf("the duplicate returned while the first was in flight: %+v", r)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		require.NoError(t, (<-first).err)
		r := <-second
		require.NoError(t, r.err)
		require.Equal(t, "first", string(r.answer))
	})
}

// A call that stalls past its lease: its ctx ends (ErrLockLost), another
// call takes the key with a larger fence and records its answer, and the
// stalled call's late answer is refused.
func TestExternalStalledCallIsFencedOut(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		const lease = time.Second
		s := e.store(t, idempotency.Config{Lease: lease})
		leaseEnded, late := make(chan int64, 1), make(chan struct{})
		type result struct {
			answer []byte
			err    error
		}
		stale := make(chan result, 1)
		began := time.Now()
		go func() {
			a, _, err := s.DoExternal(ctx, "k", "fp", func(ctx context.Context, fence int64) ([]byte, error) {
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), contend.ErrLockLost) {
					t.Errorf("fn's ctx ended with %v, not a lost lease", context.Cause(ctx))
				}
				leaseEnded <- fence
				<-late // a stalled call that ignores its ctx
				return []byte("stale"), nil
			})
			stale <- result{a, err}
		}()
		staleFence := <-leaseEnded
		require.GreaterOrEqual(t, time.Since(began), lease, "the lease is kept by a timer: not ended early")
		require.Less(t, time.Since(began), lease+2*time.Second)

		// The server's lease ends a little after fn's ctx did. The stalled
		// call completes while the fresh one holds the key, in flight: only
		// its fence tells the two apart.
		var (
			fresh int64
			r     result
			once  sync.Once
		)
		require.Eventually(t, func() bool {
			_, _, err := s.DoExternal(ctx, "k", "fp", func(_ context.Context, fence int64) ([]byte, error) {
				fresh = fence
				once.Do(func() {
					close(late)
					r = <-stale
				})
				return []byte("fresh"), nil
			})
			return err == nil
		}, 5*time.Second, 50*time.Millisecond)
		require.Greater(t, fresh, staleFence)
		require.ErrorIs(t, r.err, idempotency.ErrFenced)
		require.ErrorIs(t, r.err, contend.ErrLockLost)
		require.Equal(t, "stale", string(r.answer), "the refused call still gets fn's answer")

		a, replayed, err := s.DoExternal(ctx, "k", "fp", func(context.Context, int64) ([]byte, error) {
			t.Error("fn ran after the answer was recorded")
			return nil, nil
		})
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, "fresh", string(a))
	})
}

// DoExternal refuses to run inside a transaction.
func TestExternalRefusesATransaction(t *testing.T) {
	e := newEnv(t, "postgres")
	tx, err := e.own.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer tx.Rollback()
	s, err := idempotency.New(tx, idempotency.Config{Table: "idem"})
	require.NoError(t, err)
	_, _, err = s.DoExternal(t.Context(), "k", "fp", func(context.Context, int64) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, contend.ErrInvalid)
}
