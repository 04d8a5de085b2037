package pessimistic

import (
	"context"
	"errors"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
)

// What a Locker and an Advisory report to their Observer, and when, is
// listed at LockerConfig.Observer. Every report is behind a nil check: without an
// Observer a call builds no report and reads no clock for it.

// strategy is the Strategy of pessimistic's events.
const strategy = contend.StrategyPessimistic

// A report follows one call of a runner for its Observer: its attempts,
// each a transaction that locks and runs fn.
type report struct {
	o       contend.Observer
	key     string
	max     int       // attempts the runner's Retry allows
	began   time.Time // the call's start
	n       int       // attempts started
	locked  time.Time // when the current attempt had its lock; zero before
	lockErr error     // why the current attempt's lock failed, unclassified
	joined  bool      // the call ran in a transaction it does not own
}

// attempt notes that an attempt starts.
func (r *report) attempt() {
	r.n++
	r.locked, r.lockErr = time.Time{}, nil
}

// obtained reports that the current attempt has its lock.
func (r *report) obtained(ctx context.Context) {
	r.locked = time.Now()
	r.o.Observe(ctx, contend.Event{
		Kind: contend.EventObtained, Strategy: strategy, Key: r.key,
		Wait: r.locked.Sub(r.began), Attempts: r.n,
	})
}

// ended reports the end of the current attempt's transaction, which
// returned err, if it had its lock: the lock is let go (in a transaction
// not the runner's, it is held until that transaction ends, but the call
// is done with it).
func (r *report) ended(ctx context.Context, err error) {
	if r.locked.IsZero() {
		return
	}
	r.o.Observe(ctx, contend.Event{
		Kind: contend.EventReleased, Strategy: strategy, Key: r.key,
		Wait: r.locked.Sub(r.began), Hold: time.Since(r.locked), Attempts: r.n, Err: err,
	})
}

// failed reports a retry if the attempt that failed with a retryable error
// is to be followed by another.
func (r *report) failed(ctx context.Context, err error, retryable bool) {
	if !retryable || r.n >= r.max {
		return
	}
	r.o.Observe(ctx, contend.Event{
		Kind: contend.EventRetry, Strategy: strategy, Key: r.key,
		Wait: time.Since(r.began), Attempts: r.n, Err: err,
	})
}

// end reports how a call that failed with err ended, unless its last
// attempt had the lock (its end is reported already) and the call did not
// run out of retries.
func (r *report) end(ctx context.Context, mode OnHeld, err error) {
	if err == nil {
		return
	}
	e := contend.Event{Strategy: strategy, Key: r.key, Wait: time.Since(r.began), Attempts: r.n, Err: err}
	cerr := context.Cause(ctx)
	retryable := sqlerr.Retryable(err)
	switch {
	case !r.locked.IsZero():
		if !retryable || r.joined {
			return
		}
		e.Kind = contend.EventGaveUp // a deadlock in fn, once too often
	case cerr != nil && errors.Is(err, cerr):
		e.Kind = contend.EventGaveUp
	case mode == NoWait && sqlerr.Code(r.lockErr) == sqlerr.LockNotAvailable,
		mode != Wait && errors.Is(r.lockErr, contend.ErrConflict), // SKIP LOCKED, try lock
		retryable && r.joined:
		e.Kind = contend.EventConflict
	case sqlerr.Code(r.lockErr) == sqlerr.LockNotAvailable, retryable,
		errors.Is(r.lockErr, contend.ErrConflict): // GET_LOCK's timeout
		e.Kind = contend.EventGaveUp // lock_timeout, or retries run out
	default:
		e.Kind = contend.EventFailed
	}
	r.o.Observe(ctx, e)
}

// runObserved is the runner's txn.RunTx for a call with a report: the same
// transactions and retries, one attempt at a time, so that each is
// reported.
func (r *runner) runObserved(ctx context.Context, db sqldb.DB, h txn.Handle, rep *report, attempt func(context.Context, sqldb.Tx) error) error {
	try := func(ctx context.Context, opts txn.Options) error {
		rep.attempt()
		_, err := txn.RunTx(ctx, db, opts, attempt)
		rep.ended(ctx, err)
		return err
	}
	var err error
	if !h.Owned() {
		rep.joined = true
		err = try(ctx, r.opts)
	} else {
		once := r.opts
		once.Retry = contend.Retry{MaxAttempts: 1}
		_, err = r.opts.Retry.Do(ctx, func(ctx context.Context) error {
			return try(ctx, once)
		}, func(err error) bool {
			retryable := sqlerr.Retryable(err) // txn.RunTx's
			rep.failed(ctx, err, retryable)
			return retryable
		})
	}
	rep.end(ctx, r.mode, err)
	return err
}
