// Package queuecore holds what package queue's two backends, the in-memory
// Queue and package redisq's Redis Streams queue, do the same way, and users
// must not call: running a handler so that its panic becomes an error,
// counting a partition's work, and the error of a caller who stopped
// waiting.
package queuecore

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/contend/contend"
)

// ErrPanic is package queue's ErrPanic: a handler panicked.
var ErrPanic = errors.New("queue: handler panicked")

// Call runs h on job. A panic in h comes back as an error matching
// [ErrPanic], with the stack, so that one bad job cannot crash the process.
func Call[J, V any](ctx context.Context, h func(context.Context, J) (V, error), job J) (value V, err error) {
	defer recoverAsError(&err)
	return h(ctx, job)
}

// CallBatch runs h on a copy of jobs (h may keep or change its slice) and
// checks that it returned one result per job. A panic in h comes back as an
// error matching [ErrPanic], with the stack.
func CallBatch[J, R any](ctx context.Context, h func(context.Context, []J) ([]R, error), jobs []J) (results []R, err error) {
	defer recoverAsError(&err)
	results, err = h(ctx, append([]J(nil), jobs...))
	if err == nil && len(results) != len(jobs) {
		err = fmt.Errorf("queue: batch handler returned %d results for %d jobs", len(results), len(jobs))
	}
	return results, err
}

func recoverAsError(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v\n%s", ErrPanic, r, debug.Stack())
	}
}

// Counters are one partition's running totals, as both backends keep them:
// jobs running, handled, delivered again, and dead letters. Safe for
// concurrent use.
type Counters struct {
	InFlight, Handled, Redeliveries, DeadLetters atomic.Int64
}

// Strategy is the Strategy of both backends' events.
const Strategy = contend.StrategyQueue

// Report reports an event of a job for key, its attempts-th delivery or
// call, to o if set. began is when the caller began to wait, for
// contend.EventGaveUp; zero when it does not apply.
func Report(ctx context.Context, o contend.Observer, kind contend.EventKind, key string, began time.Time, attempts int, err error) {
	if o == nil {
		return
	}
	e := contend.Event{Kind: kind, Strategy: Strategy, Key: key, Attempts: attempts, Err: err}
	if !began.IsZero() {
		e.Wait = time.Since(began)
	}
	o.Observe(ctx, e)
}
