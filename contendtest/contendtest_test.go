package contendtest_test

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
	"github.com/contend/contend/contendtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errFn = errors.New("fn's error")

// call runs one Do on g and says whether fn ran.
func call(ctx context.Context, g contend.Guard, fnErr error) (ran bool, err error) {
	err = g.Do(ctx, "k", func(context.Context) error {
		ran = true
		return fnErr
	})
	return ran, err
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	backend := errors.New("connection reset")
	for _, tc := range []struct {
		outcome contendtest.Outcome
		ran     bool
		is      []error
		not     []error
	}{
		{contendtest.Run(), true, []error{errFn}, []error{contend.ErrConflict}},
		{contendtest.Conflict(), false, []error{contend.ErrConflict}, []error{errFn, contend.ErrNotFound}},
		{contendtest.NotFound(), false, []error{contend.ErrNotFound}, []error{errFn, contend.ErrConflict}},
		{contendtest.Fail(backend), false, []error{backend}, []error{errFn, contend.ErrConflict}},
		{contendtest.LoseLock(0), true, []error{contend.ErrLockLost, errFn}, []error{contend.ErrConflict}},
	} {
		t.Run(tc.outcome.String(), func(t *testing.T) {
			ran, err := call(t.Context(), contendtest.NewGuard(tc.outcome), errFn)
			require.Equal(t, tc.ran, ran, "fn ran")
			for _, want := range tc.is {
				require.ErrorIs(t, err, want)
			}
			for _, unwanted := range tc.not {
				require.NotErrorIs(t, err, unwanted)
			}
		})
	}
}

// fn runs under Run unchanged: same ctx values, its error not wrapped.
func TestRunPassesFnsErrorUnchanged(t *testing.T) {
	t.Parallel()
	require.Same(t, errFn, contendtest.NewGuard().Do(t.Context(), "k", func(context.Context) error { return errFn }))
}

func TestWaitRunsFnAfterTheWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var waited time.Duration
		err := contendtest.NewGuard(contendtest.Wait(time.Second)).Do(t.Context(), "k", func(context.Context) error {
			waited = time.Since(start)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, time.Second, waited)
	})
}

// A wait that ctx cuts short matches ctx's error, its cause and
// ErrConflict, as a real guard's does; fn does not run.
func TestWaitCutShortByCtx(t *testing.T) {
	t.Parallel()
	cause := errors.New("request deadline")
	for _, outcome := range []contendtest.Outcome{contendtest.Wait(time.Hour), contendtest.WaitForCtx()} {
		t.Run(outcome.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeoutCause(t.Context(), time.Second, cause)
				defer cancel()
				start := time.Now()
				ran, err := call(ctx, contendtest.NewGuard(outcome), nil)
				require.False(t, ran)
				require.Equal(t, time.Second, time.Since(start), "returns when ctx ends")
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.ErrorIs(t, err, cause)
				require.ErrorIs(t, err, contend.ErrConflict)
			})
		})
	}
}

// The loss cancels fn's ctx with cause ErrLockLost after the time given,
// while fn runs; a fn that returns first sees no loss.
func TestLoseLock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := contendtest.NewGuard(contendtest.LoseLock(time.Second), contendtest.LoseLock(time.Second))
		start := time.Now()
		err := g.Do(t.Context(), "k", func(ctx context.Context) error {
			<-ctx.Done()
			require.Equal(t, time.Second, time.Since(start))
			require.ErrorIs(t, context.Cause(ctx), contend.ErrLockLost)
			return ctx.Err()
		})
		require.ErrorIs(t, err, contend.ErrLockLost)
		require.ErrorIs(t, err, context.Canceled)

		err = g.Do(t.Context(), "k", func(ctx context.Context) error { return errFn })
		require.Same(t, errFn, err, "fn returned before the loss")
		time.Sleep(2 * time.Second)
	})
}

// Calls take the script's outcomes in order, whatever their keys, then run;
// Keys and Left say what happened.
func TestScriptOrder(t *testing.T) {
	t.Parallel()
	g := contendtest.NewGuard(contendtest.Conflict(), contendtest.NotFound())
	require.Equal(t, 2, g.Left())
	_, err := call(t.Context(), g, nil)
	require.ErrorIs(t, err, contend.ErrConflict)
	err = g.Do(t.Context(), "other", func(context.Context) error { return nil })
	require.ErrorIs(t, err, contend.ErrNotFound)
	ran, err := call(t.Context(), g, nil)
	require.NoError(t, err)
	require.True(t, ran, "past the script's end calls run")
	require.Equal(t, []string{"k", "other", "k"}, g.Keys())
	require.Equal(t, 0, g.Left())
	require.ErrorIs(t, g.Do(t.Context(), "k", nil), contend.ErrInvalid)
}

// Concurrent calls take each outcome once.
func TestScriptConcurrent(t *testing.T) {
	t.Parallel()
	const n = 64
	script := make([]contendtest.Outcome, n/2)
	for i := range script {
		script[i] = contendtest.Conflict()
	}
	g := contendtest.NewGuard(script...)
	errs := contendtest.Race(n, func(i int) error {
		_, err := call(t.Context(), g, nil)
		return err
	})
	conflicts := 0
	for _, err := range errs {
		if errors.Is(err, contend.ErrConflict) {
			conflicts++
		} else {
			require.NoError(t, err)
		}
	}
	require.Equal(t, n/2, conflicts)
	require.Len(t, g.Keys(), n)
}

// All n calls run at once: each waits inside fn until all n are inside,
// which could not happen if Race ran them one after another. Each call's
// error lands at its index.
func TestRaceRunsAllAtOnce(t *testing.T) {
	t.Parallel()
	const n = 32
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var inside atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	errs := contendtest.Race(n, func(i int) error {
		if inside.Add(1) == n {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-ctx.Done():
			return ctx.Err()
		}
		if i%2 == 1 {
			return errFn
		}
		return nil
	})
	require.Len(t, errs, n)
	for i, err := range errs {
		if i%2 == 1 {
			require.Same(t, errFn, err)
		} else {
			require.NoError(t, err, "call %d", i)
		}
	}
}

func TestRacePanicIsAnError(t *testing.T) {
	t.Parallel()
	errs := contendtest.Race(3, func(i int) error {
		if i == 1 {
			panic("boom")
		}
		return nil
	})
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[1], "call 1 panicked: boom")
	require.NoError(t, errs[2])
	require.PanicsWithValue(t, "contendtest: Race with n = 0, need at least 1", func() { contendtest.Race(0, nil) })
}
