// Package keepalive keeps a lease alive while work runs under it, and tells the
// work the moment the lease can no longer be proven held. Every guard whose
// hold expires by itself (a claim with a lease column, a Redis lock) uses it.
package keepalive

import (
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

// A Hold refreshes one lease, from a timer: no goroutine waits beside the
// work, and Stop, on the hot path of every guarded call, only stops the
// timer, unless a refresh is under way, which it waits for.
type Hold struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ttl      time.Duration
	interval time.Duration
	refresh  Refresh

	mu      sync.Mutex // protects the fields below
	timer   *time.Timer
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
func Start(parent context.Context, obtained time.Time, ttl time.Duration, refresh Refresh) *Hold {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Hold{
		ctx: ctx, cancel: cancel, ttl: ttl, refresh: refresh,
		interval: max(ttl/3, time.Millisecond),
		// Measured on this process's monotonic clock from the start of the
		// attempt that last succeeded, so it never overestimates what the
		// server granted.
		valid: obtained.Add(ttl),
	}
	h.mu.Lock()
	h.timer = time.AfterFunc(h.interval, h.tick)
	h.mu.Unlock()
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
	h.timer.Stop()
	running := h.running
	h.mu.Unlock()
	if running != nil {
		<-running
	}
	h.cancel(context.Canceled)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// tick is one refresh, run by the timer, which it sets again unless the
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
		h.timer.Reset(next)
	}
	h.mu.Unlock()
	if lost != nil {
		h.cancel(lost)
	}
}
