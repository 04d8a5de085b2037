package distlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keepalive"
)

// lockOwner is what a Lock needs of the Client or Quorum that made it.
type lockOwner interface {
	// refresh extends l's lease to ttl if l still holds it.
	refresh(ctx context.Context, l *Lock, ttl time.Duration) (held bool, err error)
	// release deletes l's lock if l still holds it (a Client hands it to
	// the next waiter instead).
	release(ctx context.Context, l *Lock) (held bool, err error)
	// pttl returns the lease l has left, if it holds the lock.
	pttl(ctx context.Context, l *Lock) (left time.Duration, held bool, err error)
}

// A base is what a Client and a Quorum keep for the locks they make.
type base struct {
	drift    float64          // the share of a lease allowed for clocks' drift
	observer contend.Observer // the configuration's, or nil
	holds    keepalive.Timers // the watchdogs of the holds
	clock    releaseClock     // the contexts of releases
}

// margin is taken off a lease of ttl for its validity deadline.
func (b *base) margin(ttl time.Duration) time.Duration { return driftMargin(ttl, b.drift) }

// driftMargin is the allowance for clocks that run at different rates over
// a lease of ttl: factor of it, and 2ms, as Redlock allows.
func driftMargin(ttl time.Duration, factor float64) time.Duration {
	return time.Duration(float64(ttl)*factor) + 2*time.Millisecond
}

// A Lock is one acquisition of a key: the key, the random token that only
// this acquisition knows, the fencing token, and the deadline until which
// this process may assume it holds the key. The key, tokens and TTL never
// change; a successful refresh moves the deadline.
//
// The deadline is measured on this process's monotonic clock from the start
// of the attempt that obtained (or last refreshed) the lock, less an
// allowance for the clocks' drift (1% of the TTL and 2ms), so it does not
// run past the lease Redis granted, whatever the network delay. Past it,
// another process may hold the key.
//
// A Lock is safe for simultaneous use by multiple goroutines.
type Lock struct {
	owner lockOwner
	base  *base // the owner's
	key   string
	keys  []string // the Redis keys; keys[0] is the lock
	token string
	fence int64
	ttl   time.Duration
	taken bool // obtained by a Client's take, with nobody queued

	valid atomic.Int64 // ValidUntil, since epoch; only ever moved later

	report       holdReport  // set before the lock is returned, when observed
	lossReported atomic.Bool // the hold's loss was reported, by the watchdog or Release

	mu            sync.Mutex // protects the fields below; held during Release
	hold          *keepalive.Hold
	holdCtx       context.Context
	stopLostEvent func() bool // stops the report of the hold's loss; nil without an Observer
	lost          error       // what the watchdog reported when it stopped
	released      bool
	result        error // Release's outcome, returned again by later calls
}

// newLock returns a lock of owner, whose base is b.
func newLock(owner lockOwner, b *base, key string, keys []string, tok string, fence int64, ttl time.Duration, valid time.Time) *Lock {
	l := &Lock{owner: owner, base: b, key: key, keys: keys, token: tok, fence: fence, ttl: ttl}
	l.valid.Store(int64(valid.Sub(epoch)))
	return l
}

// Key returns the key the lock is on, without the prefix.
func (l *Lock) Key() string { return l.key }

// Token returns the lock's owner token: 128 random bits as 32 hex digits,
// the value Redis stores for the holder. Release and refresh compare all of
// it.
func (l *Lock) Token() string { return l.token }

// Fence returns the lock's fencing token: larger than that of every earlier
// holder of the key. A resource that records the largest token it has seen
// and refuses smaller ones (UPDATE ... WHERE last_fence < $token) refuses a
// holder whose lease ran out while it stalled. Tokens increase strictly but
// are not consecutive. A [Quorum] offers none and returns 0.
func (l *Lock) Fence() int64 { return l.fence }

// ValidUntil returns the local deadline until which the lock is known to be
// held, unless it was released or taken away by hand. See [Lock].
func (l *Lock) ValidUntil() time.Time { return epoch.Add(time.Duration(l.valid.Load())) }

// epoch is the origin of the instants kept as numbers, on this process's
// monotonic clock: a number is stored with no allocation.
var epoch = time.Now()

// moveValid moves the validity to v, if v is later: refreshes that return
// out of order never move it back.
func (l *Lock) moveValid(v time.Time) {
	for d := int64(v.Sub(epoch)); ; {
		old := l.valid.Load()
		if d <= old || l.valid.CompareAndSwap(old, d) {
			return
		}
	}
}

// TTL asks Redis how much of the lease is left (for a [Quorum], how long a
// majority of its nodes still hold it). It returns an error matching
// [contend.ErrLockLost] when the lock is no longer held by this acquisition.
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	left, held, err := l.owner.pttl(ctx, l)
	if err != nil {
		return 0, fmt.Errorf("distlock: ttl %q: %w", l.key, err)
	}
	if !held {
		return 0, fmt.Errorf("distlock: ttl %q: not held: %w", l.key, contend.ErrLockLost)
	}
	return left, nil
}

// Refresh extends the lease to ttl from now (0 means the lock's own TTL), if
// this acquisition still holds the lock. It never takes the key again once
// the lease has run out, even if nobody took it meanwhile: it returns an
// error matching [contend.ErrLockLost] instead, because the holder may
// already have been told it lost the lock. A Redis error is returned as it
// is; the lock may still be held.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	ttl = cmp.Or(ttl, l.ttl)
	if err := checkTTL("ttl", ttl); err != nil {
		return err
	}
	ttl = ttl.Truncate(time.Millisecond)
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if released {
		return fmt.Errorf("distlock: refresh %q: already released: %w", l.key, contend.ErrLockLost)
	}
	held, err := l.extend(ctx, ttl)
	if err != nil {
		return fmt.Errorf("distlock: refresh %q: %w", l.key, err)
	}
	if !held {
		err := fmt.Errorf("distlock: refresh %q: lock expired or taken over: %w", l.key, contend.ErrLockLost)
		l.mu.Lock()
		if l.lost == nil {
			l.lost = err // final: Release reports it too
		}
		l.mu.Unlock()
		return err
	}
	return nil
}

// extend refreshes and moves the validity deadline on success.
func (l *Lock) extend(ctx context.Context, ttl time.Duration) (bool, error) {
	began := time.Now()
	held, err := l.owner.refresh(ctx, l, ttl)
	if err == nil && held {
		l.moveValid(began.Add(ttl - l.base.margin(ttl)))
	}
	return held, err
}

// Hold keeps the lock until [Lock.Release]: a watchdog refreshes it every
// TTL/3, and the returned context, derived from ctx, is cancelled with cause
// [contend.ErrLockLost] the moment a refresh finds the lock gone or its
// validity passes without a successful refresh. Run the work under that
// context. Call Hold right after obtaining (the first refresh comes a third
// of a TTL later); calls after the first return the first call's context.
// The watchdog stops with Release, or when ctx ends.
func (l *Lock) Hold(ctx context.Context) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holdCtx != nil {
		return l.holdCtx
	}
	if l.released {
		hctx, cancel := context.WithCancelCause(ctx)
		cancel(fmt.Errorf("distlock: hold %q: already released: %w", l.key, contend.ErrLockLost))
		l.holdCtx = hctx
		return hctx
	}
	ttl := l.ttl - l.base.margin(l.ttl)
	obtained := l.ValidUntil().Add(-ttl)
	l.hold = l.base.holds.Start(ctx, obtained, ttl, func(ctx context.Context) (bool, error) {
		held, err := l.extend(ctx, l.ttl)
		if err != nil {
			l.reportHold(ctx, contend.EventFailed, err)
		}
		return held, err
	})
	hctx := l.hold.Context()
	// The loss is reported, to an Observer, when the watchdog decides it,
	// by a refresh or by its timer; Release stops this first, so that a
	// hold that ends with its work starts no goroutine for it. Without an
	// Observer there is nothing to report, and nothing is readied beside
	// the work's own goroutine when the lease runs out.
	if l.base.observer != nil {
		l.stopLostEvent = context.AfterFunc(hctx, func() {
			if cause := context.Cause(hctx); errors.Is(cause, contend.ErrLockLost) && l.lossReported.CompareAndSwap(false, true) {
				l.reportHold(hctx, contend.EventLost, cause)
			}
		})
	}
	l.holdCtx = hctx
	return l.holdCtx
}

// Release gives the lock up: to the next waiter, if one is queued, else by
// deleting it, and only while this acquisition still holds it, so the
// release of a lock whose lease ran out never deletes the next holder's. It
// first stops the watchdog of [Lock.Hold].
//
// It returns an error matching [contend.ErrLockLost] when the lock was no
// longer held (it had expired, or been taken over) or the watchdog had lost
// it, and a Redis error as it is. It runs with a short timeout of its own,
// on ctx's values but not its cancellation, so it still works when ctx has
// ended. Release is idempotent: once it has reached Redis, later calls
// return the same result without calling Redis again; after a Redis error a
// later call tries again.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return l.result
	}
	if l.hold != nil {
		if l.stopLostEvent != nil {
			l.stopLostEvent()
		}
		if lost := l.hold.Stop(); lost != nil {
			l.lost = lost
		}
		l.hold = nil
	}
	held, err := l.owner.release(l.base.clock.context(ctx), l)
	if err != nil {
		err = fmt.Errorf("distlock: release %q: %w", l.key, err)
		l.reportHold(ctx, contend.EventFailed, err)
		return errors.Join(l.lost, err)
	}
	l.released = true
	switch {
	case l.lost != nil:
		l.result = fmt.Errorf("distlock: release %q: %w", l.key, l.lost)
	case !held:
		l.result = fmt.Errorf("distlock: release %q: lock expired or taken over before the release: %w", l.key, contend.ErrLockLost)
	default:
		l.reportHold(ctx, contend.EventReleased, nil)
		return nil
	}
	// A loss the watchdog saw was reported then; one that a Refresh or this
	// release found is reported now.
	if l.lossReported.CompareAndSwap(false, true) {
		l.reportHold(ctx, contend.EventLost, l.result)
	}
	return l.result
}

type lockKey struct{}

// FromContext returns the lock that [Client.Do] or [Quorum.Do] holds for
// the fn it runs under ctx: fn reads its fencing token there.
func FromContext(ctx context.Context) (*Lock, bool) {
	l, ok := ctx.Value(lockKey{}).(*Lock)
	return l, ok
}

// do obtains a lock by obtain, holds it while fn runs and releases it
// afterwards, also when fn panics.
func do(ctx context.Context, key string, fn func(ctx context.Context) error, obtain func() (*Lock, error)) (err error) {
	if fn == nil {
		return fmt.Errorf("distlock: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	l, err := obtain()
	if err != nil {
		return err
	}
	hctx := l.Hold(ctx)
	defer func() {
		// The caller may have given up, which may be why fn returned, but the
		// lock must still be let go, or the key stays blocked for its TTL.
		if rerr := l.Release(ctx); rerr != nil {
			err = errors.Join(rerr, err)
		}
	}()
	return fn(context.WithValue(hctx, lockKey{}, l))
}
