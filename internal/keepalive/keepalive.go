// Package keepalive keeps a lease alive while work runs under it, and tells the
// work the moment the lease can no longer be proven held. Every guard whose
// hold expires by itself (a claim with a lease column, a Redis lock) uses it.
package keepalive

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/inflight"
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
// The same timer keeps each lease's deadline. A hold is told it lost its
// lease when the lease's validity passes without a successful refresh,
// whether or not a refresh call is still under way: a client may not give
// up a call when its ctx ends (go-redis by default does not; it sends again
// after a read timeout), and a promise about time kept by waiting for a
// network call is kept only as well as the network answers.
//
// Each guard that starts holds owns one Timers. The zero value is ready; a
// Timers must not be copied after first use. The timer is a time.AfterFunc:
// no goroutine waits for it, and each due refresh runs on a goroutine of its
// own, which [Hold.Stop] does not wait for and [Timers.Wait] does.
type Timers struct {
	// mu protects the fields below and every Hold's fields marked as guarded
	// by it. It is the only lock in this package, so that fire, which finds a
	// hold's validity passed, can decide its loss against a refresh returning
	// or a Stop at the same moment without a lock order to keep.
	mu      sync.Mutex
	queue   holdQueue // every hold not yet lost or ended, by when fire must next look at it
	timer   *time.Timer
	at      time.Time      // when timer fires; zero while it is stopped
	running inflight.Group // refresh goroutines started and not yet ended
}

// A Hold refreshes one lease from its owner's [Timers]: no goroutine waits
// beside the work, and Stop only takes the hold off the queue.
//
// Its states, each changed under timers.mu:
//
//	state       queued, due at          leaves for
//	waiting     the next refresh        refreshing: fire finds it due before valid
//	            (never after valid)     lost: fire finds valid passed
//	refreshing  valid                   waiting: the refresh returns in time, held or failed
//	                                    lost: fire finds valid passed (the refresh may still
//	                                    be under way), or it returns held=false, or returns
//	                                    at all only once valid passed
//	lost        no                      (final: ctx cancelled with lost)
//	ended       no                      (final: Stop was called, or fire or a returning
//	                                    refresh found the parent ctx ended)
//
// Stop moves a hold from any state to ended, keeping lost if it was lost.
// So a hold is queued exactly while it may still be refreshed or lost, at
// most one refresh of it runs at a time, and what a refresh returns once its
// hold has left the queue changes nothing.
type Hold struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ttl      time.Duration
	interval time.Duration
	refresh  Refresh
	timers   *Timers

	// Guarded by timers.mu.
	due        time.Time // when fire next looks at the hold: its next refresh, or valid
	index      int       // in timers.queue; -1 once lost or ended
	valid      time.Time // when the lease ends unless a refresh succeeds first
	refreshing bool      // a refresh goroutine of this hold has not yet returned
	lastErr    error     // of the last refresh, if it failed; nil after a success
	lost       error
}

// Start refreshes a lease of length ttl every ttl/3, starting from the moment
// obtained at which the attempt that obtained it began. The returned Hold's
// context is parent's, cancelled with cause [contend.ErrLockLost] as soon as a
// refresh finds the lease gone or its validity passes without a successful
// refresh, even while a refresh call has not returned. Call [Hold.Stop] when
// the work is done.
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
	t.mu.Lock()
	defer t.mu.Unlock()
	// The first refresh is due a third of the lease after it began, or now
	// if obtaining it took longer than that.
	h.due = h.beforeValid(later(time.Now(), obtained.Add(h.interval)))
	heap.Push(&t.queue, h)
	if t.at.IsZero() || h.due.Before(t.at) {
		t.arm(h.due)
	}
	return h
}

// Context is the context the work must run under.
func (h *Hold) Context() context.Context { return h.ctx }

// Stop stops refreshing and ends the hold's context. It returns an error
// matching [contend.ErrLockLost] when the lease was lost before Stop was
// called. Stop must be called exactly once.
//
// Stop does not wait for a refresh under way, which may not return for
// long, and whatever that refresh returns changes nothing. It can still
// extend the lease only if it reaches the backend before the release that
// follows Stop, which then removes the lease anyway. [Timers.Wait] waits for
// it.
func (h *Hold) Stop() error {
	t := h.timers
	t.mu.Lock()
	if h.index >= 0 {
		heap.Remove(&t.queue, h.index)
	}
	lost := h.lost
	t.mu.Unlock()
	h.cancel(context.Canceled) // no-op when lost: it was cancelled with the loss
	return lost
}

// Wait waits until no refresh of t's holds is under way, or until ctx ends,
// when it returns an error wrapping [context.Cause] of ctx. An owner's Close
// stops its holds and then calls Wait, so that no goroutine of t outlives the
// owner; a hold not yet stopped may start a refresh after Wait returned.
func (t *Timers) Wait(ctx context.Context) error {
	if err := t.running.Wait(ctx); err != nil {
		return fmt.Errorf("keepalive: wait for refreshes under way: %w", err)
	}
	return nil
}

// fire acts on every hold whose due time has come: it loses each whose
// validity passed, drops each whose work's ctx ended, and starts a refresh
// of each other on a goroutine of its own, so that one slow backend call
// delays no other hold's. It then sets the timer for the next due hold. A
// fire that finds the timer reset meanwhile (or comes twice) does no harm: it
// acts on what is due and sets the timer again.
func (t *Timers) fire() {
	t.mu.Lock()
	now := time.Now()
	var refreshes []refreshing
	for len(t.queue) > 0 && !t.queue[0].due.After(now) {
		h := t.queue[0]
		switch {
		case h.ctx.Err() != nil:
			// The caller gave up (Stop would have dequeued it): the work is
			// ending anyway, and that is not a lost lease.
			heap.Pop(&t.queue)
		case !now.Before(h.valid):
			heap.Pop(&t.queue)
			h.lose(h.expired(false))
		default:
			// Due for a refresh. It stays queued, due at its validity, so
			// that the timer tells the loss if the refresh has not
			// succeeded by then; as refreshing, it is not refreshed again
			// until this refresh returns.
			h.due = h.valid
			heap.Fix(&t.queue, 0)
			// Each attempt is bounded by what is left of the lease, so a
			// client that keeps to its ctx abandons a hung backend when the
			// lease can no longer be proven held.
			ctx, cancel := context.WithDeadline(context.WithoutCancel(h.ctx), h.valid)
			h.refreshing = true
			t.running.Add()
			refreshes = append(refreshes, refreshing{h, ctx, cancel})
		}
	}
	if len(t.queue) > 0 {
		t.arm(t.queue[0].due)
	} else {
		t.at = time.Time{}
		t.timer.Stop()
	}
	t.mu.Unlock()
	for _, r := range refreshes {
		go r.run()
	}
}

// refreshing is a refresh fire started, for the goroutine that runs it.
type refreshing struct {
	h      *Hold
	ctx    context.Context
	cancel context.CancelFunc
}

// run is one refresh of a hold fire found due. It requeues the hold for its
// next refresh if the lease is still valid when the refresh returns, and
// loses it if the lease is gone; if the hold left the queue while the
// refresh ran (Stop, or fire losing it), the result changes nothing, so a
// late success never revives a hold that was told it lost.
func (r refreshing) run() {
	h, t := r.h, r.h.timers
	t.mu.Lock()
	gone := h.index < 0
	t.mu.Unlock()
	var held bool
	var err error
	began := time.Now()
	if !gone { // else Stop or a loss came between fire and here: spare the backend a call
		held, err = h.refresh(r.ctx)
	}
	r.cancel()

	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.running.Done()
	h.refreshing = false
	if h.index < 0 {
		return
	}
	now := time.Now()
	switch {
	case h.ctx.Err() != nil:
		heap.Remove(&t.queue, h.index) // as in fire: the caller gave up
	case err == nil && !held:
		heap.Remove(&t.queue, h.index)
		h.lose(fmt.Errorf("lease taken over or released by someone else: %w", contend.ErrLockLost))
	case !now.Before(h.valid):
		// Returned, held or not, only once the validity passed, before
		// fire got to it: the loss is the timer's to tell, and is the same.
		if err != nil {
			h.lastErr = err
		}
		heap.Remove(&t.queue, h.index)
		h.lose(h.expired(err == nil && held))
	case err == nil:
		h.valid, h.lastErr = began.Add(h.ttl), nil
		t.requeue(h, now.Add(h.interval))
	default:
		// A failed attempt: try again soon, while the lease still holds.
		h.lastErr = err
		t.requeue(h, now.Add(min(h.interval, max(h.valid.Sub(now)/2, time.Millisecond))))
	}
}

// lose ends h's work with cause lost. Called with timers.mu held, with h off
// the queue: cancelling under the lock makes h.lost and the ctx's cause one
// fact for a Stop at the same moment, and cannot deadlock, since cancelling
// calls nothing of this package (context.AfterFunc's functions run on
// goroutines of their own).
func (h *Hold) lose(lost error) {
	h.lost = lost
	h.cancel(lost)
}

// expired is the loss of a hold whose validity passed without a successful
// refresh; late tells that a refresh succeeded, but only after it. Called
// with timers.mu held.
func (h *Hold) expired(late bool) error {
	var why []string
	if h.lastErr != nil {
		// %v, not %w: the backend's error (often a ctx deadline) must not
		// make the loss look like the caller's own ctx ending.
		why = append(why, fmt.Sprintf("last error: %v", h.lastErr))
	}
	if h.refreshing {
		why = append(why, "a refresh was still under way")
	}
	if late {
		why = append(why, "a refresh succeeded only after it")
	}
	var detail string
	if len(why) > 0 {
		detail = " (" + strings.Join(why, "; ") + ")"
	}
	return fmt.Errorf("lease validity passed without a successful refresh%s: %w", detail, contend.ErrLockLost)
}

// beforeValid is when h's next refresh is due, if at is before its validity,
// and its validity otherwise, when fire loses it: a refresh then could not
// begin before the lease it would extend is gone.
func (h *Hold) beforeValid(at time.Time) time.Time {
	if at.Before(h.valid) {
		return at
	}
	return h.valid
}

// requeue moves h, queued due at its validity while it was refreshed, to be
// refreshed at next. It moves the timer only when h is due before the timer
// fires. Called with t.mu held.
func (t *Timers) requeue(h *Hold, next time.Time) {
	h.due = h.beforeValid(next)
	heap.Fix(&t.queue, h.index)
	if t.at.IsZero() || h.due.Before(t.at) {
		t.arm(h.due)
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

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
