// Package keepalive keeps a lease alive while work runs under it, and tells the
// work the moment the lease can no longer be proven held. Every guard whose
// hold expires by itself (a claim with a lease column, a Redis lock) uses it.
package keepalive

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
)

// Refresh extends the lease. It reports held=false when the lease is gone (the
// owner token no longer matches): that is final. An error is a failed attempt
// (the backend did not answer) and is retried until the lease's validity runs
// out.
type Refresh func(ctx context.Context) (held bool, err error)

// Timers runs the refreshes of many holds from one runtime timer, so that
// starting and stopping a hold, on the hot path of every guarded call, sets
// no timer of its own.
//
// A timer of its own is what a hold cost most: starting a runtime timer that
// fires sooner than every other one makes the runtime wake a thread to watch
// the new deadline (a netpoll break or a futex wake), and on a machine whose
// idle cores sleep that wake took about 20 µs of a 100 µs Client.Do. The
// holds of one owner share a lease length, so a new one is due after every
// hold before it and joins the queue without touching the timer; the timer
// moves only when a hold is due sooner than all the others, or when it fires.
//
// Each guard that starts holds owns one Timers. The zero value is ready; a
// Timers must not be copied after first use. The timer is a time.AfterFunc:
// no goroutine waits for it, and each due refresh runs on a goroutine of its
// own, which [Hold.Stop] waits for.
type Timers struct {
	mu    sync.Mutex // protects the fields below and every queued Hold's due and index
	queue holdQueue  // the holds waiting for their next refresh, soonest first
	timer *time.Timer
	at    time.Time // when timer fires; zero while it is stopped
}

// A Hold refreshes one lease from its owner's [Timers]: no goroutine waits
// beside the work, and Stop only takes the hold off the queue, unless a
// refresh is under way, which it waits for.
type Hold struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ttl      time.Duration
	interval time.Duration
	refresh  Refresh
	timers   *Timers

	// Guarded by timers.mu.
	due   time.Time // when the next refresh is due
	index int       // in timers.queue; -1 when not queued

	mu      sync.Mutex    // protects the fields below; taken before timers.mu, never after
	valid   time.Time     // when the lease ends unless refreshed
	running chan struct{} // non-nil while a refresh runs; closed when it has ended
	stopped bool
	lost    error
}

// Start refreshes a lease of length ttl every ttl/3, starting from the moment
// obtained at which the attempt that obtained it began. The returned Hold's
// context is parent's, cancelled with cause [contend.ErrLockLost] as soon as a
// refresh finds the lease gone or its validity passes without a successful
// refresh. Call [Hold.Stop] when the work is done.
func (t *Timers) Start(parent context.Context, obtained time.Time, ttl time.Duration, refresh Refresh) *Hold {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Hold{
		ctx: ctx, cancel: cancel, ttl: ttl, refresh: refresh, timers: t,
		interval: max(ttl/3, time.Millisecond),
		index:    -1,
		// Measured on this process's monotonic clock from the start of the
		// attempt that last succeeded, so it never overestimates what the
		// server granted.
		valid: obtained.Add(ttl),
	}
	t.schedule(h, time.Now().Add(h.interval))
	return h
}

// Context is the context the work must run under.
func (h *Hold) Context() context.Context { return h.ctx }

// Stop stops refreshing, waiting for a refresh under way to end, so that
// none runs after it returns. It returns an error matching
// [contend.ErrLockLost] when the lease was lost before Stop was called.
// Stop must be called exactly once.
func (h *Hold) Stop() error {
	h.mu.Lock()
	h.stopped = true
	running := h.running
	h.mu.Unlock()
	if running != nil {
		<-running
	}
	// After the refresh under way, if any: it may have queued the hold
	// again before it saw stopped.
	h.timers.remove(h)
	h.cancel(context.Canceled)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// tick is one refresh, run when h is due, which queues h again unless the
// lease is lost, the work's ctx has ended, or Stop was called.
func (h *Hold) tick() {
	h.mu.Lock()
	if h.stopped || h.ctx.Err() != nil {
		h.mu.Unlock()
		return // stopped, or the caller gave up: the work is ending anyway
	}
	done := make(chan struct{})
	h.running = done
	valid := h.valid
	h.mu.Unlock()
	defer close(done)

	began := time.Now()
	// Each attempt is bounded by what is left of the lease, so a hung
	// backend cannot keep the work running past the point it is covered.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(h.ctx), valid)
	held, err := h.refresh(rctx)
	cancel()

	h.mu.Lock()
	h.running = nil
	var next time.Duration
	switch {
	case err == nil && held:
		h.valid = began.Add(h.ttl)
		next = h.interval
	case err == nil:
		h.lost = fmt.Errorf("lease taken over or released by someone else: %w", contend.ErrLockLost)
	case time.Now().Before(valid):
		// A failed attempt: try again soon, while the lease still holds.
		next = min(h.interval, max(time.Until(valid)/2, time.Millisecond))
	default:
		h.lost = fmt.Errorf("lease expired before a refresh succeeded (last: %v): %w", err, contend.ErrLockLost)
	}
	lost := h.lost
	if lost == nil && !h.stopped {
		h.timers.schedule(h, time.Now().Add(next))
	}
	h.mu.Unlock()
	if lost != nil {
		h.cancel(lost)
	}
}

// schedule queues h to be refreshed at due. It moves the timer only when h
// is due before the timer fires.
func (t *Timers) schedule(h *Hold, due time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h.due = due
	heap.Push(&t.queue, h)
	if t.at.IsZero() || due.Before(t.at) {
		t.arm(due)
	}
}

// remove takes h off the queue, if it is there. The timer stays as it is:
// when it fires for nothing, it is set for the next hold, or stopped.
func (t *Timers) remove(h *Hold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.index >= 0 {
		heap.Remove(&t.queue, h.index)
	}
}

// arm sets the timer to fire at when. Called with t.mu held.
func (t *Timers) arm(when time.Time) {
	t.at = when
	d := time.Until(when)
	if t.timer == nil {
		t.timer = time.AfterFunc(d, t.fire)
		return
	}
	t.timer.Reset(d)
}

// fire refreshes every hold that is due, each on a goroutine of its own so
// that one slow backend call delays no other hold's, and sets the timer for
// the next one. A fire that finds the timer reset meanwhile (or comes twice)
// does no harm: it runs what is due and sets the timer again.
func (t *Timers) fire() {
	t.mu.Lock()
	now := time.Now()
	var due []*Hold
	for len(t.queue) > 0 && !t.queue[0].due.After(now) {
		due = append(due, heap.Pop(&t.queue).(*Hold))
	}
	if len(t.queue) > 0 {
		t.arm(t.queue[0].due)
	} else {
		t.at = time.Time{}
		t.timer.Stop()
	}
	t.mu.Unlock()
	for _, h := range due {
		go h.tick()
	}
}

// holdQueue is a min-heap of holds by due time, for container/heap.
type holdQueue []*Hold

func (q holdQueue) Len() int           { return len(q) }
func (q holdQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q holdQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *holdQueue) Push(x any) {
	h := x.(*Hold)
	h.index = len(*q)
	*q = append(*q, h)
}
func (q *holdQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.index = -1
	*q = old[:len(old)-1]
	return h
}
