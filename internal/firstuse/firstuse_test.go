package firstuse

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var errFinal = errors.New("refused for good")

func isFinal(err error) bool { return errors.Is(err, errFinal) }

// A step that passed is not made again; one that failed is, by the next
// call.
func TestPassIsRememberedFailureIsNot(t *testing.T) {
	var s Step
	var made atomic.Int32
	fail := errors.New("network")
	do := func(context.Context) error {
		if made.Add(1) == 1 {
			return fail
		}
		return nil
	}
	require.ErrorIs(t, s.Pass(t.Context(), "x", do, isFinal), fail)
	require.False(t, s.Passed())
	require.NoError(t, s.Pass(t.Context(), "x", do, isFinal))
	require.NoError(t, s.Pass(t.Context(), "x", do, isFinal))
	require.True(t, s.Passed())
	require.EqualValues(t, 2, made.Load())
}

// Callers that come while the step is made wait for it, each no longer
// than its own ctx; they take a final error, and make the step themselves
// after any other.
func TestWaiters(t *testing.T) {
	for name, tc := range map[string]struct {
		first     error
		wantMade  int32
		wantFinal bool
	}{
		"final error taken":      {errFinal, 1, true},
		"other error made again": {errors.New("ctx ended"), 2, false},
	} {
		t.Run(name, func(t *testing.T) {
			var s Step
			var made atomic.Int32
			entered, release := make(chan struct{}), make(chan struct{})
			do := func(context.Context) error {
				if made.Add(1) == 1 {
					close(entered)
					<-release
					return tc.first
				}
				return nil
			}
			firstErr := make(chan error, 1)
			go func() { firstErr <- s.Pass(t.Context(), "x", do, isFinal) }()
			<-entered

			short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			err := s.Pass(short, "x: step", do, isFinal)
			require.ErrorIs(t, err, context.DeadlineExceeded, "a waiter's own ctx bounds its wait")
			require.ErrorContains(t, err, "x: step: waited for another call")

			waiterErr := make(chan error, 1)
			go func() { waiterErr <- s.Pass(t.Context(), "x", do, isFinal) }()
			waitForWaiters(t, &s, 2) // the short one, and this one
			close(release)
			require.ErrorIs(t, <-firstErr, tc.first)
			err = <-waiterErr
			if tc.wantFinal {
				require.ErrorIs(t, err, errFinal)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantMade, made.Load())
		})
	}
}

// waitForWaiters returns once n callers have waited for the step being
// made.
func waitForWaiters(t *testing.T, s *Step, n int) {
	t.Helper()
	for {
		s.mu.Lock()
		got := s.running.waiters
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("no waiter came")
		case <-time.After(time.Millisecond):
		}
	}
}

// A step that panics does not leave its waiters waiting: they make it
// themselves, and the panic goes on.
func TestPanicFreesWaiters(t *testing.T) {
	var s Step
	entered, release := make(chan struct{}), make(chan struct{})
	var made atomic.Int32
	do := func(context.Context) error {
		if made.Add(1) == 1 {
			close(entered)
			<-release
			panic("boom")
		}
		return nil
	}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_ = s.Pass(t.Context(), "x", do, nil)
	}()
	<-entered
	waiterErr := make(chan error, 1)
	go func() { waiterErr <- s.Pass(t.Context(), "x", do, nil) }()
	waitForWaiters(t, &s, 1)
	close(release)
	require.Equal(t, "boom", <-panicked)
	require.NoError(t, <-waiterErr)
	require.True(t, s.Passed())
}
