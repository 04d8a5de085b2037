package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
)

// events records what an Observer hears.
type events struct {
	mu  sync.Mutex
	got []contend.Event
}

func (ev *events) Observe(_ context.Context, e contend.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.got = append(ev.got, e)
}

// take returns the events heard since the last take.
func (ev *events) take() []contend.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	got := ev.got
	ev.got = nil
	return got
}

func kinds(t *testing.T, es []contend.Event) []contend.EventKind {
	t.Helper()
	var ks []contend.EventKind
	for _, e := range es {
		require.Equal(t, contend.StrategyIdempotency, e.Strategy)
		ks = append(ks, e.Kind)
	}
	return ks
}

// Each way a call ends is reported as Config.Observer says.
func TestObserverHearsEachOutcome(t *testing.T) {
	e := newEnv(t, "pgx")
	ctx := t.Context()
	var ev events
	s := e.store(t, idempotency.Config{Observer: &ev})

	_, _, err := s.Do(ctx, "k", "fp", e.effect("k", "fp"))
	require.NoError(t, err)
	got := ev.take()
	require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventReleased}, kinds(t, got))
	require.Equal(t, "k", got[0].Key)
	require.NoError(t, got[1].Err)

	_, _, err = s.Do(ctx, "k", "fp", e.effect("k", "fp"))
	require.NoError(t, err)
	got = ev.take()
	require.Equal(t, []contend.EventKind{contend.EventConflict}, kinds(t, got))
	require.ErrorIs(t, got[0].Err, idempotency.ErrReplayed)
	require.ErrorIs(t, got[0].Err, contend.ErrConflict)

	_, _, err = s.Do(ctx, "k", "other", e.effect("k", "other"))
	require.ErrorIs(t, err, idempotency.ErrMismatch)
	got = ev.take()
	require.Equal(t, []contend.EventKind{contend.EventFailed}, kinds(t, got))
	require.ErrorIs(t, got[0].Err, idempotency.ErrMismatch)

	declined := errors.New("declined")
	_, _, err = s.Do(ctx, "final", "fp", func(context.Context) ([]byte, error) { return nil, declined })
	require.ErrorIs(t, err, idempotency.ErrFailed)
	got = ev.take()
	require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventReleased}, kinds(t, got))
	require.ErrorIs(t, got[1].Err, declined)

	// A duplicate that waited: its replay's Wait covers the wait.
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, _, err := s.Do(ctx, "slow", "fp", func(ctx context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte("a"), nil
		})
		first <- err
	}()
	<-started
	ev.take()
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	_, replayed, err := s.Do(ctx, "slow", "fp", e.effect("slow", "fp"))
	require.NoError(t, err)
	require.True(t, replayed)
	require.NoError(t, <-first)
	var replay *contend.Event
	for _, g := range ev.take() {
		if g.Kind == contend.EventConflict {
			replay = &g
		}
	}
	require.NotNil(t, replay)
	require.GreaterOrEqual(t, replay.Wait, 250*time.Millisecond, "the wait for the first call")

	// NoWait with the key in flight: Conflict, ErrInFlight.
	nw := e.store(t, idempotency.Config{NoWait: true, Observer: &ev})
	hold, done := make(chan struct{}), make(chan error, 1)
	started = make(chan struct{})
	go func() {
		_, _, err := s.Do(ctx, "held", "fp", func(context.Context) ([]byte, error) {
			close(started)
			<-hold
			return nil, nil
		})
		done <- err
	}()
	<-started
	ev.take()
	_, _, err = nw.Do(ctx, "held", "fp", e.effect("held", "fp"))
	require.ErrorIs(t, err, idempotency.ErrInFlight)
	got = ev.take()
	close(hold)
	require.NoError(t, <-done)
	var inFlight bool
	for _, g := range got {
		if g.Key == "held" && g.Kind == contend.EventConflict && errors.Is(g.Err, idempotency.ErrInFlight) {
			inFlight = true
		}
	}
	require.True(t, inFlight, "%+v", got)
}

func TestPromises(t *testing.T) {
	e := newEnv(t, "pgx")
	p := e.store(t, idempotency.Config{}).Promises()
	require.Equal(t, contend.Promises{Exclusive: true, Waits: true, AcrossProcesses: true, InTransaction: true}, p)
	nw := e.store(t, idempotency.Config{NoWait: true, Retry: contend.Retry{MaxAttempts: 1}}).Promises()
	require.False(t, nw.Waits)
	require.True(t, nw.AtMostOnce)

	// DoExternal: a lease-based lock's promises, outside any transaction,
	// so a call site written for Do cannot take it unawares.
	ext := e.store(t, idempotency.Config{}).ExternalPromises()
	require.Equal(t, contend.Promises{Exclusive: true, AtMostOnce: true, Waits: true, AcrossProcesses: true}, ext)
	require.Error(t, ext.Check(p), "fn's statements leave the transaction")
	require.False(t, e.store(t, idempotency.Config{NoWait: true}).ExternalPromises().Waits)
}
