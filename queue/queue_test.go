package queue_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// start builds a queue, runs it, and closes it when t ends, checking that
// Run returned cleanly.
func start(t testing.TB, cfg queue.Config) *queue.Queue {
	t.Helper()
	q, err := queue.New(cfg)
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, q.Close(ctx))
		if err := <-ran; !errors.Is(err, contend.ErrClosed) { // Close may come first
			require.NoError(t, err)
		}
	})
	return q
}

func echo(_ context.Context, job queue.Job) ([]byte, error) { return job.Payload, nil }

// stats returns q's Stats, which in memory never fail.
func stats(t testing.TB, q *queue.Queue) queue.Stats {
	t.Helper()
	s, err := q.Stats(t.Context())
	require.NoError(t, err)
	return s
}

// fast retries quickly: tests wait on outcomes, not on backoff.
var fast = contend.Retry{MaxAttempts: 3, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	batch := func(context.Context, []queue.Job) ([]queue.Result, error) { return nil, nil }
	for name, cfg := range map[string]queue.Config{
		"zero partitions":     {Partitions: 0, Handler: echo},
		"negative partitions": {Partitions: -1, Handler: echo},
		"nil handler":         {Partitions: 1},
		"both handlers":       {Partitions: 1, Handler: echo, BatchHandler: batch},
		"negative buffer":     {Partitions: 1, Handler: echo, Buffer: -1},
		"negative max batch":  {Partitions: 1, BatchHandler: batch, MaxBatch: -1},
	} {
		q, err := queue.New(cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
		require.Nil(t, q, name)
	}
}

func TestBadCallInput(t *testing.T) {
	t.Parallel()
	q := start(t, queue.Config{Partitions: 2, Handler: echo})
	ctx := t.Context()
	_, err := q.Submit(ctx, "", nil)
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.ErrorIs(t, q.Enqueue(ctx, "", nil), contend.ErrInvalid)
	require.ErrorIs(t, q.Do(ctx, "k", nil), contend.ErrInvalid)
	require.ErrorIs(t, q.Do(ctx, "", func(context.Context) error { return nil }), contend.ErrInvalid)
}

func TestSubmitReturnsResult(t *testing.T) {
	t.Parallel()
	q := start(t, queue.Config{Partitions: 4, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		return []byte(job.Key + ":" + string(job.Payload)), nil
	}})
	got, err := q.Submit(t.Context(), "sku-1", []byte("buy"))
	require.NoError(t, err)
	require.Equal(t, "sku-1:buy", string(got))
}

func TestPartitionIsStableFNV1a(t *testing.T) {
	t.Parallel()
	q, err := queue.New(queue.Config{Partitions: 16, Handler: echo})
	require.NoError(t, err)
	// Pinning the mapping to FNV-1a 64
	// catches a change of hash, which would move keys between partitions of
	// instances that run different versions.
	require.Equal(t, fnv1a("sku-1")%16, uint64(q.Partition("sku-1")))
	require.Equal(t, fnv1a("hot")%16, uint64(q.Partition("hot")))
	for i := range 100 {
		k := strconv.Itoa(i)
		require.Equal(t, q.Partition(k), q.Partition(k))
	}
}

// fnv1a is the reference: the standard library's hash/fnv, which the
// queue does not use, so the test does not share code with what it checks.
func fnv1a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Jobs of one key run one at a time, in the order each producer submitted
// them, while keys spread over partitions: 8 producers × 40 keys × 25 jobs.
func TestOrderPerKey(t *testing.T) {
	t.Parallel()
	const producers, keys, jobs = 8, 40, 25
	var order workload.KeyOrder
	q := start(t, queue.Config{Partitions: 8, Buffer: 16, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		_, err := order.Handle(job.Key, job.Payload)
		return nil, err
	}})
	workload.Produce(t, producers, keys, jobs, q.Enqueue)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Close(ctx), "Close drains every accepted job")
	require.EqualValues(t, producers*keys*jobs, order.Seen())
	require.Zero(t, order.Bad(), "jobs of one key ran out of order or overlapped")
	require.EqualValues(t, producers*keys*jobs, stats(t, q).Handled)
}

// Submitters that each wait for their answer keep a worker going idle and
// waking between runs of jobs: every one of them gets its own job's answer,
// none is lost or answered twice. (A buffer handed back to producers while
// the worker still read it lost jobs this way.)
func TestSubmitWhileWorkerIdles(t *testing.T) {
	t.Parallel()
	const submitters, jobs = 16, 300
	q := start(t, queue.Config{Partitions: 4, Buffer: 8, Handler: echo})
	workload.Each(t, submitters, func(s int) error {
		for i := range jobs {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			want := fmt.Sprintf("%d/%d", s, i)
			got, err := q.Submit(ctx, "k"+strconv.Itoa((s+i)%3), []byte(want))
			cancel()
			if err == nil && string(got) != want {
				err = fmt.Errorf("submitted %s, answered %s", want, got)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	require.EqualValues(t, submitters*jobs, stats(t, q).Handled)
}

// Keys of different partitions run in parallel: the handler of key a waits
// until key b's has started, which only a queue with more than one worker can
// satisfy.
func TestKeysRunInParallel(t *testing.T) {
	t.Parallel()
	started := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	q := start(t, queue.Config{Partitions: 8, Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		close(started[job.Key])
		other := map[string]string{"a": "b", "b": "a"}[job.Key]
		select {
		case <-started[other]:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}})
	require.NotEqual(t, q.Partition("a"), q.Partition("b"), "the test needs two partitions")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for _, k := range []string{"a", "b"} {
		go func() {
			_, err := q.Submit(ctx, k, nil)
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

// A full buffer gives backpressure: a producer waits until ctx ends, or with
// RefuseWhenFull gets ErrFull at once. Memory stays bounded.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} {
		t.Run("refuse="+strconv.FormatBool(refuse), func(t *testing.T) {
			t.Parallel()
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			q := start(t, queue.Config{Partitions: 1, Buffer: 2, RefuseWhenFull: refuse, Handler: func(context.Context, queue.Job) ([]byte, error) {
				once.Do(func() { close(entered) })
				<-release
				return nil, nil
			}})
			defer close(release)
			require.NoError(t, q.Enqueue(t.Context(), "k", nil))
			<-entered // the worker holds the first job; the buffer is empty
			require.NoError(t, q.Enqueue(t.Context(), "k", nil))
			require.NoError(t, q.Enqueue(t.Context(), "k", nil))
			require.Equal(t, 2, stats(t, q).Depth)
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			err := q.Enqueue(ctx, "k", nil)
			if refuse {
				require.ErrorIs(t, err, queue.ErrFull)
			} else {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.ErrorIs(t, err, contend.ErrConflict, "a wait cut short by ctx is a lost race, as in distlock")
			}
			require.Equal(t, 2, stats(t, q).Depth)
		})
	}
}

// A failing job is redelivered under the retry policy; one that keeps failing
// goes to the dead-letter sink with its error, its submitter learns it, and
// the next job of the same key still runs.
func TestRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	var flaky atomic.Int32
	dead := make(chan queue.DeadLetter, 4)
	events := make(chan contend.Event, 32)
	q := start(t, queue.Config{
		Partitions: 2,
		Retry:      fast,
		DeadLetter: func(d queue.DeadLetter) { dead <- d },
		Observer:   contend.ObserverFunc(func(_ context.Context, e contend.Event) { events <- e }),
		Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
			switch string(job.Payload) {
			case "poison":
				return nil, errPoison
			case "flaky":
				if flaky.Add(1) < 3 {
					return nil, errors.New("transient")
				}
			case "panic":
				panic("boom")
			}
			return job.Payload, nil
		},
	})
	ctx := t.Context()

	got, err := q.Submit(ctx, "k", []byte("flaky"))
	require.NoError(t, err, "the third delivery succeeds")
	require.Equal(t, "flaky", string(got))
	require.EqualValues(t, 2, stats(t, q).Redeliveries)

	before := time.Now()
	_, err = q.Submit(ctx, "k", []byte("poison"))
	require.ErrorIs(t, err, queue.ErrDeadLettered)
	require.ErrorIs(t, err, errPoison)
	d := <-dead
	require.Equal(t, "poison", string(d.Job.Payload))
	require.Equal(t, 3, d.Job.Attempt)
	require.ErrorIs(t, d.Err, errPoison)
	require.Empty(t, d.ID, "in memory nothing keeps dead letters to name")
	require.WithinRange(t, d.At, before, time.Now(), "when it was dead-lettered")

	_, err = q.Submit(ctx, "k", []byte("panic"))
	require.ErrorIs(t, err, queue.ErrPanic, "a panic is an error, not a crash")
	require.ErrorIs(t, (<-dead).Err, queue.ErrPanic)

	got, err = q.Submit(ctx, "k", []byte("after"))
	require.NoError(t, err, "the key moves on after a poison job")
	require.Equal(t, "after", string(got))
	require.EqualValues(t, 2, stats(t, q).DeadLetters)

	// flaky failed twice; poison and panic three times each, then went to
	// the dead letters.
	close(events)
	kinds := map[contend.EventKind]int{}
	for e := range events {
		require.Equal(t, contend.StrategyQueue, e.Strategy)
		require.Equal(t, "k", e.Key)
		require.Error(t, e.Err)
		if e.Kind == contend.EventDeadLettered {
			require.Equal(t, 3, e.Attempts, "dead-lettered on its last delivery")
		}
		kinds[e.Kind]++
	}
	require.Equal(t, map[contend.EventKind]int{contend.EventFailed: 8, contend.EventDeadLettered: 2}, kinds)
}

// A caller whose ctx ends while it waits, for room in a full partition or
// for its job or fn to start, gets an error matching both ErrConflict and
// ctx's error, and the Observer hears that it gave up and after how long.
func TestWaitCutShortIsAConflict(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	events := make(chan contend.Event, 8)
	q := start(t, queue.Config{
		// Room for the withdrawn Submit and Do, which stay in the buffer
		// until the worker skips them, and one more job.
		Partitions: 1, Buffer: 3,
		Observer: contend.ObserverFunc(func(_ context.Context, e contend.Event) { events <- e }),
		Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
			if string(job.Payload) == "block" {
				close(entered)
				<-release
			}
			return nil, nil
		},
	})
	defer close(release)
	require.NoError(t, q.Enqueue(t.Context(), "k", []byte("block")))
	<-entered // the worker holds the first job; the buffer is empty

	const wait = 30 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err := q.Submit(ctx, "k", []byte("late"))
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	ctx, cancel = context.WithTimeout(t.Context(), wait)
	defer cancel()
	err = q.Do(ctx, "k", func(context.Context) error { return errors.New("never runs") })
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.NoError(t, q.Enqueue(t.Context(), "k", []byte("fills the buffer")))
	cause := errors.New("the caller left")
	ctx, cancelCause := context.WithCancelCause(t.Context())
	time.AfterFunc(wait, func() { cancelCause(cause) })
	err = q.Enqueue(ctx, "k", []byte("no room"))
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)

	for range 3 {
		e := <-events
		require.Equal(t, contend.EventGaveUp, e.Kind)
		require.Equal(t, contend.StrategyQueue, e.Strategy)
		require.Equal(t, "k", e.Key)
		require.GreaterOrEqual(t, e.Wait, wait*2/3) // timers may fire early by a tick
		require.ErrorIs(t, e.Err, contend.ErrConflict)
	}
}

// Do, the guard, reports as a lock's hold does: obtained when fn starts,
// released with how long it ran and its error when it returns, each with
// Do's ctx.
func TestDoReportsAsAHold(t *testing.T) {
	t.Parallel()
	type callKey struct{}
	events := make(chan contend.Event, 8)
	q := start(t, queue.Config{
		Partitions: 1, Handler: echo,
		Observer: contend.ObserverFunc(func(ctx context.Context, e contend.Event) {
			if ctx.Value(callKey{}) == nil {
				e.Err = errors.New("no call context")
			}
			events <- e
		}),
	})
	ctx := context.WithValue(t.Context(), callKey{}, "call")
	const work = 20 * time.Millisecond
	errFn := errors.New("fn failed")
	err := q.Do(ctx, "k", func(context.Context) error {
		time.Sleep(work)
		return errFn
	})
	require.ErrorIs(t, err, errFn)
	obtained, released := <-events, <-events
	require.Equal(t, contend.EventObtained, obtained.Kind)
	require.NoError(t, obtained.Err)
	require.Equal(t, contend.EventReleased, released.Kind)
	require.ErrorIs(t, released.Err, errFn)
	for _, e := range []contend.Event{obtained, released} {
		require.Equal(t, contend.StrategyQueue, e.Strategy)
		require.Equal(t, "k", e.Key)
		require.Equal(t, 1, e.Attempts)
		require.Positive(t, e.Wait)
	}
	require.GreaterOrEqual(t, released.Hold, work)
}

// Errors that Retryable rejects are dead-lettered on their first delivery.
func TestNotRetryable(t *testing.T) {
	t.Parallel()
	errFinal := errors.New("final")
	var calls atomic.Int32
	q := start(t, queue.Config{
		Partitions: 1,
		Retry:      fast,
		Retryable:  func(err error) bool { return !errors.Is(err, errFinal) },
		Handler: func(context.Context, queue.Job) ([]byte, error) {
			calls.Add(1)
			return nil, errFinal
		},
	})
	_, err := q.Submit(t.Context(), "k", nil)
	require.ErrorIs(t, err, errFinal)
	require.EqualValues(t, 1, calls.Load())
}

// A submitter that gives up before its job starts withdraws it: it never runs.
func TestSubmitWithdrawnWhenCtxEnds(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var ran atomic.Int32
	q := start(t, queue.Config{Partitions: 1, Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
		if string(job.Payload) == "block" {
			close(entered)
			<-release
			return nil, nil
		}
		ran.Add(1)
		return nil, nil
	}})
	require.NoError(t, q.Enqueue(t.Context(), "k", []byte("block")))
	<-entered
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := q.Submit(ctx, "k", []byte("late"))
	require.ErrorIs(t, err, context.Canceled)
	close(release)
	_, err = q.Submit(t.Context(), "k", []byte("after"))
	require.NoError(t, err)
	require.EqualValues(t, 1, ran.Load(), "only the job after ran; the withdrawn one did not")
}

func TestCloseBeforeRunDrains(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	q, err := queue.New(queue.Config{Partitions: 4, Handler: func(context.Context, queue.Job) ([]byte, error) {
		handled.Add(1)
		return nil, nil
	}})
	require.NoError(t, err)
	for i := range 10 {
		require.NoError(t, q.Enqueue(t.Context(), strconv.Itoa(i), nil))
	}
	require.NoError(t, q.Close(t.Context()))
	require.NoError(t, q.Close(t.Context()), "Close is idempotent")
	require.EqualValues(t, 10, handled.Load(), "jobs accepted before Run still run")
	require.ErrorIs(t, q.Run(t.Context()), contend.ErrClosed)
	require.ErrorIs(t, q.Enqueue(t.Context(), "k", nil), contend.ErrClosed)
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	q := start(t, queue.Config{Partitions: 1, Handler: echo})
	// Run in start may not have begun yet; one of the two calls wins either
	// way, so Submit first to be sure the queue is running.
	_, err := q.Submit(t.Context(), "k", nil)
	require.NoError(t, err)
	require.ErrorIs(t, q.Run(t.Context()), queue.ErrRunning)
}

// Run's ctx ending drains like Close.
func TestRunCtxEndDrains(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	q, err := queue.New(queue.Config{Partitions: 2, Handler: func(context.Context, queue.Job) ([]byte, error) {
		handled.Add(1)
		return nil, nil
	}})
	require.NoError(t, err)
	for i := range 50 {
		require.NoError(t, q.Enqueue(t.Context(), strconv.Itoa(i), nil))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, q.Run(ctx), context.Canceled)
	require.EqualValues(t, 50, handled.Load())
}

// Close under load loses no accepted job: every Enqueue that returned nil is
// handled before Close returns, and the others say contend.ErrClosed.
func TestCloseUnderLoadLosesNothing(t *testing.T) {
	t.Parallel()
	var handled atomic.Int64
	q, err := queue.New(queue.Config{Partitions: 4, Buffer: 8, Handler: func(context.Context, queue.Job) ([]byte, error) {
		handled.Add(1)
		return nil, nil
	}})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(context.Background()) }()

	var (
		accepted atomic.Int64
		wg       sync.WaitGroup
		half     = make(chan struct{})
		halfOnce sync.Once
		bad      = make(chan error, 16)
	)
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				err := q.Enqueue(context.Background(), fmt.Sprintf("k%d-%d", g, i%7), nil)
				if errors.Is(err, contend.ErrClosed) {
					return
				}
				if err != nil {
					bad <- err
					return
				}
				if accepted.Add(1) == 2000 {
					halfOnce.Do(func() { close(half) })
				}
			}
		})
	}
	<-half
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Close(ctx))
	wg.Wait()
	close(bad)
	for err := range bad {
		require.NoError(t, err)
	}
	require.NoError(t, <-ran)
	require.Equal(t, accepted.Load(), handled.Load(), "accepted jobs were lost")
}

// When Close's ctx ends before the drain, running handlers see their ctx
// cancelled, waiting jobs are answered contend.ErrClosed, and Close returns ctx's
// error.
func TestCloseDeadlineAborts(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	q, err := queue.New(queue.Config{Partitions: 1, Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
		if string(job.Payload) == "block" {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, nil
	}, Retry: fast})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(context.Background()) }()

	blocked := make(chan error, 1)
	go func() {
		_, err := q.Submit(context.Background(), "k", []byte("block"))
		blocked <- err
	}()
	<-entered
	waiting := make(chan error, 1)
	require.NoError(t, q.Enqueue(t.Context(), "k", nil))
	go func() {
		_, err := q.Submit(context.Background(), "k", []byte("waits"))
		waiting <- err
	}()
	for stats(t, q).Depth < 2 {
		// Wait for the second submit to reach the buffer; Depth is the
		// signal, and Gosched keeps the loop from starving it.
		runtime.Gosched()
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, q.Close(ctx), context.Canceled)
	require.ErrorIs(t, <-blocked, context.Canceled, "the running handler's ctx was cancelled")
	require.ErrorIs(t, <-waiting, contend.ErrClosed)
	require.NoError(t, <-ran)
}

// Close returns by its ctx's deadline even when a handler does not heed its
// ctx; the worker finishes when the handler returns, and Run after it.
func TestCloseReturnsByDeadline(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	q, err := queue.New(queue.Config{Partitions: 1, Handler: func(context.Context, queue.Job) ([]byte, error) {
		close(entered)
		<-release // ignores its ctx
		return []byte("late"), nil
	}})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- q.Run(context.Background()) }()
	answer := make(chan error, 1)
	go func() {
		_, err := q.Submit(context.Background(), "k", nil)
		answer <- err
	}()
	<-entered
	stuck := time.AfterFunc(3*time.Second, func() { close(release) })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	require.ErrorIs(t, q.Close(ctx), context.DeadlineExceeded)
	took := time.Since(began)
	if stuck.Stop() {
		close(release)
	}
	require.Less(t, took, time.Second, "Close waited for a handler past its ctx's deadline")
	require.NoError(t, <-answer, "the handler's job is answered when it returns")
	require.NoError(t, <-ran)
	require.NoError(t, q.Close(t.Context()), "a later Close waits for the workers, which are gone")
}
