package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
	"github.com/contend/contend/internal/queuecore"
)

// ErrFull reports that a job's partition buffer was full and the queue is
// configured to refuse rather than wait ([Config.RefuseWhenFull]).
var ErrFull = errors.New("queue: full")

// ErrDeadLettered reports that a job failed on every delivery it was allowed
// and went to the dead-letter sink. Submit returns it joined with the
// handler's last error.
var ErrDeadLettered = errors.New("queue: dead-lettered")

// ErrPanic reports that a handler panicked. The panic is turned into an error
// (and retried like one) so that one bad job cannot crash the process.
var ErrPanic = queuecore.ErrPanic

// ErrRunning reports a second call of Run.
var ErrRunning = errors.New("queue: already running")

// A Job is what a handler gets: the key that chose its partition, the payload
// it was submitted with, and how many times it has been delivered so far (1 on
// the first delivery).
type Job struct {
	Key     string // the key that chose the job's partition
	Payload []byte // as submitted
	Attempt int    // the delivery, 1 for the first
}

// A Handler processes one job and returns its result. An error is retried
// under [Config.Retry]; a job that fails on every attempt is dead-lettered.
// Answers such as "sold out" belong in the result, not in the error.
type Handler func(ctx context.Context, job Job) ([]byte, error)

// A BatchHandler processes up to [Config.MaxBatch] consecutive jobs of one
// partition at once, in submit order, and returns one [Result] per job, in the
// same order. A Result's Err is that job's final answer and is not retried.
//
// A non-nil error fails the whole batch. No job is delivered more than
// [Config.Retry]'s MaxAttempts times in all: the batch is delivered again
// whole, under Retry, while its jobs have more than one delivery left, and
// then each job gets its last delivery alone, in order, so only the job that
// keeps failing is dead-lettered and the others get their answers (with
// MaxAttempts 1, the whole delivery and the one alone make two). A batch of
// n jobs that keeps failing, as in a database outage, so costs at most
// MaxAttempts−1+n calls and MaxAttempts−1 of Retry's waits, the partition
// waiting meanwhile, before its jobs are dead-lettered.
//
// Since a failed batch runs again, whole and then job by job, a batch
// handler that returns an error must leave nothing applied (do the batch's
// writes in one transaction) or make each job's effect idempotent.
type BatchHandler func(ctx context.Context, jobs []Job) ([]Result, error)

// Result is one job's answer from a [BatchHandler].
type Result struct {
	Value []byte // the job's answer, as a Handler returns it
	Err   error  // the job's final answer, not retried (unlike the batch's error)
}

// A DeadLetter is a job that failed on every delivery [Config.Retry]
// allowed, with its last error: what [Config.DeadLetter] receives in
// memory, and what package redisq's Queue.DeadLetters lists from a
// partition's dead-letter stream.
type DeadLetter struct {
	// ID names the dead letter within its partition's dead-letter stream,
	// for redisq's Queue.RequeueDeadLetters and Queue.DeleteDeadLetters;
	// IDs grow in the order jobs were dead-lettered. Empty in memory,
	// where nothing keeps dead letters but [Config.DeadLetter].
	ID string
	// Job is the job as its last delivery had it: its Key and Payload, and
	// in Attempt the deliveries it had (in redisq, counted across
	// instances).
	Job Job
	// Err is what the last delivery returned. From redisq's dead-letter
	// stream it matches redisq.ErrRemote and carries the handler's message:
	// the error's type does not survive Redis.
	Err error
	// At is when the job was dead-lettered: by this process's clock in
	// memory, by Redis's to the millisecond in redisq.
	At time.Time
}

// Config configures a [Queue]. Partitions and exactly one of Handler and
// BatchHandler must be set; every other field has a default, which its doc
// states: the zero value of the field takes it.
type Config struct {
	// Partitions is how many partitions, and so worker goroutines, the queue
	// has. Required: there is no default, because the number decides which
	// keys share a worker, and a queue across instances must agree on it.
	Partitions int
	// Buffer is how many jobs wait in each partition before producers wait
	// (or get ErrFull). The worker takes every waiting job at once, so a
	// partition holds at most twice Buffer: those waiting and those it is
	// working through. Default: 1024.
	Buffer int
	// RefuseWhenFull makes Submit, Enqueue and Do answer a full partition with
	// ErrFull at once instead of waiting for room until ctx ends. Default:
	// false (wait).
	RefuseWhenFull bool
	// Handler processes one job.
	Handler Handler
	// BatchHandler processes consecutive jobs of a partition together.
	BatchHandler BatchHandler
	// MaxBatch bounds the jobs a BatchHandler gets at once. Default: 100.
	MaxBatch int
	// Retry bounds the deliveries of a failing job (MaxAttempts, the first
	// included) and the wait between them. The partition waits too: a later
	// job of the key must not overtake a failing one. Default: the zero
	// [contend.Retry], 10 deliveries.
	Retry contend.Retry
	// Retryable says which handler errors are worth another delivery; the
	// others dead-letter the job at once. Default: every error.
	Retryable func(error) bool
	// DeadLetter receives jobs that failed on every delivery, on the
	// partition's worker goroutine, before the partition moves on: keep it
	// short. Default: none (the job is dropped after its submitter, if it
	// waits, gets ErrDeadLettered).
	DeadLetter func(DeadLetter)
	// Observer, when set, hears of failed deliveries (contend.EventFailed,
	// Attempts the delivery, Err the handler's error) and dead letters
	// (contend.EventDeadLettered), on the partition's worker goroutine,
	// and of callers whose ctx ended while they waited for room or for
	// their job to start (contend.EventGaveUp), on theirs. Jobs handled
	// at once report nothing: count them with [Queue.Stats]. [Queue.Do]
	// reports as a lock does: contend.EventObtained when fn starts (Wait,
	// since Do was called), contend.EventReleased when it returns (Hold,
	// and fn's error), with Do's ctx. It must not block. Default: nil, no
	// events, at no cost.
	Observer contend.Observer
}

// The defaults of [Config]'s fields, which their docs state.
const (
	defaultBuffer   = 1024
	defaultMaxBatch = 100
)

func (c Config) validate() (Config, error) {
	switch {
	case c.Partitions <= 0:
		return c, fmt.Errorf("queue: partitions %d, want at least 1: %w", c.Partitions, contend.ErrInvalid)
	case c.Handler == nil && c.BatchHandler == nil:
		return c, fmt.Errorf("queue: nil handler: %w", contend.ErrInvalid)
	case c.Handler != nil && c.BatchHandler != nil:
		return c, fmt.Errorf("queue: both Handler and BatchHandler set: %w", contend.ErrInvalid)
	case c.Buffer < 0:
		return c, fmt.Errorf("queue: buffer %d: %w", c.Buffer, contend.ErrInvalid)
	case c.MaxBatch < 0:
		return c, fmt.Errorf("queue: max batch %d: %w", c.MaxBatch, contend.ErrInvalid)
	}
	if c.Buffer == 0 {
		c.Buffer = defaultBuffer
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	}
	return c, nil
}

// Queue is the in-memory backend: jobs wait in one bounded buffer per
// partition, and one goroutine per partition runs them in order. It holds
// within one process only: two processes with a Queue each run one key's jobs
// in parallel.
//
// Submit, Enqueue and Do may be called before Run (jobs wait in the buffers)
// and from many goroutines at once. Close drains: it stops taking jobs, runs
// every accepted one, and waits for the workers. Once Close was called,
// Submit, Enqueue, Do and Run return [contend.ErrClosed].
type Queue struct {
	cfg   Config
	parts []part

	startOnce sync.Once
	closing   atomic.Bool // set by the first Close, before it starts the workers
	closeOnce sync.Once
	cancel    context.CancelFunc // cancels handlers' ctx when a drain is cut short
	abort     chan struct{}      // closed when Close's ctx ends before the drain does
	abortOnce sync.Once
	abortFlag atomic.Bool   // set with abort, cheaper to check per job
	done      chan struct{} // closed when every worker has returned

	stats counters
}

var (
	_ contend.Guard = (*Queue)(nil)
	_ Backend       = (*Queue)(nil)
)

// Backend is the API both backends offer: this package's in-memory [Queue]
// and package redisq's Redis Streams queue. Code written against it moves
// from one process to many instances without change (the handlers must then
// be idempotent: see the package doc).
type Backend interface {
	// Submit puts a job for key in its partition and waits for its result.
	Submit(ctx context.Context, key string, payload []byte) ([]byte, error)
	// Enqueue puts a job for key in its partition and returns.
	Enqueue(ctx context.Context, key string, payload []byte) error
	// Run consumes partitions until ctx ends or Close is called.
	Run(ctx context.Context) error
	// Close stops taking jobs and waits for Run's workers, until ctx ends.
	Close(ctx context.Context) error
}

// part is one partition's buffer: a slice under a mutex rather than a
// channel. Producers append under the lock; the worker takes everything
// waiting in one go, so it pays one lock per run of jobs instead of a
// channel receive per job, and a hot partition's producers wait on the
// worker less.
type part struct {
	mu     sync.Mutex    // protects the fields below
	items  []item        // waiting jobs, oldest first; at most Config.Buffer
	closed bool          // no more puts; the worker stops once items is empty
	room   chan struct{} // while producers wait for room: closed when the worker takes
	ready  chan struct{} // one token: items became non-empty, or the part closed
	_      [64]byte
}

// put appends it unless the part is full or closed. When full, it returns
// the channel that is closed once there is room.
func (pt *part) put(it item, limit int) (room <-chan struct{}, err error) {
	pt.mu.Lock()
	if pt.closed {
		pt.mu.Unlock()
		return nil, contend.ErrClosed
	}
	if len(pt.items) >= limit {
		if pt.room == nil {
			pt.room = make(chan struct{})
		}
		room = pt.room
		pt.mu.Unlock()
		return room, nil
	}
	pt.items = append(pt.items, it)
	first := len(pt.items) == 1
	pt.mu.Unlock()
	if first {
		pt.signal()
	}
	return nil, nil
}

// signal wakes the worker if it waits; a token already there will do.
func (pt *part) signal() {
	select {
	case pt.ready <- struct{}{}:
	default:
	}
}

// takeAll hands the worker every waiting job, leaving spare's storage as the
// new buffer, and lets producers waiting for room retry. closed reports that
// no job will come after these.
func (pt *part) takeAll(spare []item) (items []item, closed bool) {
	pt.mu.Lock()
	items, pt.items = pt.items, spare[:0]
	closed = pt.closed
	if pt.room != nil && len(items) > 0 {
		close(pt.room)
		pt.room = nil
	}
	pt.mu.Unlock()
	return items, closed
}

func (pt *part) close() {
	pt.mu.Lock()
	pt.closed = true
	pt.mu.Unlock()
	pt.signal()
}

func (pt *part) depth() int {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return len(pt.items)
}

// New returns a queue for cfg. It starts no goroutine: call Run.
func New(cfg Config) (*Queue, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	q := &Queue{
		cfg:   cfg,
		parts: make([]part, cfg.Partitions),
		abort: make(chan struct{}),
		done:  make(chan struct{}),
	}
	for i := range q.parts {
		q.parts[i].ready = make(chan struct{}, 1)
	}
	q.stats.partitions = make([]partitionCounters, cfg.Partitions)
	return q, nil
}

// Partition returns the partition of key among the queue's: FNV-1a 64 of
// the key's bytes, modulo Partitions. The hash is stable across processes
// and Go versions, so queues, and package redisq's, that agree on
// Partitions agree on the mapping.
func (q *Queue) Partition(key string) int { return queuecore.PartitionOf(key, len(q.parts)) }

// Run starts one worker per partition and blocks until the queue is closed,
// then returns nil; or until ctx ends, then it drains like Close without a
// deadline and returns ctx's error. Handlers run with a ctx that carries
// ctx's values but not its cancellation, so a drain can finish. A second Run,
// or Run after Close, returns an error.
func (q *Queue) Run(ctx context.Context) error {
	if !q.start(ctx) {
		if q.closing.Load() {
			return contend.ErrClosed
		}
		return ErrRunning
	}
	select {
	case <-q.done:
		return nil
	case <-ctx.Done():
		_ = q.Close(context.WithoutCancel(ctx))
		return context.Cause(ctx)
	}
}

// start launches the workers once; it reports whether this call did.
func (q *Queue) start(ctx context.Context) bool {
	ok := false
	q.startOnce.Do(func() {
		ok = true
		hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		q.cancel = cancel
		var wg sync.WaitGroup
		for p := range q.parts {
			wg.Go(func() { q.work(hctx, p) })
		}
		go func() {
			wg.Wait()
			cancel()
			close(q.done)
		}()
	})
	return ok
}

// Close stops taking jobs, runs every job already accepted, and waits for the
// workers. When ctx ends first it cancels the running handlers' ctx, has the
// jobs not yet started answered with [contend.ErrClosed], and returns ctx's error at
// once: a handler that does not heed its ctx keeps its worker running until
// it returns, and the jobs waiting behind it are answered then. A later
// Close waits for the workers again. Close works before Run (it then runs
// the buffered jobs itself) and is idempotent.
func (q *Queue) Close(ctx context.Context) error {
	q.closeOnce.Do(func() {
		q.closing.Store(true)
		q.start(context.Background())
		for i := range q.parts {
			q.parts[i].close()
		}
	})
	select {
	case <-q.done:
		return nil
	case <-ctx.Done():
		q.abortOnce.Do(func() {
			q.abortFlag.Store(true)
			close(q.abort)
			q.cancel()
		})
		return context.Cause(ctx)
	}
}

// Submit puts a job for key in its partition and waits for its result. If ctx
// ends before the job starts, the job is withdrawn, never runs, and Submit
// returns an error matching both [contend.ErrConflict] and ctx's error;
// once it has started, Submit waits for its answer, so the caller always
// learns whether it happened. A job that failed on every delivery returns
// an error matching [ErrDeadLettered] and the handler's error.
func (q *Queue) Submit(ctx context.Context, key string, payload []byte) ([]byte, error) {
	began := q.clock()
	w := &waiter{reply: make(chan outcome, 1)}
	if err := q.put(ctx, item{key: key, payload: payload, w: w}); err != nil {
		return nil, err
	}
	o, err := w.await(ctx)
	if err != nil {
		return nil, q.gaveUp(ctx, key, began, "job withdrawn before it started", err)
	}
	return o.value, o.err
}

// Enqueue puts a job for key in its partition and returns once it is
// accepted: fire and forget. In memory, "accepted" means in this process's
// buffer: it is lost if the process dies. When ctx ends while Enqueue waits
// for room in a full partition, it returns an error matching both
// [contend.ErrConflict] and ctx's error, as Submit and Do do.
func (q *Queue) Enqueue(ctx context.Context, key string, payload []byte) error {
	return q.put(ctx, item{key: key, payload: payload})
}

// Do runs fn on key's partition worker and returns fn's error: no two fns (or
// jobs) for one key overlap, within this process only. fn gets ctx; if ctx
// ends before fn starts, fn never runs, and Do returns an error matching
// both [contend.ErrConflict] and ctx's error. A panic in fn is re-raised in
// the caller of Do.
func (q *Queue) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if fn == nil {
		return fmt.Errorf("queue: nil fn: %w", contend.ErrInvalid)
	}
	began := q.clock()
	w := &waiter{fn: fn, ctx: ctx, began: began, reply: make(chan outcome, 1)}
	if err := q.put(ctx, item{key: key, w: w}); err != nil {
		return err
	}
	o, err := w.await(ctx)
	if err != nil {
		return q.gaveUp(ctx, key, began, "fn withdrawn before it started", err)
	}
	if o.panicked {
		panic(o.panicValue)
	}
	return o.err
}

func (q *Queue) put(ctx context.Context, it item) error {
	if it.key == "" {
		return fmt.Errorf("queue: empty key: %w", contend.ErrInvalid)
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	pt := &q.parts[q.Partition(it.key)]
	var began time.Time // of the wait for room, when observed
	for {
		room, err := pt.put(it, q.cfg.Buffer)
		if room == nil {
			return err
		}
		if q.cfg.RefuseWhenFull {
			return fmt.Errorf("queue: partition of %s: %w", it.key, ErrFull)
		}
		if began.IsZero() {
			began = q.clock()
		}
		select {
		case <-room:
		case <-ctx.Done():
			return q.gaveUp(ctx, it.key, began, "waited for room in its partition", ctxerr.Of(ctx))
		case <-q.abort:
			return contend.ErrClosed
		}
	}
}

// item is a job in a buffer. It is a value, so that Enqueue allocates
// nothing: only a caller that waits (Submit, Do) adds a waiter.
type item struct {
	key     string
	payload []byte
	w       *waiter // nil for Enqueue
}

// waiter is the caller's side of a job it waits for.
type waiter struct {
	fn    func(context.Context) error // set for Do
	ctx   context.Context             // Do's ctx, handed to fn
	began time.Time                   // when Do was called, if observed
	reply chan outcome                // buffered, so a worker never waits on it
	state atomic.Int32                // pending, running or withdrawn
}

const (
	pending = iota
	running
	withdrawn
)

type outcome struct {
	value      []byte
	err        error
	panicked   bool
	panicValue any
}

// take claims it for running; false means its submitter withdrew it.
func (it item) take() bool { return it.w == nil || it.w.state.CompareAndSwap(pending, running) }

func (it item) answer(o outcome) {
	if it.w != nil {
		it.w.reply <- o
	}
}

func (it item) isFn() bool { return it.w != nil && it.w.fn != nil }

// await waits for it's outcome. When ctx ends first and it has not started, it
// is withdrawn and await returns ctx's error; once started, await waits for
// the outcome, so a caller never gives up on a job that is running.
func (w *waiter) await(ctx context.Context) (outcome, error) {
	select {
	case o := <-w.reply:
		return o, nil
	case <-ctx.Done():
		if w.state.CompareAndSwap(pending, withdrawn) {
			return outcome{}, ctxerr.Of(ctx)
		}
		return <-w.reply, nil
	}
}

// work consumes partition p until it is closed and empty: it takes every
// waiting job at once and runs them in order.
func (q *Queue) work(ctx context.Context, p int) {
	var (
		pt    = &q.parts[p]
		pc    = &q.stats.partitions[p]
		spare []item
		batch []item
	)
	for {
		// takeAll made spare's storage the buffer: items' is the next spare.
		items, closed := pt.takeAll(spare)
		if len(items) == 0 {
			spare = items
			if closed {
				return
			}
			<-pt.ready
			continue
		}
		batch = q.runItems(ctx, pc, items, batch)
		clear(items) // let the jobs' payloads go
		spare = items
	}
}

// runItems runs items in order: a guard's fn alone and in its place, the
// jobs between them one by one or, with a BatchHandler, in batches of up to
// MaxBatch. Jobs whose submitter withdrew are skipped. batch is scratch
// space, returned for reuse.
func (q *Queue) runItems(ctx context.Context, pc *partitionCounters, items, batch []item) []item {
	for i := 0; i < len(items); {
		if it := items[i]; it.isFn() {
			i++
			pc.waiting(items, i)
			if !it.take() {
				continue
			}
			if q.aborted() {
				it.answer(outcome{err: contend.ErrClosed})
				continue
			}
			q.runFn(it.key, it.w)
			continue
		}
		if q.cfg.BatchHandler == nil {
			i = q.runPlain(ctx, pc, items, i)
			continue
		}
		batch = batch[:0]
		for ; i < len(items) && len(batch) < q.cfg.MaxBatch && !items[i].isFn(); i++ {
			if items[i].take() {
				batch = append(batch, items[i])
			}
		}
		pc.waiting(items, i)
		if len(batch) == 0 {
			continue
		}
		pc.InFlight.Add(int64(len(batch)))
		if q.aborted() {
			for _, it := range batch {
				it.answer(outcome{err: contend.ErrClosed})
			}
		} else {
			q.runBatch(ctx, pc, batch)
		}
		pc.InFlight.Add(-int64(len(batch)))
		clear(batch)
	}
	return batch
}

func (q *Queue) aborted() bool { return q.abortFlag.Load() }

// runFn runs Do's fn for key and answers its caller; an Observer hears of
// it as of a lock's hold: obtained when fn starts, released when it returns.
func (q *Queue) runFn(key string, w *waiter) {
	if w.ctx.Err() != nil {
		w.reply <- outcome{err: q.gaveUp(w.ctx, key, w.began, "fn withdrawn before it started", ctxerr.Of(w.ctx))}
		return
	}
	var started time.Time
	if q.cfg.Observer != nil {
		started = time.Now()
		q.cfg.Observer.Observe(w.ctx, contend.Event{
			Kind: contend.EventObtained, Strategy: queuecore.Strategy, Key: key, Wait: started.Sub(w.began), Attempts: 1,
		})
	}
	var o outcome
	func() {
		defer func() {
			if r := recover(); r != nil {
				o = outcome{panicked: true, panicValue: r}
			}
		}()
		o.err = w.fn(w.ctx)
	}()
	if q.cfg.Observer != nil {
		err := o.err
		if o.panicked {
			err = fmt.Errorf("%w: %v", ErrPanic, o.panicValue)
		}
		q.cfg.Observer.Observe(w.ctx, contend.Event{
			Kind: contend.EventReleased, Strategy: queuecore.Strategy, Key: key,
			Wait: started.Sub(w.began), Hold: time.Since(started), Attempts: 1, Err: err,
		})
	}
	w.reply <- o
}

func (q *Queue) retryable(err error) bool {
	return q.cfg.Retryable == nil || q.cfg.Retryable(err)
}

// runPlain runs the plain handler on items from i up to the next guard's
// fn, in order; the counters are updated once for all of them. It returns
// the index of the first item it did not run.
func (q *Queue) runPlain(ctx context.Context, pc *partitionCounters, items []item, i int) int {
	pc.InFlight.Add(1)
	handled := 0
	for ; i < len(items) && !items[i].isFn(); i++ {
		it := items[i]
		pc.waiting(items, i+1)
		if !it.take() {
			continue
		}
		if q.aborted() {
			it.answer(outcome{err: contend.ErrClosed})
		} else if q.runOne(ctx, pc, it) {
			handled++
		}
	}
	pc.Handled.Add(int64(handled))
	pc.InFlight.Add(-1)
	return i
}

// runOne runs the plain handler on it and answers it; it reports whether the
// handler succeeded.
func (q *Queue) runOne(ctx context.Context, pc *partitionCounters, it item) bool {
	job := Job{Key: it.key, Payload: it.payload, Attempt: 1}
	// The first delivery runs outside the retry loop: most jobs succeed at
	// once, and the loop's closure would cost an allocation per job.
	value, err := queuecore.Call(ctx, q.cfg.Handler, job)
	if err != nil {
		value, err = q.redeliver(ctx, pc, job, err)
	}
	it.answer(outcome{value: value, err: err})
	return err == nil
}

// redeliver runs a job whose first delivery failed with err again, under the
// retry policy, and dead-letters it when every delivery failed.
func (q *Queue) redeliver(ctx context.Context, pc *partitionCounters, job Job, err error) ([]byte, error) {
	q.failed(ctx, job, err)
	if !q.retryable(err) || q.cfg.Retry.Attempts() <= 1 {
		return nil, q.deadLetter(ctx, pc, job, err)
	}
	if werr := q.cfg.Retry.Wait(ctx, 1); werr != nil {
		return nil, q.deadLetter(ctx, pc, job, fmt.Errorf("%w (after 1 attempt: %w)", werr, err))
	}
	retry := q.cfg.Retry
	retry.MaxAttempts = retry.Attempts() - 1 // the first delivery is spent
	var value []byte
	_, err = retry.Do(ctx, func(ctx context.Context) error {
		job.Attempt++
		pc.Redeliveries.Add(1)
		var err error
		if value, err = queuecore.Call(ctx, q.cfg.Handler, job); err != nil {
			q.failed(ctx, job, err)
		}
		return err
	}, q.retryable)
	if err != nil {
		return nil, q.deadLetter(ctx, pc, job, err)
	}
	return value, nil
}

// runBatch runs items through the batch handler and answers them, under the
// policy [BatchHandler] states: the batch whole while each job has more
// than one delivery left, then each job's last delivery alone.
func (q *Queue) runBatch(ctx context.Context, pc *partitionCounters, items []item) {
	jobs := make([]Job, len(items))
	for i, it := range items {
		jobs[i] = Job{Key: it.key, Payload: it.payload}
	}
	whole := q.cfg.Retry
	if len(items) > 1 {
		whole.MaxAttempts = max(whole.Attempts()-1, 1)
	}
	var results []Result
	_, err := whole.Do(ctx, func(ctx context.Context) error {
		var err error
		results, err = q.deliverBatch(ctx, pc, jobs)
		return err
	}, q.retryable)
	if err == nil {
		pc.Handled.Add(int64(len(items)))
		for i, it := range items {
			it.answer(outcome{value: results[i].Value, err: results[i].Err})
		}
		return
	}
	if len(items) == 1 || !q.retryable(err) || ctx.Err() != nil {
		for i, it := range items {
			it.answer(outcome{err: q.deadLetter(ctx, pc, jobs[i], err)})
		}
		return
	}
	if werr := q.cfg.Retry.Wait(ctx, jobs[0].Attempt); werr != nil {
		for i, it := range items {
			it.answer(outcome{err: q.deadLetter(ctx, pc, jobs[i], fmt.Errorf("%w (after %d attempts: %w)", werr, jobs[i].Attempt, err))})
		}
		return
	}
	// The last delivery of each job, alone and in order: only the job that
	// fails again is dead-lettered, the others of the batch get answers.
	for i, it := range items {
		res, err := q.deliverBatch(ctx, pc, jobs[i:i+1])
		if err != nil {
			it.answer(outcome{err: q.deadLetter(ctx, pc, jobs[i], err)})
			continue
		}
		pc.Handled.Add(1)
		it.answer(outcome{value: res[0].Value, err: res[0].Err})
	}
}

// deliverBatch delivers jobs once more to the batch handler, counting the
// delivery in each job's Attempt.
func (q *Queue) deliverBatch(ctx context.Context, pc *partitionCounters, jobs []Job) ([]Result, error) {
	for i := range jobs {
		jobs[i].Attempt++
		if jobs[i].Attempt > 1 {
			pc.Redeliveries.Add(1)
		}
	}
	results, err := queuecore.CallBatch(ctx, q.cfg.BatchHandler, jobs)
	if err != nil {
		for _, j := range jobs {
			q.failed(ctx, j, err)
		}
	}
	return results, err
}

func (q *Queue) deadLetter(ctx context.Context, pc *partitionCounters, job Job, err error) error {
	pc.DeadLetters.Add(1)
	queuecore.Report(ctx, q.cfg.Observer, contend.EventDeadLettered, job.Key, time.Time{}, job.Attempt, err)
	if q.cfg.DeadLetter != nil {
		q.cfg.DeadLetter(DeadLetter{Job: job, Err: err, At: time.Now()})
	}
	return fmt.Errorf("%w: job for %s after %d deliveries: %w", ErrDeadLettered, job.Key, job.Attempt, err)
}

func (q *Queue) failed(ctx context.Context, job Job, err error) {
	queuecore.Report(ctx, q.cfg.Observer, contend.EventFailed, job.Key, time.Time{}, job.Attempt, err)
}

// clock returns the time now when the queue is observed, else the zero
// time: the events' waits are measured only for an Observer.
func (q *Queue) clock() time.Time {
	if q.cfg.Observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// gaveUp returns the error of a caller for key whose wait ended with ctx
// (cause), and reports it.
func (q *Queue) gaveUp(ctx context.Context, key string, began time.Time, what string, cause error) error {
	err := fmt.Errorf("queue: job for %s: %s: %w (%w)", key, what, contend.ErrConflict, cause)
	queuecore.Report(ctx, q.cfg.Observer, contend.EventGaveUp, key, began, 0, err)
	return err
}
