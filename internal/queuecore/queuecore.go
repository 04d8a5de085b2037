// Package queuecore holds what package queue's two backends, the in-memory
// Queue and package redisq's Redis Streams queue, do the same way, and users
// must not call: the mapping of keys to partitions, running a handler so
// that its panic becomes an error, counting a partition's work, and the
// events they report.
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

// PartitionOf returns the partition of key among n: FNV-1a 64 of the key's
// bytes, modulo n. The hash is stable across processes and Go versions, so
// instances, and backends, that agree on n agree on the mapping.
func PartitionOf(key string, n int) int {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return int(h % uint64(n))
}

// Counters are one partition's running totals, as both backends keep them:
// jobs running, handled, delivered again, and dead letters. Safe for
// concurrent use.
type Counters struct {
	InFlight, Handled, Redeliveries, DeadLetters atomic.Int64
}

// Figures has the fields of package queue's PartitionStats, in its order,
// so that the one converts to the other: both backends make their Stats
// with Snapshot and Add.
type Figures struct {
	Depth                                        int
	InFlight, Handled, Redeliveries, DeadLetters int64
}

// Snapshot returns c's totals now, with depth, the jobs waiting.
func (c *Counters) Snapshot(depth int) Figures {
	return Figures{
		Depth:        depth,
		InFlight:     c.InFlight.Load(),
		Handled:      c.Handled.Load(),
		Redeliveries: c.Redeliveries.Load(),
		DeadLetters:  c.DeadLetters.Load(),
	}
}

// Add adds o's figures to f.
func (f *Figures) Add(o Figures) {
	f.Depth += o.Depth
	f.InFlight += o.InFlight
	f.Handled += o.Handled
	f.Redeliveries += o.Redeliveries
	f.DeadLetters += o.DeadLetters
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
