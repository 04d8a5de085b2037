package queue_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/queue"
)

// The in-memory queue is a Guard for one process: the whole conformance
// suite, with its run across three OS processes turned into the negative
// result the package doc promises (three processes, three queues, and the
// read-modify-write loses updates, because each queue keeps only its own
// goroutines apart).

// The queue touches no database: only the suite's fn does, through the
// driver named here, so one driver is enough.
var guardSuite = guardtest.Suite{
	Driver:        "pgx",
	New:           func(t testing.TB, _ guardtest.Env) contend.Guard { return newGuard(t) },
	Exclusive:     true,
	SingleProcess: true,
	Ops:           16,
}

func newGuard(t testing.TB) *queue.Queue {
	return start(t, queue.Config{Partitions: 4, Handler: echo})
}

func TestQueueIsAGuard(t *testing.T) { guardtest.Run(t, guardSuite) }

func TestGuardContract(t *testing.T) {
	t.Parallel()
	t.Run("jobs_and_fns_of_a_key_exclude_each_other", func(t *testing.T) {
		t.Parallel()
		var inside, overlaps atomic.Int32
		enter := func() {
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
		}
		q := start(t, queue.Config{Partitions: 2, BatchHandler: func(_ context.Context, jobs []queue.Job) ([]queue.Result, error) {
			enter()
			defer inside.Add(-1)
			return make([]queue.Result, len(jobs)), nil
		}})
		errs := make(chan error, 200)
		for i := range 100 {
			go func() {
				if i%2 == 0 {
					errs <- q.Enqueue(t.Context(), "k", nil)
					return
				}
				errs <- q.Do(t.Context(), "k", func(context.Context) error {
					enter()
					inside.Add(-1)
					return nil
				})
			}()
		}
		for range 100 {
			require.NoError(t, <-errs)
		}
		require.NoError(t, q.Do(t.Context(), "k", func(context.Context) error { return nil }))
		require.Zero(t, overlaps.Load())
	})
}
