// Package keepalive keeps a lease alive while work runs under it, and tells the
// work the moment the lease can no longer be proven held. Every guard whose
// hold expires by itself (a claim with a lease column, a Redis lock) uses it.
package keepalive

import (
	"context"
	"fmt"
	"time"

	"github.com/contend/contend"
)

// Refresh extends the lease. It reports held=false when the lease is gone (the
// owner token no longer matches): that is final. An error is a failed attempt
// (the backend did not answer) and is retried until the lease's validity runs
// out.
type Refresh func(ctx context.Context) (held bool, err error)

// A Hold owns the goroutine that refreshes one lease.
type Hold struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	lost   error // set by the refresh goroutine before done is closed
}

// Start refreshes a lease of length ttl every ttl/3, starting from the moment
// obtained at which the attempt that obtained it began. The returned Hold's
// context is parent's, cancelled with cause [contend.ErrLockLost] as soon as a
// refresh finds the lease gone or its validity passes without a successful
// refresh. Call [Hold.Stop] when the work is done.
func Start(parent context.Context, obtained time.Time, ttl time.Duration, refresh Refresh) *Hold {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Hold{ctx: ctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{})}
	go h.run(obtained, ttl, refresh)
	return h
}

// Context is the context the work must run under.
func (h *Hold) Context() context.Context { return h.ctx }

// Stop stops refreshing and waits for the refresh goroutine to end. It returns
// an error matching [contend.ErrLockLost] when the lease was lost before Stop
// was called. Stop must be called exactly once.
func (h *Hold) Stop() error {
	close(h.stop)
	<-h.done
	h.cancel(context.Canceled)
	return h.lost
}

func (h *Hold) run(obtained time.Time, ttl time.Duration, refresh Refresh) {
	defer close(h.done)
	interval := max(ttl/3, time.Millisecond)
	// valid is when the lease ends unless refreshed: measured on this
	// process's monotonic clock from the start of the attempt that last
	// succeeded, so it never overestimates what the server granted.
	valid := obtained.Add(ttl)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.ctx.Done():
			return // the caller gave up; the work is ending anyway
		case <-timer.C:
		}
		began := time.Now()
		// Each attempt is bounded by what is left of the lease, so a hung
		// backend cannot keep the work running past the point it is covered.
		rctx, cancel := context.WithDeadline(context.WithoutCancel(h.ctx), valid)
		held, err := refresh(rctx)
		cancel()
		switch {
		case err == nil && held:
			valid = began.Add(ttl)
			timer.Reset(interval)
			continue
		case err == nil:
			h.lost = fmt.Errorf("lease taken over or released by someone else: %w", contend.ErrLockLost)
		case time.Now().Before(valid):
			// A failed attempt: try again soon, while the lease still holds.
			timer.Reset(min(interval, max(time.Until(valid)/2, time.Millisecond)))
			continue
		default:
			h.lost = fmt.Errorf("lease expired before a refresh succeeded (last: %v): %w", err, contend.ErrLockLost)
		}
		h.cancel(h.lost)
		return
	}
}
