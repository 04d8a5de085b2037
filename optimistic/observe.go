package optimistic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// What a Store's Update and a Guard's Do report to Config.Observer, and
// when, is listed at Config.Observer. Nothing is locked, so nothing is
// obtained: a call reports the attempts it retries, then how it ended.
// Every report is behind a nil check: without an Observer a call builds no
// report, formats no key and reads no clock for it.

// strategy is the Strategy of optimistic's events.
const strategy = contend.StrategyOptimistic

// errVersionMoved is what a Retry event says of an attempt whose version
// check found the version moved.
var errVersionMoved = fmt.Errorf("optimistic: version moved: %w", contend.ErrConflict)

// A report follows one call of Update or Do for its Observer.
type report struct {
	o      contend.Observer
	key    string
	max    int       // attempts the call's Retry allows
	began  time.Time // the call's start
	tried  time.Time // the start of the last attempt: its read
	n      int       // attempts started
	fnErr  error     // the last attempt's fn's error, if fn failed
	joined bool      // the call ran once in a transaction it does not own
}

// newReport returns the report of a call on key. Callers check that there
// is an Observer first: without one the key is not even formatted. The
// report is a value, for the caller's stack: only the call's own frames
// see it.
func newReport(o contend.Observer, key string, retry contend.Retry) report {
	return report{o: o, key: key, max: retry.Attempts(), began: time.Now()}
}

// attempt notes that an attempt starts: its read.
func (r *report) attempt() {
	r.n++
	r.tried = time.Now()
	r.fnErr = nil
}

// failed notes the error of an attempt that retryable judged, and reports
// a retry if the attempt is to be followed by another.
func (r *report) failed(ctx context.Context, err error, retryable bool) {
	if !retryable || r.joined || r.n >= r.max {
		return
	}
	if err == errMoved {
		err = errVersionMoved
	}
	r.o.Observe(ctx, contend.Event{
		Kind: contend.EventRetry, Strategy: strategy, Key: r.key,
		Wait: time.Since(r.began), Attempts: r.n, Err: err,
	})
}

// end reports how the call ended, after attempts, returning err.
func (r *report) end(ctx context.Context, attempts int, err error) {
	now := time.Now()
	e := contend.Event{Strategy: strategy, Key: r.key, Wait: now.Sub(r.began), Attempts: attempts, Err: err}
	cerr := context.Cause(ctx)
	switch {
	case err == nil:
		e.Kind = contend.EventReleased
	case r.joined && errors.Is(err, contend.ErrConflict):
		e.Kind = contend.EventConflict
	case !r.joined && (cerr != nil && errors.Is(err, cerr) ||
		errors.Is(err, contend.ErrConflict) ||
		serverRetry(err) && attempts >= r.max):
		e.Kind = contend.EventGaveUp
	case err == r.fnErr:
		e.Kind = contend.EventReleased
	default:
		e.Kind = contend.EventFailed
	}
	if e.Kind == contend.EventReleased && !r.tried.IsZero() {
		// Committed, or fn failed and its writes were rolled back: the
		// last attempt held its read until now, after waiting for the
		// ones before it.
		e.Wait, e.Hold = r.tried.Sub(r.began), now.Sub(r.tried)
	}
	r.o.Observe(ctx, e)
}

// runObserved is txn.RunTx for a Guard with an Observer: the same
// transactions and retries, one attempt at a time, so that each retry is
// reported.
func (g *Guard) runObserved(ctx context.Context, r *report, fn func(ctx context.Context, tx sqldb.Tx) error) (attempts int, err error) {
	h, err := txn.Resolve(ctx, g.db)
	if err != nil {
		return 0, err
	}
	if !h.Owned() {
		r.joined = true
		return txn.RunTx(ctx, g.db, g.opts, fn)
	}
	once := g.opts
	once.Retry = contend.Retry{MaxAttempts: 1}
	return g.opts.Retry.Do(ctx, func(ctx context.Context) error {
		_, err := txn.RunTx(ctx, h.Pool, once, fn)
		return err
	}, func(err error) bool {
		// txn.RunTx's retryable errors.
		again := retryable(err)
		r.failed(ctx, err, again)
		return again
	})
}
