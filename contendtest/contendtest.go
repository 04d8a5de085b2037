// Package contendtest helps test code that uses a [contend.Guard]: how a
// handler answers each outcome a guard can give, and whether the code's own
// invariant holds when many callers arrive at once.
//
// [Guard] is a contend.Guard whose calls answer as the test scripts them: a
// lost race, a lost lock, a slow wait, a wait that ctx's end cuts short, a
// missing row, a backend error. It keeps no state outside the test's
// process and takes no lock: it tests the caller, not the strategy. To
// test that the caller's invariant holds under a real guard, run the
// caller from many goroutines with [Race] against a real backend.
//
// The package imports nothing outside the standard library and this
// module: a test that uses it links no driver.
package contendtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
)

// An Outcome is what one call of a scripted [Guard] does. Build one with
// [Run], [Conflict], [NotFound], [Wait], [WaitForCtx], [LoseLock] or [Fail].
type Outcome struct {
	name string
	do   func(ctx context.Context, key string, fn func(context.Context) error) error
}

// String names the outcome, for test messages.
func (o Outcome) String() string { return o.name }

// Run runs fn and returns its error unchanged, as a guard does once it
// holds the key. A [Guard] runs every call past the end of its script so.
func Run() Outcome {
	return Outcome{name: "run", do: func(ctx context.Context, _ string, fn func(context.Context) error) error {
		return fn(ctx)
	}}
}

// Conflict does not run fn and returns an error matching
// [contend.ErrConflict], as a guard does when the race for the key is lost
// (the key held by a guard that fails fast, already claimed, or its version
// moved on every retry).
func Conflict() Outcome {
	return Outcome{name: "conflict", do: func(_ context.Context, key string, _ func(context.Context) error) error {
		return fmt.Errorf("contendtest: %q: %w", key, contend.ErrConflict)
	}}
}

// NotFound does not run fn and returns an error matching
// [contend.ErrNotFound], as a SQL guard does when the key has no row.
func NotFound() Outcome {
	return Outcome{name: "not found", do: func(_ context.Context, key string, _ func(context.Context) error) error {
		return fmt.Errorf("contendtest: %q: %w", key, contend.ErrNotFound)
	}}
}

// Wait waits d for the key, then runs fn, as a guard does when another
// holder lets go after d. When ctx ends first, fn does not run and the
// error matches both [contend.ErrConflict] and ctx's error (its cause too),
// as a real guard's does for a wait cut short.
func Wait(d time.Duration) Outcome {
	return Outcome{name: fmt.Sprintf("wait %v", d), do: func(ctx context.Context, key string, fn func(context.Context) error) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return fn(ctx)
		case <-ctx.Done():
			return gaveUp(ctx, key)
		}
	}}
}

// WaitForCtx waits for the key until ctx ends: the holder never lets go in
// time. fn does not run, and the error matches both [contend.ErrConflict]
// and ctx's error (its cause too). Give the call a ctx that ends, or the
// call never returns.
func WaitForCtx() Outcome {
	return Outcome{name: "wait for ctx's end", do: func(ctx context.Context, key string, _ func(context.Context) error) error {
		<-ctx.Done()
		return gaveUp(ctx, key)
	}}
}

func gaveUp(ctx context.Context, key string) error {
	return fmt.Errorf("contendtest: %q: gave up waiting: %w (%w)", key, contend.ErrConflict, ctxerr.Of(ctx))
}

// LoseLock runs fn and, after d, cancels fn's ctx with cause
// [contend.ErrLockLost], as a lease-based guard does when its lease can no
// longer be proven held. When the loss came before fn returned, the error
// matches ErrLockLost, joined with fn's error: fn's work may have overlapped
// another holder's. When fn returned first, its error is returned as
// [Run] returns it. d may be 0: fn's ctx has then ended before fn starts.
func LoseLock(d time.Duration) Outcome {
	return Outcome{name: fmt.Sprintf("lose the lock after %v", d), do: func(ctx context.Context, key string, fn func(context.Context) error) error {
		fctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		lost := fmt.Errorf("contendtest: %q: %w", key, contend.ErrLockLost)
		if d <= 0 {
			cancel(lost)
			return errors.Join(lost, fn(fctx))
		}
		t := time.AfterFunc(d, func() { cancel(lost) })
		err := fn(fctx)
		if !t.Stop() { // the loss came first
			return errors.Join(lost, err)
		}
		return err
	}}
}

// Fail does not run fn and returns err, as a guard does when its backend
// fails (a connection reset, a Redis error).
func Fail(err error) Outcome {
	return Outcome{name: fmt.Sprintf("fail: %v", err), do: func(context.Context, string, func(context.Context) error) error {
		return err
	}}
}

// Guard is a [contend.Guard] whose calls answer as a test scripts them:
// the n-th call to Do, whatever its key, has the n-th outcome of the
// script, and every call past the script's end has [Run]'s. The zero
// value runs every call.
//
// A Guard is safe for simultaneous use by multiple goroutines; calls take
// their outcomes in the order they reach Do. It does not keep fns
// exclusive: it scripts answers, it does not guard anything.
type Guard struct {
	mu     sync.Mutex // guards script and keys
	script []Outcome  // the outcomes not taken yet
	keys   []string   // every call's key, in the order the calls came
}

var _ contend.Guard = (*Guard)(nil)

// NewGuard returns a Guard whose calls have the outcomes given, in order.
func NewGuard(script ...Outcome) *Guard {
	return &Guard{script: script}
}

// Do runs the call's scripted outcome for key and fn.
func (g *Guard) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if fn == nil {
		return fmt.Errorf("contendtest: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	g.mu.Lock()
	o := Run()
	if len(g.script) > 0 {
		o, g.script = g.script[0], g.script[1:]
	}
	g.keys = append(g.keys, key)
	g.mu.Unlock()
	return o.do(ctx, key, fn)
}

// Keys returns the key of every call to Do so far, in the order the calls
// came.
func (g *Guard) Keys() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.keys...)
}

// Left returns how many scripted outcomes no call has taken yet: a test
// that scripted every call its code should make can check it is 0.
func (g *Guard) Left() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.script)
}
