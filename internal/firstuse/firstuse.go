// Package firstuse runs a step that needs the server (a check of a handle,
// the preparation of statements) at the first call that needs it rather
// than at construction, so that constructors do no I/O: under that call's
// ctx, once, remembered only when it succeeded.
package firstuse

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/contend/contend/internal/ctxerr"
)

// A Step is one such step. The first call that needs it makes it, under
// its own ctx; calls that come meanwhile wait for that one, each no longer
// than its own ctx, and take its answer when it passed or failed for good,
// or make the step themselves when it failed for a reason that says
// nothing of theirs (the first call's ctx ended, the network failed). The
// zero value is ready to use; a Step must not be copied.
type Step struct {
	passed atomic.Bool // set once, when the step passed; read without mu

	mu      sync.Mutex
	running *run // protected by mu; nil when no call makes the step
}

// run is one making of the step; err is set before done is closed.
type run struct {
	done    chan struct{}
	err     error
	waiters int // callers that waited for it; protected by Step.mu
}

// Passed reports whether the step has passed, at the cost of one atomic
// load.
func (s *Step) Passed() bool { return s.passed.Load() }

// Pass returns nil once the step passed, making it with do under ctx, or
// waiting for another call's making of it, when it has not. final reports
// whether an error of do's holds for every caller (the handle is refused),
// so that callers waiting meanwhile take it rather than make the step
// again; nil means none does. A caller whose ctx ends while it waits gets
// an error that matches ctx's error, beginning with what (the step's name,
// prefixed with its package's).
func (s *Step) Pass(ctx context.Context, what string, do func(context.Context) error, final func(error) bool) error {
	if s.passed.Load() {
		return nil
	}
	for {
		s.mu.Lock()
		if s.passed.Load() {
			s.mu.Unlock()
			return nil
		}
		r, mine := s.running, s.running == nil
		if mine {
			r = &run{done: make(chan struct{})}
			s.running = r
		} else {
			r.waiters++
		}
		s.mu.Unlock()
		if mine {
			return s.make(ctx, r, do)
		}
		select {
		case <-r.done:
			if r.err == nil || (final != nil && final(r.err)) {
				return r.err
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: waited for another call to make it: %w", what, ctxerr.Of(ctx))
		}
	}
}

// make runs do as r and ends r, also when do panics: the callers waiting
// for r then make the step themselves, and the panic goes on.
func (s *Step) make(ctx context.Context, r *run, do func(context.Context) error) error {
	r.err = errPanicked
	defer func() {
		s.mu.Lock()
		s.running = nil
		s.passed.Store(r.err == nil)
		s.mu.Unlock()
		close(r.done)
	}()
	r.err = do(ctx)
	return r.err
}

var errPanicked = errors.New("the step panicked")
