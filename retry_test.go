package contend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
)

func TestRetryDelayBounds(t *testing.T) {
	t.Parallel()
	r := contend.Retry{BaseDelay: time.Millisecond, MaxDelay: 8 * time.Millisecond}
	for attempt, limit := range map[int]time.Duration{
		0: time.Millisecond, 1: time.Millisecond, 2: 2 * time.Millisecond, 3: 4 * time.Millisecond,
		4: 8 * time.Millisecond, 5: 8 * time.Millisecond, 100: 8 * time.Millisecond,
	} {
		var most time.Duration
		for range 2000 {
			d := r.Delay(attempt)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, limit, "attempt %d", attempt)
			most = max(most, d)
		}
		// Full jitter spreads over the whole range, not just its top.
		require.Greater(t, most, limit/2, "attempt %d never came near its cap", attempt)
	}
}

func TestRetryDelayIsJittered(t *testing.T) {
	t.Parallel()
	var r contend.Retry // defaults
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[r.Delay(5)] = true
	}
	require.Greater(t, len(seen), 50, "delays of one attempt must differ, or losers collide again")
}

func TestRetryDoStopsOnSuccess(t *testing.T) {
	t.Parallel()
	r := contend.Retry{MaxAttempts: 5, BaseDelay: time.Microsecond}
	calls := 0
	n, err := r.Do(t.Context(), func(context.Context) error {
		calls++
		if calls < 3 {
			return contend.ErrConflict
		}
		return nil
	}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 3, calls)
}

func TestRetryDoGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	r := contend.Retry{MaxAttempts: 4, BaseDelay: time.Microsecond}
	n, err := r.Do(t.Context(), func(context.Context) error { return contend.ErrConflict }, nil)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, 4, n)
}

func TestRetryDoDoesNotRetryPermanentErrors(t *testing.T) {
	t.Parallel()
	permanent := errors.New("permanent")
	n, err := contend.Retry{}.Do(t.Context(), func(context.Context) error { return permanent },
		func(err error) bool { return errors.Is(err, contend.ErrConflict) })
	require.ErrorIs(t, err, permanent)
	require.Equal(t, 1, n)
}

func TestRetryDoHonoursContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	r := contend.Retry{MaxAttempts: 1000, BaseDelay: time.Hour, MaxDelay: time.Hour}
	calls := 0
	done := make(chan struct{})
	var (
		n   int
		err error
	)
	go func() {
		defer close(done)
		n, err = r.Do(ctx, func(context.Context) error {
			calls++
			return contend.ErrConflict
		}, nil)
	}()
	cancel()
	<-done
	require.ErrorIs(t, err, context.Canceled)
	require.LessOrEqual(t, n, 1)
	require.LessOrEqual(t, calls, 1)
	if n == 1 {
		require.ErrorIs(t, err, contend.ErrConflict, "the last attempt's error stays reachable")
	}
}

func TestRetryDefaults(t *testing.T) {
	t.Parallel()
	// The documented defaults, written out: a check against the constants
	// themselves could not fail when a constant changed.
	require.Equal(t, 10, contend.Retry{}.Attempts())
	require.LessOrEqual(t, contend.Retry{}.Delay(1000), 500*time.Millisecond)
	require.LessOrEqual(t, contend.Retry{}.Delay(1), 2*time.Millisecond)
}

// TestZeroRetryRunsTenTimes counts the runs of an operation that always fails
// under the zero Retry: the documented default is 10 attempts.
func TestZeroRetryRunsTenTimes(t *testing.T) {
	t.Parallel()
	calls := 0
	attempts, err := contend.Retry{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}.Do(context.Background(), func(context.Context) error {
		calls++
		return contend.ErrConflict
	}, nil)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, 10, calls, "the zero Retry's MaxAttempts is documented as 10")
	require.Equal(t, calls, attempts)

	calls = 0
	_, err = contend.Retry{}.Do(context.Background(), func(context.Context) error {
		calls++
		return contend.ErrConflict
	}, nil)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, 10, calls, "a zero Retry{} runs a failing operation 10 times")
}
