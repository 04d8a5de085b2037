// Package waitfor bounds a test's waits. A call or a signal that does not
// come within its bound fails the test at once, with the promise that its
// absence breaks, instead of leaving the test to hang until go test's
// timeout, where a hang hides which promise broke and every other failure
// of the run with it.
//
// The bound of a wait is derived from what it waits for: a call on a free
// key, a wait that ctx ends after a second, a holder that was told to leave.
// The test fails only when Grace has passed too, so a loaded machine's
// slowness is not taken for a broken promise.
package waitfor

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Grace is how long past its bound a wait may take before the test fails:
// on a loaded 2-core machine, a call that honours its ctx can return a few
// seconds late, and one that never returns is a broken promise either way.
const Grace = 5 * time.Second

// Call runs call with a ctx that ends after bound, on a goroutine of its
// own, and returns its error. When call has not returned Grace after its
// ctx ended, Call fails t, naming promise: call ignored its ctx, or waits
// for something that will never come. It must be called from the test's
// goroutine; call must not call t.FailNow. The goroutine of a call that
// never returns is left behind, for goleak to report too.
func Call(t testing.TB, bound time.Duration, promise string, call func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	return Recv(t, done, bound+Grace, promise)
}

// Recv receives from ch, and fails t, naming promise, when nothing came
// within bound.
func Recv[T any](t testing.TB, ch <-chan T, bound time.Duration, promise string) T {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s (nothing within %v)", promise, bound)
		panic("unreachable")
	}
}

// Wait waits for wg, and fails t, naming promise, when it is not done
// within bound.
func Wait(t testing.TB, wg *sync.WaitGroup, bound time.Duration, promise string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	Recv(t, done, bound, promise)
}
